"""The optional LSTM core: the learner's unroll matches the actor's steps, resets at
episode starts, truncation bootstraps from the continued state, and it trains end to end."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from zrl import spaces, wire
from zrl.envs import Step
from zrl import algorithms
from zrl.algorithms.base import reset_rows
from zrl.actors.sender import Sender
from helpers import small_config, wait_for

OBS = spaces.BoxSpec(shape=(4,), dtype="float32")
ACT = spaces.DiscreteSpec(n=2)


def lstm_config(*overrides):
    return small_config("model.lstm_size=16", *overrides)


def test_unroll_equals_step_by_step_with_resets():
    torch.manual_seed(0)
    algo = algorithms.get("impala")(lstm_config(), OBS, ACT)
    model = algo.build_model()
    T, B = 6, 3
    obs = torch.randn(T, B, 4)
    first = torch.zeros(T, B, dtype=torch.bool)
    first[2, 1] = first[4, 0] = True
    h0 = (torch.randn(B, 16), torch.randn(B, 16))
    params, values, (h_all, c_all) = model.unroll(obs, h0, first)
    state = h0
    for t in range(T):
        keep = (~first[t]).float().unsqueeze(-1)
        p, v, state = model.step(obs[t], (state[0] * keep, state[1] * keep))
        torch.testing.assert_close(params[t], p)
        torch.testing.assert_close(values[t], v)
        torch.testing.assert_close(h_all[t], state[0])


def test_actor_chunks_carry_their_initial_state_and_the_loss_reproduces_the_actor():
    """behaviour_logp from the actor's steps equals the learner's unroll from core_h0/core_c0 (same weights)."""
    cfg = lstm_config("actor.num_envs=2", "actor.unroll_length=5", "learner.batch_size=2", "env.max_episode_steps=4")
    algo = algorithms.get("impala")(cfg, OBS, ACT)
    model = algo.build_model()
    actor = algo.make_actor(model, num_envs=2, actor_index=0, num_actors=1, seed=0, sender=Sender(0))
    from zrl.envs import GymnasiumVectorEnv

    env = GymnasiumVectorEnv(cfg.env, 2, seed=0)
    obs = env.reset()
    actor.begin(obs)
    frames = []
    for _ in range(10):  # two chunks; the second starts from a non-zero state
        step = env.step(actor.act(obs))
        frames += actor.observe(step)
        obs = step.obs
    env.close()
    msg = wire.decode(bytes(frames[1]))
    algo.trajectory_schema(2).check(msg)
    assert np.abs(msg.arrays["core_h0"]).sum() > 0
    batch = algo.collate([msg], torch.device("cpu"))
    T1, B = batch["obs"].shape[:2]
    first = torch.zeros((T1, B), dtype=torch.bool)
    first[1:] = batch["terminated"] | batch["truncated"]
    with torch.no_grad():
        params, _, _ = model.unroll(batch["obs"], (batch["core_h0"], batch["core_c0"]), first)
        logp = model.head.log_prob(params[:-1], batch["action"])
    torch.testing.assert_close(logp, batch["behaviour_logp"], rtol=1e-5, atol=1e-5)
    # Truncations happened (time limit 4): the loss bootstraps them and runs.
    assert batch["final_index"].numel() > 0
    loss, _ = algo.loss(model, batch)
    loss.backward()
    assert all(p.grad is not None for p in model.core.parameters())


def test_reset_rows_zeroes_only_finished_envs():
    state = (np.ones((3, 2), np.float32), np.ones((3, 2), np.float32))
    out = reset_rows(state, np.array([False, True, False]))
    assert out[0][1].sum() == 0 and out[0][0].sum() == 2 and state[0][1].sum() == 2  # a copy
    assert reset_rows(None, np.array([True])) is None


@pytest.mark.timeout(90)
def test_lstm_model_trains_end_to_end(make_learner, make_actor):
    cfg = lstm_config()
    learner, _ = make_learner(cfg)
    actor, _ = make_actor(cfg)
    wait_for(lambda: learner.updates >= 10, 60, "updates with an LSTM core")
    wait_for(lambda: actor.policy_version >= 5, 60, "the actor to follow the learner's weights")
    assert learner.rejected == {}
