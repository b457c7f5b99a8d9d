"""Shared fixtures: a ZeroMQ context, small configs, in-process learner/actor runners."""
from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
import zmq

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


@pytest.fixture
def ctx():
    """A ZeroMQ context; a test that leaves a socket open fails instead of hanging in term()."""
    c = zmq.Context()
    yield c
    leaked = [s for s in list(c._sockets) if not s.closed]
    c.destroy(linger=0)
    assert not leaked, f"the test left {len(leaked)} ZeroMQ socket(s) open"


@pytest.fixture
def endpoint():
    return f"inproc://zrl-test-{uuid.uuid4().hex[:12]}"


def good_trajectory(cfg) -> dict:
    """The arrays of a valid IMPALA chunk for a CartPole config (all zeros)."""
    import numpy as np

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


@pytest.fixture
def make_learner(ctx, endpoint, tmp_path):
    """Starts in-process learners (run() on a thread); stops and closes them after the test."""
    from zrl.learner.learner import Learner

    started = []

    def make(cfg, *, logdir=None, start=True, bind=None, around=None, **kw):
        """around(learner): a context manager that run() executes inside, on the learner's thread."""
        learner = Learner(cfg, bind or endpoint, logdir if logdir is not None else tmp_path / "run", ctx=ctx, console=False, **kw)

        def run():
            if around is None:
                return learner.run()
            with around(learner):
                return learner.run()

        runner = Running(run, "learner") if start else None
        started.append((learner, runner))
        return learner, runner

    yield make
    for learner, runner in started:
        learner.request_stop()
        if runner is not None:
            runner.thread.join(30)
        learner.close()


@pytest.fixture
def make_actor(ctx, endpoint):
    """Starts in-process actors on threads; stops them after the test."""
    from zrl.actors.actor import Actor

    started = []

    def make(cfg, *, index=0, num_actors=1, learner=None, **kw):
        stop = threading.Event()
        actor = Actor(cfg, learner or endpoint, index, num_actors, ctx=ctx, stop=stop, console=False, **kw)
        runner = Running(actor.run, f"actor-{index}")
        started.append((actor, runner))
        return actor, runner

    yield make
    for actor, runner in started:
        actor.stop.set()
    for actor, runner in started:
        runner.thread.join(30)
