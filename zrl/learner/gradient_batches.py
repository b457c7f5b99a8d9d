"""batch_source "gradients": gradients computed by the actors (A3C), applied one at a time.

The learner is a parameter server: the receiver puts each GRADIENT message the
gate passed (dtype, shape, finite, norm bound) into a bounded queue, and
`next` hands them over one by one as the batch `{gradient, loss, env_steps}`
on the learner's device, which the algorithm's `update` applies.

A gradient computed at weights more than `algo.max_staleness` updates older
than the learner's is counted under `discarded/stale_gradient` and dropped:
it points where the weights were, not where they are. One that claims a newer
version than the learner has made is no honest actor's and is rejected.
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import torch

from zrl.algorithms.base import Algorithm
from zrl.config import Config
from zrl.learner.batches import Batch, QueuedSource
from zrl.learner.progress import Progress


class GradientBatches(QueuedSource):
    """Nothing is made ahead: a gradient is one copy to the device."""

    def __init__(self, algo: Algorithm, device: torch.device, progress: Progress, config: Config, stop: threading.Event):
        super().__init__(algo, device, progress, config, stop)
        self.max_staleness = config.algo.max_staleness

    def next(self, stop_check: Callable[[], bool], idle: Callable[[], None]) -> Batch | None:
        item = self._get(idle)
        if item is None:
            return None
        msg, bindings = item
        if not self.usable(msg, bindings):
            return None
        batch = {name: self._to_device(a) for name, a in msg.arrays.items()}
        return batch, [msg.policy_version]

    def usable(self, msg, bindings) -> bool:
        """Whether the gradient is recent enough to apply; counts the ones that are not."""
        version = self.progress.updates  # the weights' version now: updates made so far
        if msg.policy_version > version:
            self.progress.reject("future_version", f"a gradient at policy version {msg.policy_version} from sender "
                                 f"{msg.sender_id}, while the learner has made {version} updates")
            with self.progress.lock:  # counted on receipt; a rejected message's steps are not the run's
                self.progress.env_steps -= self.algo.env_steps(msg, bindings)
            return False
        if version - msg.policy_version > self.max_staleness:
            self.progress.discard("stale_gradient")
            return False
        return True

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.array(a))  # (a copy: the message's arrays are read-only views of its frame)
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)
