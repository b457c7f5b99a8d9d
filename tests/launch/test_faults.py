"""Fault drills, short forms (the long ones are in `zrl bench soak`): dead actors,
a learner killed and resumed, a kill in the middle of a checkpoint, a paused learner."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from zrl import checkpoint
from zrl.actors.actor import Actor
from helpers import ROOT, Proc, Running, small_config, wait_for

FAST = ["-o", "learner.log_interval_s=0.3", "-o", "actor.learner_timeout_s=2", "-o", "learner.checkpoint_interval_s=600"]


def pids(logdir):
    try:
        return json.loads((logdir / "pids.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_run_restarts_an_actor_killed_twice(tmp_path):
    run = Proc(["run", "--logdir", str(tmp_path), "--max-seconds", "100", "--stop-at-return", "100000", *FAST])
    try:
        wait_for(lambda: run.output.count("connected to") >= 2, 60, "actors to connect")
        for kill in (1, 2):
            victim = wait_for(lambda: pids(tmp_path).get("actor 0"), 30, "actor 0's pid")
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: run.output.count("actor 0 exited with -9") >= kill, 30, f"zrl run to notice kill {kill}")
            wait_for(lambda: pids(tmp_path).get("actor 0") not in (None, victim), 30, f"actor 0 restarted after kill {kill}")
            wait_for(lambda: run.output.count("[actor 0] connected to") >= kill + 1, 60, "the new actor 0 to connect")
        n_lines = run.output.count("updates")
        wait_for(lambda: run.output.count("updates") >= n_lines + 2, 30, "training to go on")
        os.killpg(run.p.pid, signal.SIGINT)
        assert run.wait(60) == 130, run.output  # stopped by Ctrl-C
    finally:
        run.kill_tree()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["updates"] > 0


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_learner_killed_and_resumed_continues_and_actors_rejoin(tmp_path):
    bind = f"ipc://{tmp_path}/control"
    cfg = small_config("actor.learner_timeout_s=1")
    args = ["learner", "--bind", bind, "--logdir", str(tmp_path / "run"), "--stop-at-return", "1e9", "-o", "learner.checkpoint_interval_s=0.5",
            "-o", "actor.num_envs=4", "-o", "actor.unroll_length=5", "-o", "learner.batch_size=8"]
    first = Proc(args)
    stop = threading.Event()
    actor = Actor(cfg, bind, 0, 1, stop=stop, console=False)
    runner = Running(actor.run, "actor")
    try:
        ckdir = tmp_path / "run" / "checkpoints"
        wait_for(lambda: len(checkpoint.list_checkpoints(ckdir)) >= 2, 60, "a couple of checkpoints")
        os.kill(first.p.pid, signal.SIGKILL)
        first.wait(10)
        _, saved = checkpoint.load_latest(ckdir)
        saved_updates = saved["counters"]["updates"]
        version_at_kill = actor.policy_version
        second = Proc([*args, "--resume"])
        try:
            wait_for(lambda: "resumed from" in second.output, 60, "the learner to resume")
            line = next(l for l in second.lines if "resumed from" in l)
            assert f"at update {saved_updates}," in line  # the newest complete checkpoint
            # The actor that kept running reconnects on its own and gets the new learner's weights.
            wait_for(lambda: actor.policy_version > max(version_at_kill, saved_updates), 60, "the actor to get new weights")
            # That version may still be one the killed learner published (queued in the actor's SUB
            # socket): wait for the resumed learner's own checkpoint past the one it resumed from.
            wait_for(lambda: checkpoint.load_latest(ckdir)[1]["counters"]["updates"] > saved_updates, 60, "the resumed learner to train")
            os.killpg(second.p.pid, signal.SIGINT)
            assert second.wait(30) == 130, second.output  # stopped by Ctrl-C
        finally:
            second.kill_tree()
        final = json.loads((tmp_path / "run" / "learner_final.json").read_text())
        assert final["updates"] > saved_updates and final["env_steps"] > saved["counters"]["env_steps"]  # never backwards
    finally:
        stop.set()
        runner.join(30)
        first.kill_tree()


WRITER = r"""
import sys, torch
from pathlib import Path
from zrl import checkpoint
ckdir = Path(sys.argv[1])
st = {"model_hash": "h", "model_shaping": {}, "model": {"w": torch.zeros(40_000_000)}, "optimizer": {}, "counters": {"updates": 2}, "config": {}}
print("writing", flush=True)
while True:
    checkpoint.save(ckdir, 2, st, keep=3)
"""


@pytest.mark.timeout(60)
def test_kill_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path):
    import torch

    ckdir = tmp_path / "ck"
    checkpoint.save(ckdir, 1, {"model_hash": "h", "model_shaping": {}, "model": {}, "optimizer": {}, "counters": {"updates": 1}, "config": {}}, keep=3)
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(ckdir)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "writing"
        wait_for(lambda: any(ckdir.glob(".ckpt-*.tmp")), 30, "a checkpoint write in progress", interval=0.001)
        p.kill()  # SIGKILL mid-write
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    path, state = checkpoint.load_latest(ckdir)
    assert state["counters"]["updates"] in (1, 2)  # the previous one, or a complete new one: never a torn file
    for complete in checkpoint.list_checkpoints(ckdir):
        checkpoint.load(complete)
    del torch


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["block", "drop"])
def test_paused_learner_applies_backpressure_with_flat_memory(tmp_path, policy):
    """SIGSTOP the learner for a few seconds: actors block (or drop), memory stays flat, metrics show it."""
    run = Proc(["run", "--actors", "1", "--logdir", str(tmp_path), "--max-seconds", "100", "--stop-at-return", "100000",
                "-o", f"actor.backpressure={policy}", "-o", "actor.learner_timeout_s=30", "-o", "learner.log_interval_s=0.3"])
    try:
        wait_for(lambda: "[actor 0] connected" in run.output, 60, "the actor")
        wait_for(lambda: run.output.count("updates") >= 2, 60, "training")
        p = pids(tmp_path)
        learner, actor = psutil.Process(p["learner"]), psutil.Process(p["actor 0"])
        learner.suspend()
        try:
            time.sleep(1.0)  # let queues and high-water marks fill: this is the drill's pause, not synchronisation
            rss = []
            cpu0 = actor.cpu_times()
            for _ in range(20):
                rss.append(actor.memory_info().rss)
                time.sleep(0.1)
            cpu1 = actor.cpu_times()
        finally:
            learner.resume()
        growth = (max(rss) - rss[0]) / rss[0]
        assert growth < 0.02, f"actor memory grew {growth:.1%} while the learner was paused"
        busy = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
        if policy == "block":
            assert busy < 0.5, f"a blocked actor should not be stepping, used {busy:.2f}s CPU in 2s"
        n = run.output.count("updates")
        wait_for(lambda: run.output.count("updates") >= n + 2, 60, "training to resume")
        # The actor's back-pressure counters reach the learner (console line and TensorBoard).
        def reported(line: str) -> bool:
            if "backpressure: blocked" not in line:
                return False  # shown once an actor blocked >= 0.5 s or dropped anything
            return policy == "block" or not line.rstrip().endswith("dropped 0")

        wait_for(lambda: any(reported(l) for l in run.lines), 60, "back-pressure in the progress line")
        os.killpg(run.p.pid, signal.SIGINT)
        assert run.wait(60) == 130, run.output  # stopped by Ctrl-C
    finally:
        run.kill_tree()
    # The actor's back-pressure counters reached the learner's TensorBoard.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tmp_path))
    ea.Reload()
    tag = "custom/actor0/blocked_s" if policy == "block" else "custom/actor0/dropped_chunks"
    assert tag in ea.Tags()["scalars"], ea.Tags()["scalars"]
    assert max(e.value for e in ea.Scalars(tag)) > 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_run_with_only_an_agent_server_fails_once_the_server_gave_up(tmp_path):
    """run.num_actors 0: the agent server is the data source, so once it has reached its
    restart cap (here: it cannot bind its port) the run stops with exit code 1."""
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))  # the server's port, taken: every start of the server fails
    taken.listen(1)
    config = ROOT / "configs" / "cartpole_serve.yaml"
    code = f"""
import sys
from zrl.config import load_config
from zrl.launch import RunOptions, run_local
overrides = ["server.bind=tcp://127.0.0.1:{taken.getsockname()[1]}"]
cfg = load_config({str(config)!r}, overrides)
opts = RunOptions(num_actors=0, seed=1, logdir={str(tmp_path)!r},
                  max_seconds=60, max_restarts=1, restart_backoff_s=(0.0, 0.0))
sys.exit(run_local(cfg, opts))
"""
    try:
        p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=100)
    finally:
        taken.close()
    assert p.returncode == 1, p.stdout + p.stderr
    assert "agent server exited with 1; restart cap (1) reached" in p.stdout, p.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "agent server" in summary["stop_reason"] and "restart cap" in summary["stop_reason"], summary
