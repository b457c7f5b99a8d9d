"""SAC (Haarnoja et al. 2018): a tanh-squashed Gaussian policy, twin Q-networks, automatic
entropy tuning, trained from a uniform replay at a fixed replay ratio.

This module is the algorithm's config, light enough for config validation;
algorithm.py holds its policy, recorder, replay and update, networks.py its networks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Optional

from zrl.typed_config import check


@dataclass(frozen=True)
class SACConfig:
    """SAC for bounded Box actions: twin Q-networks with Polyak-averaged targets, a learned
    entropy temperature, one uniform replay held to updates_per_step updates per env step."""

    batch_source: ClassVar[str] = "replay"
    lstm_core: ClassVar[bool] = False  # MLP networks only (model.lstm_size must be 0)
    name: str = "sac"
    discount: float = 0.99
    """gamma."""
    tau: float = 0.005
    """Polyak step of the target Q-networks after each update: target += tau * (online - target)."""
    batch_size: int = 256
    """Transitions sampled per update."""
    replay_capacity: int = 1_000_000
    """Transitions kept (FIFO eviction)."""
    learning_starts: int = 100
    """Env steps received before the first update. Actors act uniformly at random until
    their policy version is above 0, i.e. until the learner has updated and published."""
    updates_per_step: float = 1.0
    """The replay ratio: gradient updates per env step received (after learning_starts). The
    learner waits when it is ahead; actors are held back when they are ahead (max_steps_ahead)."""
    max_steps_ahead: Optional[int] = None
    """Env steps the received data may run ahead of what updates_per_step allows before the
    learner stops reading chunks (ZeroMQ then holds the actors back). None: one chunk per
    actor (actor.unroll_length x actor.num_envs x run.num_actors)."""
    target_entropy: Optional[float] = None
    """The entropy the temperature is tuned towards, in nats of the action in [-1, 1]
    (before rescaling to the bounds). None: -dim(A)."""
    init_alpha: float = 1.0
    """The entropy temperature alpha to start from (it is learned as log alpha)."""

    def __post_init__(self):
        check(0.0 <= self.discount <= 1.0, "algo.discount", "must be in [0, 1]")
        check(0.0 < self.tau <= 1.0, "algo.tau", "must be in (0, 1]")
        check(self.batch_size >= 1, "algo.batch_size", "must be >= 1")
        check(self.replay_capacity >= 1, "algo.replay_capacity", "must be >= 1")
        check(self.learning_starts >= 0, "algo.learning_starts", "must be >= 0")
        check(0.0 < self.updates_per_step < math.inf, "algo.updates_per_step", "must be > 0 and finite")
        check(self.max_steps_ahead is None or self.max_steps_ahead >= 1, "algo.max_steps_ahead", "must be >= 1 or null")
        check(self.target_entropy is None or math.isfinite(self.target_entropy), "algo.target_entropy", "must be finite or null")
        check(0.0 < self.init_alpha < math.inf, "algo.init_alpha", "must be > 0 and finite")


CONFIG = SACConfig
