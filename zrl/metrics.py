"""Metrics: TensorBoard scalars and a console progress line.

`MetricsWriter` is used by the learner's training thread only; counters that
other threads touch (rejections, episodes) live in the learner behind its
lock and are read here when a line is written.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Mapping


class MetricsWriter:
    def __init__(self, logdir: Path | None, prefix: str = "learner", console: bool = True):
        self.logdir = logdir
        self.prefix = prefix
        self.console = console
        self._tb = None
        if logdir is not None:
            from torch.utils.tensorboard import SummaryWriter  # lazy: slow to import, and a writer without a logdir needs none

            self._tb = SummaryWriter(log_dir=str(logdir), flush_secs=10)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        if self._tb is None:
            return
        for k, v in values.items():
            if v is not None and math.isfinite(v):
                self._tb.add_scalar(k, v, step)

    def line(self, text: str) -> None:
        if self.console:
            print(f"[{self.prefix}] {text}", file=sys.stdout, flush=True)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None


class Rate:
    """Events per second between successive reads."""

    def __init__(self, total: int = 0):
        self.t = time.perf_counter()
        self.n = total

    def read(self, total: int) -> float:
        now = time.perf_counter()
        dt = now - self.t
        r = (total - self.n) / dt if dt > 0 else 0.0
        self.t, self.n = now, total
        return r
