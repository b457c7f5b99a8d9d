"""How a benchmark runs and stops a whole `zrl run` (zrl.bench.harness): in a process group of
its own, stopped as Ctrl-C would stop it, whatever ends the benchmark, so that no learner or
actor outlives it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from helpers import wait_for
from zrl import cli
from zrl.bench.harness import run_group, start_group, stop_group

# A command with a child of its own (as `zrl run` has its learner and actors): it writes both
# pids, then waits for a signal. With IGNORE_INT it ignores SIGINT (a run that does not stop cleanly).
TREE = textwrap.dedent("""
    import os, signal, subprocess, sys
    if len(sys.argv) > 2:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    while True:
        signal.pause()  # until a signal ends it
""")


def started_tree(tmp_path, *extra):
    pids = tmp_path / "pids"
    p = start_group([sys.executable, "-c", TREE, str(pids), *extra], tmp_path)
    wait_for(pids.exists, 30, "the command's pids")
    return p, [int(x) for x in pids.read_text().split()]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(60)
def test_stopping_a_group_stops_the_command_and_its_children(tmp_path):
    p, pids = started_tree(tmp_path)
    assert os.getpgid(pids[1]) == p.pid != os.getpgid(0)  # its own group, its child in it
    stop_group(p, grace_s=20)
    assert p.returncode is not None
    wait_for(lambda: all(gone(x) for x in pids), 20, "the command and its child to exit")


@pytest.mark.timeout(60)
def test_a_group_that_ignores_the_interrupt_is_killed_after_the_grace(tmp_path):
    p, pids = started_tree(tmp_path, "IGNORE_INT")
    stop_group(p, grace_s=0.5)
    assert p.returncode == -signal.SIGKILL
    wait_for(lambda: all(gone(x) for x in pids), 20, "the command and its child to exit")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_run_group_gives_the_exit_status_and_stops_the_group_when_its_wait_ends(tmp_path):
    assert run_group([sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path, timeout=30) == 3
    pids = tmp_path / "pids"
    with pytest.raises(subprocess.TimeoutExpired):
        run_group([sys.executable, "-c", TREE, str(pids)], tmp_path, timeout=5, grace_s=20)
    assert pids.exists()  # (it had started its child before the wait ran out)
    wait_for(lambda: all(gone(int(x)) for x in pids.read_text().split()), 20, "the command and its child to exit")


@pytest.mark.timeout(30)
def test_zrl_bench_takes_sigterm_as_ctrl_c():
    before = signal.getsignal(signal.SIGTERM)
    try:
        cli._sigterm_as_interrupt()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            wait_for(lambda: False, 10, "SIGTERM to arrive")
    finally:
        signal.signal(signal.SIGTERM, before)


def test_rows_are_shown_as_they_are_added_only_while_asked():
    from zrl.bench.harness import BenchResult, rows_shown

    lines = []
    result = BenchResult(name="demo", title="t", columns=["env", "rate", "ratio"])
    result.add(env="before", rate=1.0, ratio="")
    with rows_shown(lines.append):
        result.add(env="CartPole-v1", rate=12345.6, ratio="-")  # (empty and "-" cells are left out)
        result.add(env="Pong", rate=0.5, ratio=0.91)
    result.add(env="after", rate=2.0, ratio=1.0)
    assert lines == ["  [demo] env CartPole-v1, rate 12,346", "  [demo] env Pong, rate 0.5, ratio 0.91"]
    assert len(result.rows) == 4


def test_learning_bench_gives_the_sb3_reference_a_log_folder_of_its_own_and_removes_it(monkeypatch):
    """SB3's logger makes a folder ($SB3_LOGDIR, else a new tempdir/SB3-<time> left behind)."""
    import json
    import types

    from zrl.bench import learning

    monkeypatch.setitem(sys.modules, "stable_baselines3", types.ModuleType("stable_baselines3"))  # "installed"
    seen = {}

    def fake_run(argv, **kw):
        folder = kw["env"]["SB3_LOGDIR"]
        seen["folder"], seen["existed"] = folder, os.path.isdir(folder)
        out = {"reached": True, "time_s": 1.0, "env_steps": 10, "mean_return": 500.0}
        return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(out) + "\n", stderr="")

    monkeypatch.setattr(learning.subprocess, "run", fake_run)
    assert learning.sb3_seed(1, 5.0) == {"reached": True, "time_s": 1.0, "env_steps": 10, "mean_return": 500.0}
    assert seen["existed"] and not os.path.exists(seen["folder"])


def test_learning_curve_is_read_from_the_learners_scalars_timed_from_the_start(tmp_path):
    import time

    from zrl.bench.learning import read_curve
    from zrl.metrics import MetricsWriter

    t0 = time.time()
    w = MetricsWriter(tmp_path, console=False)
    for steps, ret in ((1000, 20.0), (2000, 150.5), (3000, None), (4000, 480.25)):  # (None: no episode yet, not logged)
        w.scalars({"episode/return": ret, "eval/return": None, "perf/env_steps_per_s": 9.0}, steps)
    w.close()
    curve = read_curve(tmp_path, "episode/return", t0)
    assert [(p[1], p[2]) for p in curve] == [(1000, 20.0), (2000, 150.5), (4000, 480.25)]
    assert all(0 <= p[0] <= time.time() - t0 for p in curve)
    assert read_curve(tmp_path, "eval/return", t0) == []


def test_learning_plot_draws_every_curve_or_says_it_cannot(tmp_path):
    import importlib.util

    from zrl.bench.learning import plot

    runs = {
        "zrl cartpole_impala": [{"curve": [[3.0, 30_000, 40.0], [6.0, 300_000, 480.0]]}, {"curve": [[3.5, 32_000, 35.0], [7.0, 350_000, 476.0]]}],
        "SB3 PPO (rl-zoo)": [{"curve": [[2.0, 100, 12.0], [20.0, 60_000, 475.5]]}],
    }
    png = tmp_path / "out" / "learning.png"
    assert plot({"zrl cartpole_impala": [{"reached": False}]}, png) is False and not png.exists()  # no curve at all
    drew = plot(runs, png)
    if importlib.util.find_spec("matplotlib") is None:
        assert drew is False and not png.exists()
    else:
        assert drew is True and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
