"""The learner's batch sources by name: the algorithm config's `batch_source` picks one."""
from __future__ import annotations

import threading

import torch

from zrl.algorithms.base import Algorithm
from zrl.config import Config
from zrl.learner.batches import ReplayBatches, StreamBatches
from zrl.learner.gradient_batches import GradientBatches
from zrl.learner.progress import Progress
from zrl.learner.version_batches import VersionBatches

SOURCES: dict[str, type] = {
    "stream": StreamBatches,
    "replay": ReplayBatches,
    "version": VersionBatches,
    "gradients": GradientBatches,
}


def source_class(batch_source: str) -> type:
    """The class that feeds an algorithm of this `batch_source`."""
    if batch_source not in SOURCES:
        raise ValueError(f"batch source {batch_source!r} is not one the learner has ({sorted(SOURCES)})")
    return SOURCES[batch_source]


def make_source(algo: Algorithm, device: torch.device, progress: Progress, config: Config, stop: threading.Event):
    """The batch source of `algo` (its config's `batch_source`)."""
    return source_class(algo.batch_source)(algo, device, progress, config, stop)
