"""Continuous (box) actions: the Gaussian policy head through actors, the learner and the agent server."""
from __future__ import annotations

import threading

import numpy as np

from zrl.client import Client
from zrl.server import AgentServer
from helpers import Running, small_config, wait_for


def pendulum_config(*overrides):
    return small_config("env.id=Pendulum-v1", "env.max_episode_steps=20", *overrides)


def test_impala_trains_on_a_box_action_env(make_learner, make_actor):
    cfg = pendulum_config()
    learner, _ = make_learner(cfg)
    make_actor(cfg)
    wait_for(lambda: learner.updates >= 5 and learner.episodes >= 2, 60, "updates on Pendulum")
    assert learner.action_spec.to_json()["type"] == "box"
    assert learner.rejected == {}


def test_agent_server_answers_box_actions(ctx, endpoint):
    cfg = pendulum_config(
        "actor.num_envs=1", "learner.batch_size=4",
        "server.observation_space={type: box, shape: [3], dtype: float32}",
        "server.action_space={type: box, shape: [1], dtype: float32, low: -2.0, high: 2.0}",
    )
    stop = threading.Event()
    server = AgentServer(cfg, endpoint + "-server", None, ctx=ctx, stop=stop, console=False)
    runner = Running(server.run, "server")
    try:
        c = Client(server.endpoint, {"type": "box", "shape": [3], "dtype": "float32"},
                   {"type": "box", "shape": [1], "dtype": "float32", "low": -2.0, "high": 2.0}, ctx=ctx, timeout=10)
        a = c.init(np.zeros(3, np.float32))
        assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (1,)
        a = c.send(-1.0, np.ones(3, np.float32))
        assert a.shape == (1,)
        assert c.reset(-0.5) == -1.5
        c.disconnect()
    finally:
        stop.set()
        runner.join(30)
