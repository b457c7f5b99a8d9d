"""Who may send data to the learner: the sender ids it handed out in hello replies.

A hello gets a random 32-bit sender id (or keeps the one it claims, if the learner
handed that one out and it is still live); chunks, gradients and stats carry it
in their header, and the receiver refuses ids it does not know. The table is
bounded (`learner.max_senders`), new ids are rate-limited (a token bucket), and
when it is full the id silent longest is reused once it has been silent for
`learner.actor_timeout_s`: so any number of identities costs bounded memory,
and live actors are never pushed out by a flood of hellos. Connected actors
are the senders with an id that sent data within that timeout.

With CURVE off this is bookkeeping, not authentication: a peer that can say
hello gets an id of its own (docs/DEPLOY.md states the trust model).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from zrl.protocol.limits import TokenBucket


class SenderRefused(Exception):
    """No id for this hello; `reason` is the counted reason, the message the peer's text."""

    def __init__(self, reason: str, text: str):
        super().__init__(text)
        self.reason = reason


@dataclass
class SenderInfo:
    role: str
    heard: float  # time.monotonic() of the last message (or the hello)
    sent_data: bool = False  # a chunk, gradient or stats message came from it (not just hellos)
    env_steps: int = 0  # env steps received from it
    episode_steps: int = 0  # the summed lengths of the episodes it reported
    slack_steps: int | None = 0  # steps it may report ahead of what arrived (episodes end before their chunk is sent); None: unchecked


class SenderTable:
    """The live sender ids. Not thread-safe: the caller holds Progress.lock."""

    def __init__(self, max_senders: int, idle_s: float, new_per_s: float, burst: int):
        self.max_senders = max_senders
        self.idle_s = idle_s
        self.ids: dict[int, SenderInfo] = {}  # in order of last heard (oldest first)
        self.bucket = TokenBucket(new_per_s, burst, time.monotonic())

    def __contains__(self, sender_id: int) -> bool:
        return sender_id in self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def admit(self, claimed: int, role: str, slack_steps: int | None) -> tuple[int, bool]:
        """The id for a hello: (id, new). A live id it claims is kept; else a fresh one, if
        the rate limit and the table allow (SenderRefused otherwise)."""
        now = time.monotonic()
        info = self.ids.get(claimed) if claimed else None
        if info is not None and info.role == role:
            self._touch(claimed, info, now)
            return claimed, False
        if not self.bucket.take(now):
            raise SenderRefused("hello_rate_limited", "too many new senders at once; say hello again later")
        if len(self.ids) >= self.max_senders and not self._reuse_oldest(now):
            raise SenderRefused("too_many_senders", f"the learner has {self.max_senders} live senders (learner.max_senders)")
        sender_id = self._fresh_id()
        self.ids[sender_id] = SenderInfo(role, now, slack_steps=slack_steps)
        return sender_id, True

    def heard(self, sender_id: int, env_steps: int = 0) -> bool:
        """Marks a message from `sender_id` (with its env steps); False if the id is unknown."""
        info = self.ids.get(sender_id)
        if info is None:
            return False
        info.env_steps += env_steps
        info.sent_data = True
        self._touch(sender_id, info, time.monotonic())
        return True

    def role(self, sender_id: int) -> str | None:
        info = self.ids.get(sender_id)
        return info.role if info is not None else None

    def episodes_plausible(self, sender_id: int, steps: int) -> bool:
        """Adds `steps` (the lengths of episodes it reports) to an actor's tally: False if
        its episodes would span more steps than it sent, beyond what may be in flight."""
        info = self.ids[sender_id]
        if info.role != "actor" or info.slack_steps is None:  # (an agent server's sessions and the eval actor send no matching chunks)
            return True
        if info.episode_steps + steps > info.env_steps + info.slack_steps:
            return False
        info.episode_steps += steps
        return True

    def connected(self, now: float) -> int:
        """Senders that sent data, heard from within idle_s (a peer that only says hello is no actor)."""
        return sum(1 for info in self.ids.values() if info.sent_data and now - info.heard < self.idle_s)

    def _touch(self, sender_id: int, info: SenderInfo, now: float) -> None:
        info.heard = now
        self.ids[sender_id] = self.ids.pop(sender_id)  # (move to the end: newest)

    def _reuse_oldest(self, now: float) -> bool:
        oldest = next(iter(self.ids))
        if now - self.ids[oldest].heard < self.idle_s:
            return False
        del self.ids[oldest]
        return True

    def _fresh_id(self) -> int:
        while True:
            sender_id = int.from_bytes(os.urandom(4), "little")
            if sender_id and sender_id not in self.ids:
                return sender_id
