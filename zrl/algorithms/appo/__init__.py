"""APPO (asynchronous PPO, as in Sample Factory and RLlib): PPO's clipped surrogate on V-trace
targets, on IMPALA's asynchronous stream of chunks.

This module is the algorithm's config, light enough for config validation;
algorithm.py holds its update.
"""
from __future__ import annotations

from dataclasses import dataclass

from zrl.algorithms.impala import ImpalaConfig
from zrl.typed_config import check


@dataclass(frozen=True)
class APPOConfig(ImpalaConfig):
    """APPO: IMPALA's actors and V-trace, with PPO's clipped surrogate. The importance ratio is
    taken against a target network that follows the learner every target_update_period updates,
    so that the clip bounds how far each update moves from a recent policy."""

    name: str = "appo"
    clip_range: float = 0.2
    """epsilon of the clipped surrogate: the ratio pi / pi_target is clipped to [1 - eps, 1 + eps]."""
    target_update_period: int = 1
    """Copy the learner's network into the target network every this many updates."""
    is_ratio_clip: float = 2.0
    """Upper bound of the importance weight pi_target / mu that scales the surrogate."""
    normalize_returns: bool = False
    """Value targets standardised by a running mean and deviation of the V-trace targets (the
    value head predicts them standardised), so the value net fits returns of any size."""

    def __post_init__(self):
        super().__post_init__()
        check(self.clip_range > 0, "algo.clip_range", "must be > 0")
        check(self.target_update_period >= 1, "algo.target_update_period", "must be >= 1")
        check(self.is_ratio_clip > 0, "algo.is_ratio_clip", "must be > 0")


CONFIG = APPOConfig
