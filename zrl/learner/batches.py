"""Where the training loop's batches come from: the algorithm's batch source.

`StreamBatches` (batch_source "stream"): the receiver puts checked chunks into a
bounded queue; the loop takes chunks until they fill `learner.batch_size`
columns and joins them with the algorithm's `collate`, which checks every
value as it copies it. A chunk that fails there is counted, dropped and taken
off the env-step count, and its batch mates go back to the front for the next
batch. With `learner.prefetch_batches` a thread of its own joins batches ahead.

`ReplayBatches` (batch_source "replay"): the receiver hands chunks to the
algorithm's replay (`ingest`); the loop draws batches from it (`sample`).

`VersionBatches` (batch_source "version", learner/version_batches.py): the
chunks of exactly the current policy version, a rollout at a time (PPO).

`GradientBatches` (batch_source "gradients", learner/gradient_batches.py):
gradients computed by the actors, one at a time (A3C's parameter server).

All give `next(stop_check, idle) -> (batch, policy versions) | None`; the class
attributes say how the receiver feeds them (`queued`: into `queue`, else
`take_chunk`) and whether they join chunks with the algorithm's `collate`
(`collates`: the gate may then leave the schema's `at_join` rules to it).
"""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import Callable

import torch

from zrl.algorithms.base import Algorithm, RejectedChunks
from zrl.config import Config
from zrl.learner.prefetch import Prefetcher
from zrl.learner.progress import Progress

Batch = tuple[dict, object]  # (the batch on the learner's device, its chunks' policy versions)


class QueuedSource:
    """A source the receiver feeds through a bounded queue (`learner.queue_size` messages):
    when it is full the receiver stops reading, and ZeroMQ pushes back on the senders."""

    queued = True  # the receiver puts checked messages into `queue`
    collates = False

    def __init__(self, algo: Algorithm, device: torch.device, progress: Progress, config: Config, stop: threading.Event):
        self.algo = algo
        self.device = device
        self.progress = progress
        self.queue: queue.Queue = queue.Queue(maxsize=config.learner.queue_size)

    def start_prefetch(self, depth: int) -> None:
        """Nothing made ahead (a source that can, overrides this)."""

    def close(self) -> None:
        pass

    def room(self) -> int:
        """Messages the queue has room for now (at least 1: the receiver waits for it)."""
        return max(1, self.queue.maxsize - self.queue.qsize())

    def fill(self) -> tuple[int, int]:
        return self.queue.qsize(), self.queue.maxsize

    def _get(self, idle: Callable[[], None]):
        """The next (message, bindings), waited for up to 50 ms; None, after idle(), if none came."""
        try:
            return self.queue.get(timeout=0.05)
        except queue.Empty:
            idle()
            return None


class StreamBatches(QueuedSource):
    collates = True

    def __init__(self, algo: Algorithm, device: torch.device, progress: Progress, config: Config, stop: threading.Event):
        super().__init__(algo, device, progress, config, stop)
        self.batch_size = config.learner.batch_size
        self.leftover: list = []  # chunks put back: a batch's overflow, or the mates of a rejected chunk
        self.prefetcher: Prefetcher | None = None

    def start_prefetch(self, depth: int) -> None:
        """Joins batches on a thread of their own, up to `depth` ahead (0: in the loop)."""
        if depth:
            self.prefetcher = Prefetcher(self._prefetched, depth)

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
            self.prefetcher = None

    def next(self, stop_check: Callable[[], bool], idle: Callable[[], None]) -> Batch | None:
        if self.prefetcher is not None:
            got = self.prefetcher.get(0.05)
            if got is None:
                idle()
            return got
        items = self.take(stop_check, idle)
        if items is None:
            return None
        batch = self.collate(items)
        return None if batch is None else (batch, [m.policy_version for m, _ in items])

    def take(self, stop_check: Callable[[], bool], idle: Callable[[], None]) -> list | None:
        """Chunks that fill the batch's columns (put-back chunks first), or None when
        stop_check() said so while waiting."""
        B = self.batch_size
        items, cols = [], 0
        pending, self.leftover = self.leftover, []
        for j, item in enumerate(pending):
            c = self.algo.columns(*item)
            if items and cols + c > B:
                self.leftover = pending[j:]
                return items
            items.append(item)
            cols += c
        while cols < B:
            item = self._get(idle)
            if item is None:
                if stop_check():
                    return None
                continue
            c = self.algo.columns(*item)
            if cols + c > B:
                self.leftover.append(item)
                break
            items.append(item)
            cols += c
        return items

    def collate(self, items: list) -> dict | None:
        """The batch of these chunks, or None when some broke a rule checked as they were
        joined (the schema's `at_join` fields): those are counted as rejected and dropped, and
        the rest go back to the front of the queue for the next batch."""
        try:
            return self.algo.collate([m for m, _ in items], self.device)
        except RejectedChunks as e:
            for err in e.errors.values():
                self.progress.reject(err.reason.value, err.detail)
            with self.progress.lock:  # counted on receipt; a chunk rejected here was no env step trained on
                self.progress.env_steps -= sum(self.algo.env_steps(*items[i]) for i in e.errors)
            self.leftover = [item for i, item in enumerate(items) if i not in e.errors] + self.leftover
            return None

    def _prefetched(self, stop: threading.Event) -> Batch | None:
        """For the Prefetcher's thread, which alone takes from the queue then."""
        items = self.take(stop.is_set, lambda: None)
        if items is None:
            return None
        # (A thread starts on the current device, cuda:0.)
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            batch = self.collate(items)
        return None if batch is None else (batch, [m.policy_version for m, _ in items])


class ReplayBatches:
    """The receiver adds chunks to the algorithm's replay (`take_chunk`); the loop samples it.

    An algorithm whose config sets `updates_per_step` (SAC; Ape-X optionally) holds a replay
    ratio: SAC's `sample` waits while the updates are ahead, and here `room()` is 0 while the env steps received
    are more than `max_steps_ahead` (None: one chunk per actor) ahead of what the updates
    allow after `learning_starts`, so the receiver leaves chunks in ZeroMQ and the actors
    wait. Both count from where this process started (a resumed run refills its replay).
    """

    queued = False  # the receiver hands chunks to `take_chunk`
    collates = False

    def __init__(self, algo: Algorithm, device: torch.device, progress: Progress, config: Config, stop: threading.Event):
        self.algo = algo
        self.device = device
        self.progress = progress
        self.stop = stop
        hp = config.algo
        self.ratio: float | None = getattr(hp, "updates_per_step", None)
        if self.ratio is not None:
            self.learning_starts = hp.learning_starts
            self.chunk_steps = config.actor.unroll_length * (config.actor.num_envs // config.actor.env_groups)  # (an agent server's are smaller)
            self.max_ahead = hp.max_steps_ahead if hp.max_steps_ahead is not None else self.chunk_steps * max(1, config.run.num_actors)
            self.start = (progress.env_steps, progress.updates)  # (made under progress.lock: the handshake builds the learner)

    def start_prefetch(self, depth: int) -> None:
        """A replay learner samples in line."""

    def close(self) -> None:
        pass

    def room(self) -> int:
        """Chunks the receiver may take now: with a replay ratio, as many as stay within
        max_steps_ahead of it (0 while the actors are that far ahead)."""
        if self.ratio is None:
            return 64
        left = self.max_ahead - self.steps_ahead()
        return 0 if left <= 0 else min(64, int(-(-left // self.chunk_steps)))  # (whole chunks, rounded up)

    def steps_ahead(self) -> float:
        """Env steps received beyond what the updates so far allow (negative: the updates are ahead)."""
        with self.progress.lock:
            steps, updates = self.progress.env_steps - self.start[0], self.progress.updates - self.start[1]
        return steps - self.learning_starts - updates / self.ratio

    def fill(self) -> tuple[int, int]:
        return 0, 0

    def take_chunk(self, msg, bindings) -> None:
        self.algo.ingest(msg, bindings)

    def next(self, stop_check: Callable[[], bool], idle: Callable[[], None]) -> Batch | None:
        batch = self.algo.sample(self.device)
        if batch is None:  # replay not warm yet: wait for the receiver to fill it
            idle()
            self.stop.wait(0.005)
            return None
        return batch, batch.pop("_policy_version", None)

