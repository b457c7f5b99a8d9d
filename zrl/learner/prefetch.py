"""Batches made on a thread of their own, ahead of the training loop (learner.prefetch_batches).

On a GPU the loop's own thread spends its time launching kernels and waiting for V-trace's
round trip; joining the next batch's chunks (19 MB for Pong at 32 columns) and starting its
copy to the device can run beside that on another core: numpy's and torch's copies release
the GIL. The default (auto) turns it on for a CUDA learner, where it took the update of
Pong's shallow net at 32 columns from 1.93x a plain loop's time to 1.29x on an H100; on a
CPU learner it changed nothing and would take cores from PyTorch's own, so it stays off
there. bench/PIPELINE.md has the figures.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable


class Prefetcher:
    """Calls `make(stop)` on a thread, over and over, and keeps up to `depth` of its results
    for `get`. `make` returns a batch, or None when it found nothing before giving up (it
    should watch `stop`, an Event set by close). An exception in `make` ends the thread and
    is raised again by the next `get`."""

    def __init__(self, make: Callable[[threading.Event], Any], depth: int, name: str = "zrl-prefetch"):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._make = make
        self._ready: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                item = self._make(self._stop)
                if item is None:
                    continue
                while not self._stop.is_set():
                    try:
                        self._ready.put(item, timeout=0.05)
                        break
                    except queue.Full:
                        pass
        except BaseException as e:  # noqa: BLE001 - handed to the loop, which decides
            self._error = e

    def get(self, timeout: float) -> Any | None:
        """The next batch, or None if none came within timeout. Raises what `make` raised."""
        try:
            return self._ready.get(timeout=timeout)
        except queue.Empty:
            if self._error is not None:
                raise self._error
            return None

    def close(self, timeout: float = 10.0) -> None:
        """Stops the thread and waits for it; batches not taken are dropped."""
        self._stop.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()
