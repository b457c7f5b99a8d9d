"""A3C (Mnih et al. 2016): actors compute actor-critic gradients on their own rollouts; the
learner applies them as they arrive, as a parameter server.

This module is the algorithm's config, light enough for config validation;
algorithm.py holds its recorder, loss and update.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from zrl.typed_config import check


@dataclass(frozen=True)
class A3CConfig:
    """A3C: each actor computes the n-step actor-critic gradient of its rollout (actor.unroll_length
    steps x actor.num_envs envs) with its own copy of the model and sends the gradient, not the
    trajectory; the learner applies each one as it arrives (clipped to learner.max_grad_norm) and
    publishes weights every learner.publish_interval updates. Actors run in fp32 (actor.precision
    fp32, no int8 options): a bf16 or int8 model has no usable gradient."""

    infinity_allowed: ClassVar[frozenset[str]] = frozenset({"max_gradient_norm"})
    batch_source: ClassVar[str] = "gradients"
    normalizes_obs: ClassVar[bool] = True  # from the observation moments its actors send
    lstm_core: ClassVar[bool] = False  # the gradient of a rollout runs the feed-forward model over its steps at once
    name: str = "a3c"
    discount: float = 0.99
    """gamma of the n-step returns."""
    value_cost: float = 0.5
    """Weight of the value loss 0.5 * (R - V)^2."""
    entropy_cost: float = 0.01
    """Weight of the entropy bonus."""
    reward_scale: float = 1.0
    """Multiply rewards by this before the returns are computed (on the actor), so that the
    value net fits returns of a smaller size. Episode returns in logs and stop targets stay
    unscaled; values and losses are in scaled units."""
    normalize_advantages: bool = False
    """Standardise the policy-gradient advantages over each rollout."""
    max_staleness: int = 8
    """The learner discards a gradient computed at weights more than this many updates old
    (counted as discarded/stale_gradient). Counted in updates, so with learner.publish_interval
    P an actor's weights are always up to P - 1 updates old: keep this at least P."""
    max_gradient_norm: float = 1000.0
    """The learner's gate rejects (bad_value) a gradient message whose L2 norm is above this:
    a sanity bound on what an actor may send, well above an honest gradient's (the update
    still clips to learner.max_grad_norm). .inf: no bound."""

    def __post_init__(self):
        check(0.0 <= self.discount <= 1.0, "algo.discount", "must be in [0, 1]")
        check(self.value_cost >= 0, "algo.value_cost", "must be >= 0")
        check(self.entropy_cost >= 0, "algo.entropy_cost", "must be >= 0")
        check(0 < self.reward_scale < math.inf, "algo.reward_scale", "must be > 0 and finite")
        check(self.max_staleness >= 0, "algo.max_staleness", "must be >= 0")
        check(self.max_gradient_norm > 0, "algo.max_gradient_norm", "must be > 0")


CONFIG = A3CConfig
