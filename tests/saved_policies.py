"""Checkpoints of small untrained policies for the tests of zrl.load and zrl export (imported
by tests/test_agent.py and tests/test_export.py): an algorithm built from a shipped config
and specs, its weights scrambled so that actions differ across observations, saved by the
learner's own `Checkpoints` as a run would. No training."""
from __future__ import annotations

from pathlib import Path

import torch

from zrl import algorithms, spaces
from zrl.config import load_config
from zrl.learner.progress import Progress
from zrl.learner.resume import Checkpoints

ROOT = Path(__file__).resolve().parents[1]

CARTPOLE = (spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2))
PENDULUM = (spaces.BoxSpec((3,), "float32"), spaces.BoxSpec((1,), "float32", -2.0, 2.0))
FRAMES = (spaces.BoxSpec((4, 24, 24), "uint8", 0.0, 255.0), spaces.DiscreteSpec(6))  # small Atari-like frames
PER_ELEMENT = (spaces.BoxSpec((3,), "float32"), spaces.BoxSpec((2,), "float32", (-1.0, 0.0), (1.0, 5.0)))  # bounds per action element

# name: (shipped config, overrides, specs)
POLICIES = {
    "impala_mlp": ("cartpole_impala", [], CARTPOLE),
    "impala_cnn": ("cartpole_impala", ["model.network=impala_shallow", "model.cnn_hidden=32"], FRAMES),
    "impala_lstm": ("cartpole_impala", ["model.lstm_size=16"], CARTPOLE),
    "ppo_gaussian_normalized": ("cartpole_ppo", ["env.id=Pendulum-v1", "model.normalize_obs=true"], PENDULUM),
    "impala_lstm_gaussian_normalized": ("cartpole_impala", ["env.id=Pendulum-v1", "model.normalize_obs=true", "model.lstm_size=16"], PENDULUM),
    "sac_tanh": ("pendulum_sac", [], PENDULUM),
    "ppo_gaussian_per_element": ("cartpole_ppo", ["env.id=Pendulum-v1"], PER_ELEMENT),
    "sac_per_element": ("pendulum_sac", [], PER_ELEMENT),
    "apex_mlp": ("cartpole_apex", [], CARTPOLE),
}


def scramble(model: torch.nn.Module, seed: int) -> None:
    """Random weights of a useful size, and observation statistics far from (0, 1), so that a
    missed normalisation or rescaling changes the actions."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("obs_norm.var"):
                p.copy_(torch.rand(p.shape, generator=gen) * 4 + 0.25)
            elif name.endswith("obs_norm.mean"):
                p.copy_(torch.randn(p.shape, generator=gen) * 2)
            elif name == "trained":
                p.fill_(1.0)
            elif not name.endswith("obs_norm.count"):
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)


def save_policy(logdir: Path, name: str, seed: int = 0) -> Path:
    """A run's logdir holding one checkpoint of policy `name` (POLICIES); returns the logdir."""
    config_name, overrides, specs = POLICIES[name]
    cfg = load_config(ROOT / "configs" / f"{config_name}.yaml", overrides)
    algo = algorithms.get(cfg.algo.name)(cfg, *specs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        algo.setup(torch.device("cpu"))
    scramble(algo.model, seed)
    progress = Progress(cfg, stop_at_return=None)
    progress.updates = 1  # (a run saves nothing before its first update)
    Checkpoints(cfg, logdir / "checkpoints", resumed=False, say=lambda text: None).save(algo, progress, specs, 0.0)
    return logdir

