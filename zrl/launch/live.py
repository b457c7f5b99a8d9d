"""A status line kept at the bottom of a terminal (plain ANSI escapes), with whatever is
printed meanwhile going above it: `zrl run`'s live progress when stdout is a terminal.

While `live_line()` is open, sys.stdout (and sys.stderr, when it is the terminal too) are
wrapped so that each whole line printed erases the status line, goes out, and the status
line is drawn again under it. The children's lines reach the terminal the same way, through
zrl.launch.relay.
"""
from __future__ import annotations

import contextlib
import shutil
import sys
import threading
from typing import Iterator

ERASE = "\r\x1b[2K"  # to the line's start, and clear it


class LiveLine:
    def __init__(self, terminal):
        self.terminal = terminal  # the stream the status line is drawn on
        self.text = ""
        self.shown = False
        # Reentrant: a signal handler that prints runs in the thread it interrupted.
        self.lock = threading.RLock()

    def set(self, text: str) -> None:
        with self.lock:
            self.text = text
            self._draw()

    def print_above(self, stream, text: str) -> None:
        with self.lock:
            self._erase()
            stream.write(text)
            stream.flush()
            self._draw()

    def clear(self) -> None:
        with self.lock:
            self._erase()
            self.text = ""

    def _erase(self) -> None:
        if self.shown:
            self.terminal.write(ERASE)
            self.terminal.flush()
            self.shown = False

    def _draw(self) -> None:
        if not self.text:
            return
        # One terminal row: a wrapped line could not be erased with ERASE.
        width = max(10, shutil.get_terminal_size().columns - 1)
        self.terminal.write(ERASE + self.text[:width])
        self.terminal.flush()
        self.shown = True


class AboveLiveLine:
    """sys.stdout or sys.stderr while a LiveLine is shown: whole lines go above it."""

    def __init__(self, live: LiveLine, stream):
        self._live = live
        self._stream = stream
        self._pending = ""  # text not yet ended by a newline

    def write(self, text: str) -> int:
        with self._live.lock:
            self._pending += text
            if "\n" in self._pending:
                done, _, self._pending = self._pending.rpartition("\n")
                self._live.print_above(self._stream, done + "\n")
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def finish(self) -> None:
        """Writes out a last line that was never ended."""
        if self._pending:
            self._live.print_above(self._stream, self._pending + "\n")
            self._pending = ""

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def live_line() -> Iterator[LiveLine]:
    """A LiveLine on sys.stdout (a terminal), with sys.stdout and sys.stderr printing above it."""
    saved = sys.stdout, sys.stderr
    live = LiveLine(saved[0])
    wrapped = [AboveLiveLine(live, saved[0])]
    sys.stdout = wrapped[0]
    if saved[1] is not None and saved[1].isatty():
        wrapped.append(AboveLiveLine(live, saved[1]))
        sys.stderr = wrapped[1]
    try:
        yield live
    finally:
        for w in wrapped:
            w.finish()
        live.clear()
        sys.stdout, sys.stderr = saved


def is_terminal(stream) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # (a closed stream, or an object with no isatty)
        return False
