"""SAC through the agent server: Pendulum-v1 played by `zrl.client.Client`s against `zrl serve`
(started by `zrl run` with run.agent_server), continuous actions end to end."""
from __future__ import annotations

import json
import time

import gymnasium as gym
import numpy as np
import pytest

from zrl.client import Client, ClientError
from helpers import ROOT, Proc, Running

PENDULUM = ROOT / "configs" / "pendulum_sac.yaml"


def play(endpoint: str, seed: int, running) -> int:
    """Plays Pendulum through the server while `running()`; returns the episodes finished.
    Until the server is up, and once it has gone, a call times out: the loop asks again."""
    env = gym.make("Pendulum-v1")
    client = Client(endpoint, env.observation_space, env.action_space, timeout=2.0)
    low, high = env.action_space.low, env.action_space.high
    episodes = 0
    try:
        while running():
            try:
                obs, _ = env.reset(seed=seed + episodes)
                action = client.init(obs)
                while True:
                    assert action.shape == (1,) and action.dtype == np.float32 and low <= action <= high, action
                    obs, reward, terminated, truncated, _ = env.step(action)
                    if terminated or truncated:
                        cut = truncated and not terminated  # Pendulum's time limit
                        client.reset(reward, truncated=cut, final_obs=obs if cut else None)
                        episodes += 1
                        break
                    action = client.send(reward, obs)
            except ClientError:  # (ClientTimeout, ServerError): not up yet, or gone
                continue
    finally:
        client.disconnect()
        env.close()
    return episodes


@pytest.mark.slow
@pytest.mark.timeout(330)
def test_clients_train_sac_through_the_agent_server(tmp_path):
    endpoint = f"ipc://{tmp_path}/serve"
    run = Proc(["run", "--config", str(PENDULUM), "--seed", "1", "--logdir", str(tmp_path / "run"),
                "--stop-at-return", "-400", "--max-seconds", "280",
                "-o", "run.num_actors=0", "-o", "run.agent_server=true", "-o", f"server.bind={endpoint}"])
    deadline = time.monotonic() + 300
    clients = [Running(lambda i=i: play(endpoint, 1000 * i, lambda: run.p.poll() is None and time.monotonic() < deadline),
                       f"client-{i}") for i in range(2)]
    try:
        assert run.wait(310) == 0, run.output[-3000:]
    finally:
        episodes = [c.join(30) for c in clients]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["reached"] is True and summary["final_mean_return"] >= -400, summary
    assert sum(episodes) >= 20, episodes
    assert "rejected" not in run.output, run.output[-3000:]
