"""The child processes of `zrl run`: how one is started (forked from this process, or
exec'd), polled, signalled and stopped.

A child runs `python -m zrl COMMAND ...` in its own session, so a Ctrl-C on the terminal
reaches only `zrl run`, which forwards it. Children get PR_SET_PDEATHSIG, so even a SIGKILL
of `zrl run` leaves none behind.
"""
from __future__ import annotations

import ctypes
import io
import os
import runpy
import select
import signal
import subprocess
import sys
import time
import traceback
from typing import Callable


def die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the parent dies (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def line_buffered_stdio() -> None:
    """One write per line on stdout and stderr, so the lines of children that share a pipe
    never interleave mid-line. Unbuffered (PYTHONUNBUFFERED), print() writes a line's text
    and its newline in two writes, and another child's line could land between them."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or not isinstance(getattr(stream, "buffer", None), io.FileIO):
            continue
        raw = io.FileIO(stream.fileno(), "w", closefd=False)
        setattr(sys, name, io.TextIOWrapper(io.BufferedWriter(raw), encoding=stream.encoding, errors=stream.errors, line_buffering=True))


def redirect_stdio(stdio: tuple[int, int]) -> None:
    """In a forked child: stdout and stderr go to these fds (zrl run's relay pipes). The
    streams are the interpreter's own again: the parent's may wrap its terminal."""
    for fd, target in zip(stdio, (1, 2)):
        os.dup2(fd, target)
    for fd in set(stdio) - {1, 2}:
        os.close(fd)
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__


def run_module_as_main(module: str, args: list[str]) -> None:
    """What `python -m MODULE ARGS` runs, in this process. The forked child reaches zrl's
    command line through its entry module, as an exec'd one does, so launch never imports
    the cli that imports it."""
    sys.argv = [module, *args]  # (runpy puts the module's path in sys.argv[0])
    runpy.run_module(module, run_name="__main__", alter_sys=True)


class ForkedProcess:
    """A child made by fork() that runs `python -m MODULE ARGS` in-process: the Popen calls
    the supervisor needs.

    zrl run imports torch and the rest once, then forks its children, which
    start with all of it loaded instead of each importing it again (three
    processes importing torch at once cost over a second on two cores). The
    parent has started no threads and no ZeroMQ context when it forks.
    """

    def __init__(self, module: str, args: list[str], stdio: tuple[int, int] | None = None, env: dict[str, str] | None = None):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._run_child(lambda: run_module_as_main(module, args), stdio, env or {})
        self.pid = pid
        self.returncode: int | None = None
        try:
            self._pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = None

    @staticmethod
    def _run_child(main: Callable[[], None], stdio: tuple[int, int] | None, env: dict[str, str]) -> None:
        """The forked child: never returns."""
        code = 1
        try:
            os.setsid()
            die_with_parent()
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            if stdio is not None:
                redirect_stdio(stdio)
            os.environ.update(env)
            line_buffered_stdio()
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                if self._pidfd is not None:
                    os.close(self._pidfd)
                    self._pidfd = None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            if self._pidfd is not None:
                select.select([self._pidfd], [], [], 0.5 if left is None else min(left, 0.5))
            else:
                time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Child:
    """One named child of `zrl run` (the learner, an actor, the agent server) across its
    restarts: its command line, its current process, and its restart bookkeeping. stdio: the
    fds its stdout and stderr go to (default: this process's own); env: variables added to
    its environment."""

    def __init__(self, name: str, argv: list[str], fork: bool, stdio: tuple[int, int] | None = None, env: dict[str, str] | None = None):
        self.name = name
        self.argv = argv  # [python, -m, zrl, COMMAND, ...]
        self.fork = fork
        self.stdio = stdio
        self.env = env or {}
        self.proc: subprocess.Popen | ForkedProcess | None = None
        self.restarts = 0
        self.restart_at: float | None = None
        self.gave_up: int | None = None  # the exit code after which it is not restarted
        self.on_start: Callable[[], None] | None = None  # called after each (re)start
        self._stopped = None  # the process stop() signalled

    def start(self) -> None:
        if self.fork:
            self.proc = ForkedProcess(self.argv[2], self.argv[3:], self.stdio, self.env)
        else:
            out, err = self.stdio or (None, None)
            relayed = {"ZRL_LINE_BUFFERED": "1"} if self.stdio is not None else {}  # (one write per line into the relay)
            env = {**self.env, **relayed}
            self.proc = subprocess.Popen(self.argv, start_new_session=True, preexec_fn=die_with_parent, stdout=out, stderr=err,
                                         env={**os.environ, **env} if env else None)
        if self.on_start is not None:
            try:
                self.on_start()
            except OSError as e:  # (pids.json: a full disk, say) the child runs all the same
                print(f"[zrl run] {self.name} started, but: {e}", flush=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """SIGTERM, once per process: a second one would make it exit without its clean
        stop. A process started after a stop() (a signal during its start) gets its own."""
        if self.proc is not None and self._stopped is not self.proc:
            self._stopped = self.proc
            self.signal(signal.SIGTERM)


def reap(children: list[Child], timeout: float) -> None:
    """Waits for the children to exit, together within `timeout`; kills those still running then."""
    deadline = time.monotonic() + timeout
    for c in children:
        if c.proc is None:
            continue
        try:
            c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait()
