"""The C++ example simulator (csrc/examples/cartpole_sim.cc) trains through `zrl serve`."""
from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from helpers import Proc, cpp_binary, wait_for


@pytest.mark.slow
@pytest.mark.timeout(330)
def test_cpp_cartpole_sim_trains_through_the_agent_server(tmp_path):
    sim = cpp_binary("cartpole_sim")
    run = Proc(["run", "--config", "configs/cartpole_serve.yaml", "--logdir", str(tmp_path), "--max-seconds", "300",
                "-o", "server.bind=tcp://127.0.0.1:*"])
    try:
        line = wait_for(lambda: next((l for l in run.lines if "[server] serving" in l), None), 60, "the agent server")
        endpoint = re.search(r"on (tcp://[0-9.]+:\d+)", line).group(1)
        p = subprocess.run([str(sim), "--endpoint", endpoint, "--envs", "16", "--target", "195", "--max-seconds", "280", "--seed", "1"],
                           capture_output=True, text=True, timeout=300)
        # (On failure: how both began as well as how they ended, for a run that never learned.)
        assert p.returncode == 0, "\n...\n".join([p.stdout[:1500], p.stdout[-2500:], p.stderr[-2000:], run.output[:4000], run.output[-3000:]])
        assert "reached" in p.stdout or "195" in p.stdout
        os.killpg(run.p.pid, signal.SIGINT)
        assert run.wait(60) == 130, run.output[-3000:]  # stopped by Ctrl-C
    finally:
        run.kill_tree()
