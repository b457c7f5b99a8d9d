"""PPO (Schulman et al. 2017), synchronous: each policy version trains only on its own rollout.

This module is the algorithm's config, light enough for config validation;
algorithm.py holds its recorder and update.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from zrl.typed_config import check


@dataclass(frozen=True)
class PPOConfig:
    """PPO: a clipped surrogate over GAE(lambda) advantages, several epochs of minibatches per
    rollout, on chunks of the current policy version only (actors wait for each new version)."""

    batch_source: ClassVar[str] = "version"
    lstm_core: ClassVar[bool] = False  # minibatches shuffle single steps (model.lstm_size must be 0)
    normalizes_obs: ClassVar[bool] = True  # its model keeps model.normalize_obs's statistics
    name: str = "ppo"
    discount: float = 0.99
    """gamma."""
    gae_lambda: float = 0.95
    """lambda of GAE."""
    rollout_chunks: Optional[int] = None
    """Chunks of one policy version per update (each actor sends one per version: its
    actor.num_envs x actor.unroll_length steps). None: run.num_actors."""
    rollout_timeout_s: float = 10.0
    """How long an update waits for the rollout's chunks before it trains on those that came;
    actors that sent none by then are no longer waited for, until they send again."""
    epochs: int = 10
    """Passes over each rollout."""
    minibatches: int = 4
    """Minibatches per pass (optimiser steps per update: epochs x minibatches)."""
    clip_range: float = 0.2
    """epsilon of the clipped surrogate."""
    clip_range_final: Optional[float] = None
    """Where clip_range ends, linearly over clip_decay_env_steps (None: constant)."""
    clip_decay_env_steps: Optional[int] = None
    """Env steps over which clip_range falls to clip_range_final (None: learner.lr_decay_env_steps)."""
    clip_range_vf: Optional[float] = None
    """Clip the value prediction to within this of the rollout's value (None: no value clipping)."""
    value_cost: float = 0.5
    """Weight of the value loss."""
    entropy_cost: float = 0.0
    """Weight of the entropy bonus."""
    normalize_advantages: bool = True
    """Standardise advantages over each minibatch."""
    normalize_returns: bool = False
    """Value targets standardised by a running mean and deviation of the returns (the value
    head predicts them standardised; the statistics are the learner's, checkpointed), so the
    value net fits returns of any size."""

    def __post_init__(self):
        check(0.0 <= self.discount <= 1.0, "algo.discount", "must be in [0, 1]")
        check(0.0 <= self.gae_lambda <= 1.0, "algo.gae_lambda", "must be in [0, 1]")
        check(self.rollout_chunks is None or self.rollout_chunks >= 1, "algo.rollout_chunks", "must be >= 1 or null")
        check(self.rollout_timeout_s > 0, "algo.rollout_timeout_s", "must be > 0")
        check(self.epochs >= 1, "algo.epochs", "must be >= 1")
        check(self.minibatches >= 1, "algo.minibatches", "must be >= 1")
        check(self.clip_range > 0, "algo.clip_range", "must be > 0")
        check(self.clip_range_final is None or self.clip_range_final > 0, "algo.clip_range_final", "must be > 0 or null")
        check(self.clip_decay_env_steps is None or self.clip_decay_env_steps > 0, "algo.clip_decay_env_steps", "must be > 0 or null")
        check(self.clip_range_vf is None or self.clip_range_vf > 0, "algo.clip_range_vf", "must be > 0 or null")
        check(self.value_cost >= 0, "algo.value_cost", "must be >= 0")
        check(self.entropy_cost >= 0, "algo.entropy_cost", "must be >= 0")


CONFIG = PPOConfig
