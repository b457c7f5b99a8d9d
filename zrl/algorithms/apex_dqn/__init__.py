"""Ape-X DQN (Horgan et al. 2018): epsilon-greedy actors feeding one prioritised replay.

This module is the algorithm's config, light enough for config validation;
algorithm.py holds its policy, recorder, replay and update.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Optional

from zrl.typed_config import check


@dataclass(frozen=True)
class ApexDQNConfig:
    """Ape-X DQN (Horgan et al. 2018): many epsilon-greedy actors, one prioritised replay."""

    batch_source: ClassVar[str] = "replay"
    lstm_core: ClassVar[bool] = False  # its Q-network has no LSTM core (model.lstm_size must be 0)
    name: str = "apex_dqn"
    discount: float = 0.99
    """gamma."""
    n_step: int = 3
    """Returns over n steps, computed at the actor."""
    double_q: bool = True
    """Double DQN targets: the online net picks a*, the target net scores it."""
    dueling: bool = True
    """Dueling head: V(s) + A(s, a) - mean_a A(s, a)."""
    batch_size: int = 256
    """Transitions sampled per update."""
    target_update_interval: int = 500
    """Copy the online net into the target net every this many updates."""
    replay_capacity: int = 100_000
    """Transitions kept (FIFO eviction)."""
    min_replay_size: int = 2_000
    """Learning starts once the replay holds this many transitions."""
    priority_alpha: float = 0.6
    """Prioritisation exponent alpha (0: uniform)."""
    priority_beta: float = 0.4
    """Importance-sampling exponent beta."""
    priority_eps: float = 1e-6
    """Added to |TD error| so that no priority is 0."""
    eps_base: float = 0.4
    """Actor i of N explores with eps_base ** (1 + eps_alpha * i / (N - 1)); one actor uses eps_base."""
    eps_alpha: float = 7.0
    huber_delta: float = 1.0
    """Huber loss threshold on the TD error."""
    reward_scale: float = 1.0
    """Multiply the n-step rewards by this in the TD targets (learner) and the initial
    priorities (actors), so that Q-values are of a smaller size (as algo.reward_scale of
    IMPALA). Episode returns in logs and stop targets stay unscaled; Q-values and TD errors
    (q/mean, q/td_abs, priorities) are in scaled units."""
    updates_per_step: Optional[float] = None
    """A cap on the data per update, for a machine the actors and learner share. Past its
    share of min_replay_size, an actor waits after each message for the updates it pays for
    (transitions x updates_per_step x run.num_actors), so its data does not go stale queued
    in the sockets; and the learner stops reading chunks while the env steps received run
    more than max_steps_ahead past min_replay_size + updates / updates_per_step. The learner
    never waits for the actors. None: actors run freely, as in the paper."""
    max_steps_ahead: Optional[int] = None
    """With updates_per_step: how far the env steps received may run ahead before the learner
    stops reading chunks (ZeroMQ then holds the actors back). None: one chunk per actor."""
    replay_checkpoint: bool = False
    """Save the replay contents with each checkpoint and restore them on resume (into a
    replay of another replay_capacity or priority_alpha too: oldest first, with their raw
    priorities, the newest kept if it is smaller)."""
    frames_once: bool = True
    """Where observations are stacks of 8-bit frames (uint8 [S, H, W], S > 1: Atari), an
    actor's message carries each distinct frame once and the replay stores each frame once,
    transitions holding frame ids (a Pong transition: ~7 KB, not two 28 KB stacks); false
    sends and stores both stacks of every transition whole."""
    max_transitions_per_message: int = 4096
    """Largest batch of transitions one actor message may carry."""

    def __post_init__(self):
        check(0.0 <= self.discount <= 1.0, "algo.discount", "must be in [0, 1]")
        check(self.n_step >= 1, "algo.n_step", "must be >= 1")
        check(self.batch_size >= 1, "algo.batch_size", "must be >= 1")
        check(self.target_update_interval >= 1, "algo.target_update_interval", "must be >= 1")
        check(self.replay_capacity >= 1, "algo.replay_capacity", "must be >= 1")
        check(1 <= self.min_replay_size <= self.replay_capacity, "algo.min_replay_size", "must be in [1, replay_capacity]")
        check(self.priority_alpha >= 0, "algo.priority_alpha", "must be >= 0")
        check(0.0 <= self.priority_beta <= 1.0, "algo.priority_beta", "must be in [0, 1]")
        check(self.priority_eps > 0, "algo.priority_eps", "must be > 0")
        check(0.0 <= self.eps_base <= 1.0, "algo.eps_base", "must be in [0, 1]")
        check(self.eps_alpha >= 0, "algo.eps_alpha", "must be >= 0")
        check(self.huber_delta > 0, "algo.huber_delta", "must be > 0")
        check(0 < self.reward_scale < math.inf, "algo.reward_scale", "must be > 0 and finite")
        check(self.updates_per_step is None or 0.0 < self.updates_per_step < math.inf, "algo.updates_per_step", "must be > 0 and finite, or null")
        check(self.max_steps_ahead is None or self.max_steps_ahead >= 1, "algo.max_steps_ahead", "must be >= 1 or null")
        check(self.max_transitions_per_message >= 1, "algo.max_transitions_per_message", "must be >= 1")

    @property
    def learning_starts(self) -> int:
        """Env steps received before updates begin, as the learner's replay ratio counts them."""
        return self.min_replay_size


CONFIG = ApexDQNConfig
