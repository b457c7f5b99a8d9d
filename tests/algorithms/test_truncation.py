"""Truncated episodes bootstrap from their final observation; terminated ones do not."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from zrl import spaces, wire
from zrl.config import EnvConfig
from zrl.envs import GymnasiumVectorEnv
from zrl import algorithms
from zrl.actors.sender import Sender
from helpers import small_config

OBS = spaces.BoxSpec(shape=(4,), dtype="float32")
ACT = spaces.DiscreteSpec(n=2)


def test_env_reports_final_obs_only_for_truncation():
    env = GymnasiumVectorEnv(EnvConfig(id="CartPole-v1", max_episode_steps=3), 2, seed=0)
    env.reset()
    steps = [env.step(np.zeros(2, np.int64)) for _ in range(3)]
    last = steps[-1]
    assert last.truncated.all() and not last.terminated.any()
    assert set(last.final_obs) == {0, 1}
    for k, o in last.final_obs.items():
        assert not np.array_equal(o, last.obs[k])  # obs already holds the next episode's start
    env.close()


def test_actor_chunk_carries_final_obs_at_the_right_index():
    cfg = small_config("env.max_episode_steps=3", "actor.unroll_length=5", "actor.num_envs=2", "learner.batch_size=2")
    algo = algorithms.get("impala")(cfg, OBS, ACT)
    model = algo.build_model()
    actor = algo.make_actor(model, num_envs=2, actor_index=0, num_actors=1, seed=0, sender=Sender(0))
    env = GymnasiumVectorEnv(cfg.env, 2, seed=0)
    obs = env.reset()
    actor.begin(obs)
    frames, finals = [], []
    for t in range(5):
        step = env.step(actor.act(obs))
        finals += [(t * 2 + k, o.copy()) for k, o in step.final_obs.items()]
        frames += actor.observe(step)
        obs = step.obs
    assert len(frames) == 1
    msg = wire.decode(bytes(frames[0]))
    bindings = algo.trajectory_schema(8).check(msg)
    assert bindings == {"T": 5, "K": 2, "M": 2}
    idx = msg.arrays["final_index"]
    assert sorted(idx.tolist()) == [i for i, _ in finals] == [4, 5]  # t=2, both envs
    for i, o in finals:
        np.testing.assert_array_equal(msg.arrays["final_obs"][list(idx).index(i)], o)
    assert msg.arrays["truncated"][2].all()
    env.close()


def make_batch(T=3, B=2):
    rng = np.random.default_rng(0)
    arr = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    return {
        "obs": torch.from_numpy(arr(T + 1, B, 4)),
        "action": torch.zeros((T, B), dtype=torch.int64),
        "reward": torch.ones((T, B)),
        "terminated": torch.zeros((T, B), dtype=torch.bool),
        "truncated": torch.zeros((T, B), dtype=torch.bool),
        "behaviour_logp": torch.full((T, B), -0.69),
        "final_index": torch.zeros(0, dtype=torch.int64),
        "final_obs": torch.zeros((0, 4)),
    }


def captured_vtrace_inputs(monkeypatch, algo, model, batch):
    from zrl.algorithms.impala import algorithm as impala

    seen = {}
    real = impala.vtrace_on_host

    def spy(log_rhos, discounts, rewards, values, bootstrap, hp):
        seen.update(discounts=discounts.clone(), rewards=rewards.clone(), values=values.clone(), bootstrap=bootstrap.clone())
        return real(log_rhos, discounts, rewards, values, bootstrap, hp)

    monkeypatch.setattr(impala, "vtrace_on_host", spy)
    algo.loss(model, batch)
    return seen


@pytest.mark.parametrize("kind", ["truncated", "terminated"])
def test_learner_bootstraps_truncation_from_final_obs(monkeypatch, kind):
    cfg = small_config("algo.reward_scale=1.0")  # rewards as they come (the scale has its own test below)
    algo = algorithms.get("impala")(cfg, OBS, ACT)
    model = algo.build_model()
    gamma = cfg.algo.discount
    batch = make_batch()
    t, b = 1, 1
    batch[kind][t, b] = True
    final_obs = torch.tensor([[0.3, -0.2, 0.1, 0.05]])
    if kind == "truncated":
        batch["final_index"] = torch.tensor([t * 2 + b])
        batch["final_obs"] = final_obs
    seen = captured_vtrace_inputs(monkeypatch, algo, model, batch)
    with torch.no_grad():
        v_final = model.value_only(final_obs)[0].item()
    # The step that ended the episode is cut from what follows (obs[t+1] is a new episode's start).
    assert seen["discounts"][t, b] == 0.0
    expect = 1.0 + gamma * v_final if kind == "truncated" else 1.0
    assert seen["rewards"][t, b].item() == pytest.approx(expect, rel=1e-5)
    # Every other step is untouched.
    mask = torch.ones_like(seen["rewards"], dtype=torch.bool)
    mask[t, b] = False
    assert torch.all(seen["rewards"][mask] == 1.0)
    assert torch.allclose(seen["discounts"][mask], torch.full_like(seen["discounts"][mask], gamma))


def test_reward_scale_applies_after_clipping_and_to_the_bootstrap_rewards_only(monkeypatch):
    cfg = small_config("algo.reward_clip=2.0", "algo.reward_scale=0.1")
    algo = algorithms.get("impala")(cfg, OBS, ACT)
    model = algo.build_model()
    batch = make_batch()
    batch["reward"] = torch.tensor([[5.0, 1.0], [-3.0, 0.5], [0.0, 2.0]])
    batch["truncated"][1, 1] = True
    batch["final_index"] = torch.tensor([1 * 2 + 1])
    batch["final_obs"] = torch.tensor([[0.3, -0.2, 0.1, 0.05]])
    seen = captured_vtrace_inputs(monkeypatch, algo, model, batch)
    with torch.no_grad():
        v_final = model.value_only(batch["final_obs"])[0].item()
    # clip to [-2, 2], then scale; the truncated step adds gamma * V(final_obs) unscaled
    # (the value net already predicts scaled returns).
    expect = torch.tensor([[0.2, 0.1], [-0.2, 0.05 + cfg.algo.discount * v_final], [0.0, 0.2]])
    torch.testing.assert_close(seen["rewards"], expect)


@pytest.mark.parametrize("bad", ["0", "-1", ".inf", ".nan"])
def test_reward_scale_must_be_positive_and_finite(bad):
    from zrl.config import ConfigError

    with pytest.raises(ConfigError, match="algo.reward_scale"):
        small_config(f"algo.reward_scale={bad}")


@pytest.mark.parametrize("T,B", [(1, 1), (3, 2)])
def test_normalized_advantages_are_finite_down_to_one_step(T, B):
    # The standard deviation of one advantage used to be NaN (the sample's, with n - 1).
    cfg = small_config("algo.normalize_advantages=true")
    algo = algorithms.get("impala")(cfg, OBS, ACT)
    loss, stats = algo.loss(algo.build_model(), make_batch(T, B))
    assert torch.isfinite(loss)
