"""An actor's episode statistics: running returns and lengths per env, sent to the learner
as STATS messages (which reach its TensorBoard)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from zrl import wire
from zrl.actors.sender import Sender

if TYPE_CHECKING:  # only an annotation: actor.py imports this module
    from zrl.actors.actor import Actor

__all__ = ["EpisodeStats"]


class EpisodeStats:
    """An actor's running episode returns and lengths per env; finished episodes go to the
    learner as a STATS message at most every actor.stats_interval_s."""

    def __init__(self, actor: Actor, sender: Sender, num_envs: int):
        self.actor = actor
        self.sender = sender
        self.names = ("eval_return", "eval_length") if actor.eval_mode else ("episode_return", "episode_length")
        self.drop = actor.config.actor.backpressure == "drop"
        self.bp_names = (f"actor{actor.index}/blocked_s", f"actor{actor.index}/dropped_chunks")
        self.every = actor.config.actor.stats_interval_s
        self.ret = [0.0] * num_envs
        self.len = [0] * num_envs
        self.done_ret: list[float] = []
        self.done_len: list[float] = []
        self.last = time.monotonic()

    def add(self, envs, reward: list[float], done: list[bool], stepped: list[bool] | None = None) -> None:
        """One step of each env in `envs` (env indices): its reward and whether its episode
        ended; rows whose `stepped` is False (an env's first observation) are left out."""
        ret, length = self.ret, self.len
        for i, (k, r, d) in enumerate(zip(envs, reward, done)):
            if stepped is not None and not stepped[i]:
                continue
            ret[k] += r
            length[k] += 1
            if d:
                self.done_ret.append(ret[k])
                self.done_len.append(float(length[k]))
                ret[k], length[k] = 0.0, 0
        now = time.monotonic()
        if self.done_ret and now - self.last >= self.every:
            link = self.actor.link
            stats = {self.names[0]: np.array(self.done_ret), self.names[1]: np.array(self.done_len),
                     self.bp_names[0]: np.array([link.blocked_s]), self.bp_names[1]: np.array([float(link.dropped)])}
            link.send(self.sender.encode(wire.Kind.STATS, stats, self.actor.policy_version), drop=self.drop)
            self.done_ret, self.done_len = [], []
            self.last = now
