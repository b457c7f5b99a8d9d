"""The agent server's counters: requests, steps, sessions, and what it refused or dropped, by reason."""
from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field

from zrl.protocol.limits import worth_logging

log = logging.getLogger("zrl.server")


class Tally(collections.Counter):
    """Events counted by reason, each reason logged as the learner logs its rejections
    (zrl.learner.progress): the first 5, then the 10th, 100th, 1000th and every 10,000th,
    so that a flood is visible without flooding the log. Reasons in `quiet` (routine
    events) are counted only."""

    def __init__(self, what: str, quiet: frozenset[str] = frozenset()):
        super().__init__()
        self.what = what
        self.quiet = quiet

    def note(self, reason: str, detail: str, *, level: int = logging.WARNING, exc_info: bool = False) -> None:
        self[reason] += 1
        n = self[reason]
        if reason not in self.quiet and worth_logging(n):
            log.log(level, "%s (%s, %d so far): %s", self.what, reason, n, detail, exc_info=exc_info)

    def copy(self) -> collections.Counter:
        return collections.Counter(self)  # (Counter.copy would call Tally(self))


# Session ends that every client causes in normal use: counted, not logged.
ROUTINE_DROPS = frozenset({"bye", "timeout", "replaced"})


@dataclass
class ServerStats:
    requests: int = 0
    steps: int = 0
    batches: int = 0
    batch_sizes: int = 0
    sessions_opened: int = 0
    dropped_messages: int = 0  # trajectory messages dropped under back-pressure
    rejected: Tally = field(default_factory=lambda: Tally("rejected request"))
    session_drops: Tally = field(default_factory=lambda: Tally("dropped session", ROUTINE_DROPS))

    @property
    def sessions_dropped(self) -> int:
        return self.session_drops.total()
