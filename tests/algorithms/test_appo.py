"""APPO: the target network follows the learner every target_update_period updates, the
clipped surrogate against it, return normalisation, and learning CartPole."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from helpers import ROOT, good_trajectory, run_to_return
from zrl import algorithms, spaces
from zrl.config import load_config

APPO_CONFIG = ROOT / "configs" / "cartpole_appo.yaml"
OBS, ACT = spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2)


def appo(*overrides: str):
    cfg = load_config(APPO_CONFIG, ["actor.num_envs=4", "actor.unroll_length=5", "learner.batch_size=8", *overrides])
    algo = algorithms.get("appo")(cfg, OBS, ACT)
    algo.setup(torch.device("cpu"))
    return cfg, algo


def batch(cfg, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    a = good_trajectory(cfg)
    a["obs"] = rng.normal(size=a["obs"].shape).astype(np.float32)
    a["action"] = rng.integers(0, 2, size=a["action"].shape)
    a["reward"] = rng.normal(size=a["reward"].shape).astype(np.float32)
    a["behaviour_logp"] = np.full(a["behaviour_logp"].shape, np.log(0.5), np.float32)
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in a.items()}


@pytest.mark.timeout(60)
def test_the_target_network_follows_every_target_update_period_updates():
    cfg, algo = appo("algo.target_update_period=3")
    start = algo.target_flat.clone()
    b = batch(cfg)
    for i in range(1, 7):
        algo.update(b, 0)
        synced = torch.equal(algo.target_flat, algo.flat)
        assert synced == (i % 3 == 0), i
        if i < 3:
            assert torch.equal(algo.target_flat, start)


@pytest.mark.timeout(60)
def test_with_the_target_equal_to_the_learner_the_surrogate_is_impalas_policy_gradient():
    # ratio 1 everywhere: the clipped surrogate's gradient is the IS-weighted policy gradient.
    cfg, algo = appo("algo.is_ratio_clip=1000", "algo.normalize_advantages=false")
    b = batch(cfg)
    loss, stats = algo.loss(algo.model, b)
    assert torch.isfinite(loss) and float(stats["appo/clip_frac"]) == 0.0


@pytest.mark.timeout(60)
def test_return_normalisation_keeps_running_statistics_in_the_checkpoint():
    cfg, algo = appo("algo.normalize_returns=true")
    b = batch(cfg)
    for _ in range(3):
        algo.update(b, 0)
    assert float(algo.returns.count) == 3 * b["reward"].numel()
    state = algo.checkpoint_state()
    _, fresh = appo("algo.normalize_returns=true")
    fresh.restore(state, optimizer_matches=True)
    assert torch.equal(fresh.returns.mean, algo.returns.mean) and torch.equal(fresh.target_flat, algo.target_flat)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_appo_learns_cartpole(tmp_path):
    run_to_return(APPO_CONFIG, 200, tmp_path / "run")
