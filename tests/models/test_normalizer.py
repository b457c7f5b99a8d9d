"""Observation normalisation: running moments merged batch by batch, inside the model's flat
weights (so they reach actors and checkpoints), updated by the learner only."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import small_config, wait_for
from zrl import algorithms, spaces
from zrl.config import ConfigError
from zrl.models.normalizer import RunningMeanStd

OBS, ACT = spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2)


def test_merged_moments_equal_those_of_all_the_data():
    rng = np.random.default_rng(0)
    parts = [rng.normal(loc=3.0, scale=2.0, size=(n, 3)) for n in (1, 7, 100, 2)]
    norm = RunningMeanStd((3,))
    for p in parts:
        norm.update(torch.from_numpy(p))
    data = np.concatenate(parts)
    np.testing.assert_allclose(norm.mean.numpy(), data.mean(0), rtol=1e-5)
    np.testing.assert_allclose(norm.var.numpy(), data.var(0), rtol=1e-4)
    assert float(norm.count) == len(data)
    out = norm(torch.from_numpy(data).float())
    np.testing.assert_allclose(out.mean(0).numpy(), 0.0, atol=1e-4)


def test_the_statistics_take_no_gradient_and_no_optimiser_step():
    cfg = small_config("model.normalize_obs=true")
    algo = algorithms.get("impala")(cfg, OBS, ACT)
    algo.setup(torch.device("cpu"))
    norm = algo.model.obs_norm
    assert all(p is not norm.mean and p is not norm.var for p in algo.params)
    # ... but they are part of the flat buffer actors receive.
    assert norm.mean.data_ptr() >= algo.flat.data_ptr()
    assert norm.mean.data_ptr() < algo.flat.data_ptr() + algo.flat.numel() * 4


def test_normalize_obs_needs_vector_observations():
    with pytest.raises(ConfigError, match="model.normalize_obs"):
        small_config("model.normalize_obs=true", "model.network=impala_shallow")


@pytest.mark.timeout(120)
def test_the_learners_statistics_reach_the_actors_and_survive_a_checkpoint(make_learner, make_actor, endpoint, tmp_path):
    cfg = small_config("model.normalize_obs=true")
    learner, runner = make_learner(cfg, logdir=tmp_path / "run")
    actor, actor_runner = make_actor(cfg, max_steps=10**9)
    wait_for(lambda: learner.updates >= 5, 60, "updates")
    wait_for(lambda: actor.policy_version >= 3, 60, "the actor applies published weights")
    assert float(actor.model.obs_norm.count) > 0  # it acts with the learner's statistics
    actor.stop.set()
    actor_runner.join(30)
    learner.request_stop()
    runner.join(60)
    saved = learner.model.obs_norm.state_dict()
    assert float(saved["count"]) > 0
    resumed, _ = make_learner(cfg, logdir=tmp_path / "run", resume=True, start=False, bind=endpoint + "-resumed")
    for k, v in resumed.model.obs_norm.state_dict().items():
        assert torch.equal(v, saved[k]), k


def test_normalize_obs_is_refused_where_no_learner_keeps_the_statistics():
    from helpers import apex_config

    with pytest.raises(ConfigError, match="model.normalize_obs: not with algo.name apex_dqn"):
        apex_config("model.normalize_obs=true")
