"""batch_source "version": a rollout of chunks all acted by the current policy version.

A synchronous on-policy learner (PPO) trains version v only on chunks acted by
v, then publishes v + 1; its actors wait for v + 1 before acting again
(`Recorder.version_needed`). `VersionBatches.next` waits for the algorithm's
`rollout_chunks` chunks of the current version and hands them over joined
(`Algorithm.collate`, which checks every value as it copies it).

A chunk of an older version (an actor that missed a publish) is counted under
`discarded/stale_version` and dropped; one that claims a newer version than
the learner has published is no honest actor's and is rejected.

A dead or silent actor must not stall training: when `rollout_timeout_s`
passes after the wait began with at least one chunk in hand, the rollout is
what arrived, and the wait shrinks to the senders that delivered it. A sender
heard from again (a chunk, stale or not) joins the wait again, up to
`rollout_chunks`.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import torch

from zrl.algorithms.base import Algorithm
from zrl.config import Config
from zrl.learner.batches import Batch, StreamBatches
from zrl.learner.progress import Progress


class VersionBatches(StreamBatches):
    queued = True
    collates = True

    def __init__(self, algo: Algorithm, device: torch.device, progress: Progress, config: Config, stop: threading.Event):
        super().__init__(algo, device, progress, config, stop)
        hp = algo.config.algo
        self.rollout_chunks = hp.rollout_chunks if hp.rollout_chunks is not None else max(1, config.run.num_actors)
        self.timeout_s = algo.config.algo.rollout_timeout_s
        self.live: set[int] | None = None  # the senders waited for, once a deadline has passed (None: any)
        self.rollout: list = []  # chunks of the current version
        self.version = -1
        self.wait_began: float | None = None

    def start_prefetch(self, depth: int) -> None:
        """Nothing to join ahead: the next rollout is acted only after this one's update."""

    def target(self) -> int:
        """Chunks the rollout waits for: rollout_chunks, or fewer after senders fell silent."""
        if self.live is None:
            return self.rollout_chunks
        return max(1, min(self.rollout_chunks, len(self.live)))

    def next(self, stop_check: Callable[[], bool], idle: Callable[[], None]) -> Batch | None:
        version = self.progress.updates  # the version published last, which actors act with now
        if version != self.version:
            self.version, self.rollout, self.wait_began = version, [], time.monotonic()
        for item in self.leftover:  # the mates of a chunk rejected at the last join
            self._add(item)
        self.leftover = []
        while len(self.rollout) < self.target():
            if self.rollout and time.monotonic() - self.wait_began >= self.timeout_s:
                self.live = {m.sender_id for m, _ in self.rollout}
                break
            item = self._get(idle)
            if item is None:
                if stop_check():
                    return None
                continue
            self._add(item)
        items, self.rollout = self.rollout, []
        batch = self.collate(items)
        if batch is None:  # some were rejected at the join; the rest are back in leftover
            return None
        return batch, [m.policy_version for m, _ in items]

    def _add(self, item) -> None:
        msg, _ = item
        if self.live is not None and msg.sender_id not in self.live:
            self.live.add(msg.sender_id)  # heard from again: waited for again
        if msg.policy_version == self.version:
            self.rollout.append(item)
        elif msg.policy_version < self.version:
            self.progress.discard("stale_version")
        else:
            self.progress.reject("future_version", f"a chunk of policy version {msg.policy_version} from sender "
                                 f"{msg.sender_id}, while the learner has published {self.version}")
