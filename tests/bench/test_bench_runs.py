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

