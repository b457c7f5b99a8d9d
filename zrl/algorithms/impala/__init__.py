"""IMPALA (Espeholt et al. 2018): V-trace actor-critic on a stream of fresh trajectories.

This module is the algorithm's config, light enough for config validation;
algorithm.py holds its policy, recorder and update.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Optional

from zrl.typed_config import check


@dataclass(frozen=True)
class ImpalaConfig:
    """IMPALA: V-trace actor-critic on a stream of fresh trajectories."""

    infinity_allowed: ClassVar[frozenset[str]] = frozenset(
        {"clip_rho_threshold", "clip_pg_rho_threshold", "clip_c_threshold", "reward_clip"})
    batch_source: ClassVar[str] = "stream"
    normalizes_obs: ClassVar[bool] = True  # its model keeps model.normalize_obs's statistics
    name: str = "impala"
    discount: float = 0.99
    """gamma."""
    vtrace_lambda: float = 1.0
    """lambda of V-trace's traces (c_i = lambda * min(c bar, pi/mu))."""
    clip_rho_threshold: Optional[float] = 1.0
    """rho bar (None: no clipping)."""
    clip_pg_rho_threshold: Optional[float] = 1.0
    """rho bar of the policy-gradient advantage (None: no clipping)."""
    clip_c_threshold: Optional[float] = 1.0
    """c bar (None: no clipping)."""
    baseline_cost: float = 0.5
    """Weight of the value loss 0.5 * (vs - V)^2."""
    entropy_cost: float = 0.01
    """Weight of the entropy bonus."""
    reward_clip: Optional[float] = None
    """Clip rewards to [-x, x] on the learner (None: no clipping)."""
    reward_scale: float = 1.0
    """Multiply rewards by this on the learner, after clipping, so that the value net fits
    returns of a smaller size: Adam moves each weight by about the learning rate per step,
    so values in the hundreds take thousands of updates to reach. Episode returns in logs
    and stop targets stay unscaled; values and losses (vtrace/mean_vs, loss/baseline) are
    in scaled units."""
    normalize_advantages: bool = False
    """Standardise policy-gradient advantages over the batch."""

    def __post_init__(self):
        check(0.0 <= self.discount <= 1.0, "algo.discount", "must be in [0, 1]")
        check(0.0 <= self.vtrace_lambda <= 1.0, "algo.vtrace_lambda", "must be in [0, 1]")
        for k in ("clip_rho_threshold", "clip_pg_rho_threshold", "clip_c_threshold"):
            v = getattr(self, k)
            check(v is None or v > 0, f"algo.{k}", "must be > 0 or null")
        check(self.baseline_cost >= 0, "algo.baseline_cost", "must be >= 0")
        check(self.entropy_cost >= 0, "algo.entropy_cost", "must be >= 0")
        check(self.reward_clip is None or self.reward_clip > 0, "algo.reward_clip", "must be > 0 or null")
        check(0 < self.reward_scale < math.inf, "algo.reward_scale", "must be > 0 and finite")


CONFIG = ImpalaConfig
