"""zrl.load / Agent: one observation of a plain Gymnasium env gives one action in the env's form,
a batch gives a batch; the policy's normalisation, rescaling and clipping apply; LSTM state
goes in and out; what it cannot load or act on is refused saying why."""
from __future__ import annotations

import shutil
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

import zrl
from zrl.agent import restore
from zrl.checkpoint import CheckpointError
from zrl.export import random_inputs
from saved_policies import POLICIES, ROOT

pytestmark = pytest.mark.timeout(60)


def test_one_cartpole_observation_gives_an_int_and_a_batch_gives_an_array(saved):
    agent = zrl.load(saved("impala_mlp"))
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    action = agent.act(obs)
    assert type(action) is int and action in (0, 1)
    env.step(action)
    batch = np.stack([env.observation_space.sample() for _ in range(6)])
    actions = agent.act(batch)
    assert isinstance(actions, np.ndarray) and actions.dtype == np.int64 and actions.shape == (6,)
    assert actions.tolist() == [agent.act(o) for o in batch]


@pytest.mark.parametrize("name", ["sac_tanh", "ppo_gaussian_normalized"])
def test_one_pendulum_observation_gives_an_array_within_the_bounds(saved, name):
    agent = zrl.load(saved(name))
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=0)
    action = agent.act(obs)
    assert isinstance(action, np.ndarray) and action.dtype == np.float32 and action.shape == (1,)
    env.step(action)
    actions = agent.act(np.stack([env.observation_space.sample() for _ in range(64)]) * 3)
    assert actions.shape == (64, 1) and actions.min() >= -2.0 and actions.max() <= 2.0


def test_a_gaussian_policy_acts_with_its_normalised_mean_clipped_to_the_bounds(saved):
    logdir = saved("ppo_gaussian_normalized")
    agent, model = zrl.load(logdir), restore(logdir).model
    obs = random_inputs(agent, 64)[0] * 3
    with torch.no_grad():
        x = torch.from_numpy(obs)
        norm = model.obs_norm
        x = ((x - norm.mean) / torch.sqrt(norm.var + norm.eps)).clamp(-norm.clip, norm.clip)
        mean = model.head.mean(model.pi_torso(x)).numpy()
    assert (np.abs(mean) > 2).any() and (np.abs(mean) < 2).any(), "the test needs actions both inside and outside the bounds"
    np.testing.assert_allclose(agent.act(obs), np.clip(mean, -2.0, 2.0), rtol=1e-5, atol=1e-6)


def test_per_element_bounds_clip_and_rescale_each_element_to_its_own(saved):
    low, high = np.array([-1.0, 0.0]), np.array([1.0, 5.0])
    logdir = saved("ppo_gaussian_per_element")
    agent, model = zrl.load(logdir), restore(logdir).model
    obs = random_inputs(agent, 256)[0] * 3
    with torch.no_grad():
        mean = model.head.mean(model.pi_torso(torch.from_numpy(obs))).numpy()
    assert ((mean < low) | (mean > high)).any() and ((mean > low) & (mean < high)).any(), "the test needs both"
    np.testing.assert_allclose(agent.act(obs), np.clip(mean, low, high), rtol=1e-5, atol=1e-6)
    assert ((s := agent.act(obs, deterministic=False)) >= low).all() and (s <= high).all()
    sac = zrl.load(saved("sac_per_element"))
    with torch.no_grad():
        sac_mean = restore(saved("sac_per_element")).model(torch.from_numpy(obs))[0].numpy()
    np.testing.assert_allclose(sac.act(obs), low + (np.tanh(sac_mean) + 1.0) / 2 * (high - low), rtol=1e-5, atol=1e-5)


def test_sac_acts_with_the_tanh_of_its_mean_rescaled_to_the_bounds(saved):
    logdir = saved("sac_tanh")
    agent, model = zrl.load(logdir), restore(logdir).model
    obs = random_inputs(agent, 16)[0]
    with torch.no_grad():
        mean = model(torch.from_numpy(obs))[0].numpy()
    np.testing.assert_allclose(agent.act(obs), -2.0 + (np.tanh(mean) + 1.0) * 2.0, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_acting_deterministically_is_what_zrl_eval_plays(saved, name):
    """zrl eval's greedy policy, with the clipping to bounds that its env applies to a Gaussian's actions."""
    logdir = saved(name)
    agent, restored = zrl.load(logdir), restore(logdir)
    inputs = random_inputs(agent, 8, seed=3)
    state = tuple(inputs[1:]) if agent.recurrent else None
    want, _ = restored.algo.make_eval_policy(restored.model, greedy=True).act(inputs[0], state)
    got = agent.act(inputs[0], state)
    got = got[0] if agent.recurrent else got
    spec = agent.action_spec
    if spec.shape:
        want = np.clip(want.reshape(got.shape), spec.low, spec.high)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_recurrent_agent_takes_and_returns_its_state(saved):
    agent = zrl.load(saved("impala_lstm"))
    assert agent.recurrent and agent.initial_state(3)[0].shape == (3, 16)
    obs = random_inputs(agent, 3)[0]
    action, state = agent.act(obs, agent.initial_state(3))
    assert action.shape == (3,) and len(state) == 2 and state[0].shape == (3, 16)
    assert not np.array_equal(state[0], agent.initial_state(3)[0]), "the state moves on"
    again, _ = agent.act(obs)  # no state: the initial one
    assert np.array_equal(action, again)
    one, one_state = agent.act(obs[0], tuple(s[:1] for s in state))
    assert type(one) is int and one_state[0].shape == (1, 16)
    with pytest.raises(ValueError, match=r"state: expected \(h, c\) of shape \(3, 16\)"):
        agent.act(obs, agent.initial_state(2))


def test_sampling_draws_actions_within_the_bounds(saved):
    agent = zrl.load(saved("ppo_gaussian_normalized"))
    obs = random_inputs(agent, 32)[0]
    a, b = agent.act(obs, deterministic=False), agent.act(obs, deterministic=False)
    assert a.shape == (32, 1) and not np.array_equal(a, b)
    assert a.min() >= -2.0 and a.max() <= 2.0
    image = zrl.load(saved("impala_cnn"))
    assert type(image.act(random_inputs(image, 1)[0][0], deterministic=False)) is int


def test_a_logdir_its_checkpoints_folder_and_the_file_load_the_same_checkpoint(saved):
    logdir = saved("impala_mlp")
    agents = [zrl.load(logdir), zrl.load(logdir / "checkpoints"), zrl.load(next((logdir / "checkpoints").glob("ckpt-*.pt")))]
    assert len({a.checkpoint for a in agents}) == 1
    assert "impala on CartPole-v1" in repr(agents[0])


def test_a_folder_of_runs_gives_its_newest_run(saved, tmp_path):
    for stamp in ("20250102-000000", "20250101-000000"):  # (named by their start time, as run.logdir's runs)
        shutil.copytree(saved("impala_mlp"), tmp_path / stamp)
    assert zrl.load(tmp_path).checkpoint.parent == tmp_path / "20250102-000000" / "checkpoints"


def test_what_cannot_be_loaded_is_refused_saying_why(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        zrl.load(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="no checkpoint in it"):
        zrl.load(tmp_path)
    (tmp_path / "notes.pt").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="not a zrl checkpoint"):
        zrl.load(tmp_path / "notes.pt")


def test_observations_of_another_shape_or_kind_are_refused(saved):
    agent = zrl.load(saved("impala_cnn"))
    with pytest.raises(ValueError, match=r"expected one observation of shape \(4, 24, 24\)"):
        agent.act(np.zeros((24, 24), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        agent.act(np.zeros((4, 24, 24), np.float32))
    with pytest.raises(ValueError, match="feed-forward"):
        agent.act(np.zeros((4, 24, 24), np.uint8), (np.zeros((1, 4)), np.zeros((1, 4))))


def test_import_zrl_stays_light():
    probe = "import sys, zrl\nassert 'load' in dir(zrl) and 'Agent' in dir(zrl)\nassert 'torch' not in sys.modules"
    p = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
