"""Helpers that tests import (`from helpers import ...`); conftest.py holds the fixtures.

pyproject.toml's [tool.pytest.ini_options] puts tests/ on sys.path (`pythonpath`), so this
module resolves from any folder under tests/. Nothing here is a test: a helper that more
than one test file needs lives here rather than in one test file that others import.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from zrl import spaces, wire
from zrl.config import load_config

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "configs" / "cartpole_impala.yaml"


def wait_for(cond, timeout: float, what: str = "condition", interval: float = 0.01):
    """Polls `cond()` until it is truthy or the deadline passes (then fails the test)."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")
        time.sleep(interval)


def good_trajectory(cfg) -> dict:
    """The arrays of a valid IMPALA chunk for a CartPole config (all zeros)."""
    T, K = cfg.actor.unroll_length, cfg.actor.num_envs
    return {
        "obs": np.zeros((T + 1, K, 4), np.float32),
        "action": np.zeros((T, K), np.int64),
        "reward": np.zeros((T, K), np.float32),
        "terminated": np.zeros((T, K), bool),
        "truncated": np.zeros((T, K), bool),
        "behaviour_logp": np.zeros((T, K), np.float32),
        "final_index": np.zeros(0, np.int32),
        "final_obs": np.zeros((0, 4), np.float32),
    }


def small_config(*overrides: str):
    """The default config, scaled down for logic tests (fast, small batches)."""
    base = [
        "actor.num_envs=4",
        "actor.unroll_length=5",
        "learner.batch_size=8",
        "learner.log_interval_s=0.2",
        "actor.learner_timeout_s=2",
        "actor.stats_interval_s=0.05",
        "run.max_seconds=null",
        "run.stop_at_return=null",
    ]
    return load_config(DEFAULT_CONFIG, [*base, *overrides])


def apex_config(*overrides: str):
    """The Ape-X CartPole config, scaled down for logic tests (no evaluation actor)."""
    base = [
        "actor.num_envs=2",
        "actor.unroll_length=4",
        "algo.min_replay_size=64",
        "algo.batch_size=32",
        "algo.replay_capacity=5000",
        "learner.log_interval_s=0.2",
        "run.max_seconds=null",
        "run.stop_at_return=null",
        "run.eval_actor=false",
    ]
    return load_config(ROOT / "configs" / "cartpole_apex.yaml", [*base, *overrides])


class Running:
    """A component's `run()` on a thread; `join()` re-raises its exception."""

    def __init__(self, target, name):
        self.result = None
        self.error: BaseException | None = None

        def body():
            try:
                self.result = target()
            except BaseException as e:  # noqa: BLE001 - reported by join()
                self.error = e

        self.thread = threading.Thread(target=body, name=name, daemon=True)
        self.thread.start()

    def join(self, timeout: float):
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError(f"{self.thread.name} did not stop within {timeout}s")
        if self.error is not None:
            raise self.error
        return self.result


# --- The CLI in subprocesses -------------------------------------------------------------

ZRL = [sys.executable, "-m", "zrl"]


class Proc:
    """A CLI subprocess in its own session, its output collected by a thread."""

    def __init__(self, args, cwd=ROOT):
        self.p = subprocess.Popen([*ZRL, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout):
        try:
            code = self.p.wait(timeout=timeout)
        finally:
            if self.p.poll() is None:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        self.reader.join(5)
        return code

    def kill_tree(self):
        if self.p.poll() is None:
            for c in psutil.Process(self.p.pid).children(recursive=True):
                c.kill()
            self.p.kill()
            self.p.wait()


def run_to_return(config, target: float, logdir: Path, max_seconds: float = 120) -> dict:
    """`zrl run` of a shipped config (seed 1) until its mean return reaches target; asserts it
    did, and returns summary.json (the learning tests: the real CLI, a modest bound)."""
    run = Proc(["run", "--config", str(config), "--seed", "1", "--logdir", str(logdir), "--stop-at-return", str(target),
                "--max-seconds", str(max_seconds)])
    assert run.wait(max_seconds + 30) == 0, run.output[-3000:]
    summary = json.loads((Path(logdir) / "summary.json").read_text())
    assert summary["reached"] is True and summary["final_mean_return"] >= target, summary
    return summary


def sender_id_from_hello(ctx, learner, cfg, role: str = "actor", obs=None, act=None) -> int:
    """Says hello to an in-process learner as an actor of `cfg` (CartPole's specs unless
    given) and returns the sender id its reply hands out, for frames a test crafts."""
    from zrl.actors.actor import hello_meta, say_hello

    obs = obs or spaces.BoxSpec(shape=(4,), dtype="float32")
    act = act or spaces.DiscreteSpec(n=2)
    reply = say_hello(ctx, learner.control_endpoint, hello_meta(cfg, role, 0, obs, act, cfg.actor.num_envs), timeout_s=60)
    assert reply is not None, "the learner did not answer the hello"
    return reply.sender_id


def live_rss(proc) -> int:
    """Resident memory (a psutil.Process's) after glibc hands freed pages back, so a reading
    counts live memory and not the high-water mark of whatever ZeroMQ queued between two readings."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the plain reading is all there is
        pass
    return proc.memory_info().rss


# --- The learner's gate, and frames for it -----------------------------------------------

KINDS = frozenset({int(wire.Kind.TRAJECTORY), int(wire.Kind.STATS)})
CAP = 1 << 16


def impala_gate(fast: bool, cfg=None, algo=None, cap: int = CAP, leave_to_join: bool = False):
    # Imported here, not above: it brings in torch, which most users of this module do not need.
    from zrl.algorithms.impala.algorithm import Impala

    cfg = cfg or small_config()
    algo = algo or Impala(cfg, spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2))
    gate = wire.Gate(cap, KINDS, fast=fast)
    gate.set_trajectory_schema(algo.trajectory_schema(cfg.learner.batch_size), leave_to_join=leave_to_join)
    return gate


def chunk(cfg, seed: int = 0, M: int = 2) -> dict:
    """A valid chunk with non-trivial values: actions in {0, 1}, M truncated rows."""
    rng = np.random.default_rng(seed)
    a = good_trajectory(cfg)
    T, K = a["reward"].shape
    a["obs"] = rng.standard_normal(a["obs"].shape).astype(np.float32)
    a["action"] = rng.integers(0, 2, (T, K))
    a["final_index"] = np.sort(rng.choice(T * K, M, replace=False)).astype(np.int32)
    a["final_obs"] = rng.standard_normal((M, 4)).astype(np.float32)
    a["truncated"].reshape(-1)[a["final_index"]] = True  # each truncated step has its final observation
    a["terminated"] = rng.random((T, K)) < 0.2
    a["terminated"].reshape(-1)[a["final_index"]] = False
    return a


def outcome(gate: wire.Gate, frame: bytes):
    try:
        msg, bindings = gate.check(frame)
    except wire.WireError as e:
        return ("rejected", e.reason)
    return ("ok", msg.kind, msg.sender_id, msg.seq, msg.policy_version, bytes(msg.meta), bindings,
            {k: v.tobytes() for k, v in msg.arrays.items()})


def cpp_binary(name: str) -> Path:
    """A C++ program of the client build (build/cpp, or ZRL_CPP_BUILD_DIR): skips the test when it
    is not built, unless ZRL_REQUIRE_CPP is set (scripts/test.sh builds it and sets it)."""
    build = Path(os.environ.get("ZRL_CPP_BUILD_DIR", ROOT / "build" / "cpp"))
    path = build / name
    if not path.exists():
        msg = f"{path} is not built (scripts/test.sh builds it with -DZRL_BUILD_CLIENT=ON)"
        if os.environ.get("ZRL_REQUIRE_CPP"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


class CapturedChunks:
    """A Sender's link (zrl.actors.sender) that keeps a copy of every frame it is given, as a
    learner would get them: `server.sender.link = CapturedChunks()` shows an agent server's
    trajectories without a learner."""

    def __init__(self, sender_id: int = 0):
        self.sender_id = sender_id
        self.pusher = self
        self.frames: list[bytes] = []

    def send(self, msg, sender_id, seq, policy_version, rows=None, wait=False):
        self.frames.append(bytes(msg.finish(sender_id=sender_id, seq=seq, policy_version=policy_version, rows=rows)))
        return None

    def messages(self, kind=wire.Kind.TRAJECTORY) -> list:
        return [m for m in (wire.decode(f) for f in self.frames) if m.kind == kind]
