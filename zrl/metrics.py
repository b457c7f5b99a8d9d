"""Metrics: TensorBoard scalars, a console progress line, and LOGDIR/progress.jsonl.

`MetricsWriter` is used by the learner's training thread only; counters that
other threads touch (rejections, episodes) live in the learner behind its
lock and are read here when a line is written.

progress.jsonl holds one JSON object a line, one for each console progress line: what
`zrl run` shows as its live status line and what `zrl.train`'s callback receives.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Mapping

PROGRESS_FILE = "progress.jsonl"
# "0" in a learner's environment: its progress lines are not printed (progress.jsonl still
# has them), as `zrl run` shows them as a live status line of its own.
PROGRESS_LINES_ENV = "ZRL_PROGRESS_LINES"


class MetricsWriter:
    def __init__(self, logdir: Path | None, prefix: str = "learner", console: bool = True):
        self.logdir = logdir
        self.prefix = prefix
        self.console = console and os.environ.get(PROGRESS_LINES_ENV) != "0"
        self._progress = None  # LOGDIR/progress.jsonl, opened on the first record
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

    def hparams(self, values: Mapping[str, object], metric_tags: list[str]) -> None:
        """Hyper-parameters (scalar values) for TensorBoard's HPARAMS tab, with `metric_tags`
        (scalars of this run) as their metrics. Written into this run's own events, where
        SummaryWriter.add_hparams would start a run of its own beside it."""
        if self._tb is None:
            return
        from torch.utils.tensorboard.summary import hparams  # lazy: only a writer with a logdir needs it

        for summary in hparams(dict(values), {tag: 0.0 for tag in metric_tags}):  # (metric values are read from the scalars)
            self._tb._get_file_writer().add_summary(summary)

    def line(self, text: str) -> None:
        if self.console:
            print(f"[{self.prefix}] {text}", file=sys.stdout, flush=True)

    def progress(self, record: Mapping[str, object]) -> None:
        """Appends one record (with the time it was written, `time`) to LOGDIR/progress.jsonl."""
        if self.logdir is None:
            return
        if self._progress is None:
            self._progress = open(Path(self.logdir) / PROGRESS_FILE, "a", encoding="utf-8")
        plain = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._progress.write(json.dumps({"time": round(time.time(), 3), **plain}) + "\n")
        self._progress.flush()  # a reader polls the file: each record is there as soon as it is written

    def close(self) -> None:
        if self._progress is not None:
            self._progress.close()
            self._progress = None
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
