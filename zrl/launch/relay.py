"""The children's output through `zrl run` itself: their stdout and stderr go to two pipes,
and `pump` prints what came, line by line, on this process's sys.stdout and sys.stderr.

`zrl run` relays when it shows a live status line (the children's lines then go above it)
and `zrl.train` always does (in a notebook, sys.stdout is the cell's output, which the
children's own file descriptors do not reach). A child writes each line whole (Python's
line buffering, or zrl.launch.processes.line_buffered_stdio), so the lines of children that
share a pipe never interleave mid-line.
"""
from __future__ import annotations

import os
import select
import sys


class OutputRelay:
    def __init__(self):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
        self.child_stdio = (out_w, err_w)  # what each child's stdout and stderr become
        self.partial = {out_r: b"", err_r: b""}  # per pipe: a line not yet ended
        self.streams = {out_r: "stdout", err_r: "stderr"}

    def pump(self, timeout: float) -> None:
        """Prints what the children wrote, waiting up to `timeout` seconds for something."""
        ready, _, _ = select.select(list(self.partial), [], [], timeout)
        for fd in ready:
            self._read(fd)

    def _read(self, fd: int) -> bool:
        """Prints the whole lines read from fd; False once it has nothing more now."""
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return False
        if not data:
            return False
        *lines, self.partial[fd] = (self.partial[fd] + data).split(b"\n")
        if lines:
            self._print(fd, b"\n".join(lines) + b"\n")
        return True

    def _print(self, fd: int, data: bytes) -> None:
        stream = getattr(sys, self.streams[fd])
        stream.write(data.decode("utf-8", errors="replace"))
        stream.flush()

    def close(self) -> None:
        """Once every child has exited: prints what is left, and closes the pipes."""
        for fd in self.child_stdio:
            os.close(fd)
        for fd in list(self.partial):
            while self._read(fd):
                pass
            if self.partial[fd]:
                self._print(fd, self.partial[fd] + b"\n")
            os.close(fd)
        self.partial.clear()
