"""`zrl run`: the Supervisor readies the run's directory (zrl.launch.rundir: an earlier run
moved aside, or a --resume checked before anything starts; LOGDIR/config.yaml written, which
every child reads), starts the learner and N actors (and an evaluation actor, an agent
server) as child processes of this one, restarts an actor that dies (with a back-off and a
cap), stops every child when the learner exits or on Ctrl-C, and writes LOGDIR/summary.json.

A first SIGINT or SIGTERM asks the learner to checkpoint and exit and stops the actors; a
second kills them all. The run fails (and stops) once the actors cannot feed the learner:
see actors_failed.

The learner's progress records (LOGDIR/progress.jsonl) go to `on_progress` (zrl.train's
callback) and, when stdout is a terminal, to a live status line; the children's output then
goes through this process (zrl.launch.relay) so that it prints above that line.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from zrl.config import Config, ConfigError
from zrl.launch import rundir
from zrl.launch.banner import banner
from zrl.launch.live import LiveLine, is_terminal, live_line
from zrl.launch.options import RunOptions
from zrl.launch.processes import Child, reap
from zrl.launch.progress_tail import ProgressTail
from zrl.launch.relay import OutputRelay
from zrl.launch.roles import EXIT_CONFIG, EXIT_REFUSED
from zrl.launch.status import status_text
from zrl.launch.summary import summarise
from zrl.metrics import PROGRESS_FILE, PROGRESS_LINES_ENV

# How long `zrl run`, leaving on an error of its own, waits for the learner to save and exit.
LEARNER_STOP_S = 120.0
# How long the children, once stopped, have to exit before they are killed.
CHILDREN_STOP_S = 10.0
ZRL = [sys.executable, "-m", "zrl"]


def run_local(cfg: Config, opts: RunOptions) -> int:
    """`zrl run`: the run's exit code."""
    return Supervisor(cfg, opts).run()


class Supervisor:
    """One `zrl run`: its children and what it has asked of them. A signal handler and the
    supervising loop share this state, in the main thread. on_progress(record) gets each
    progress record; returning False stops the run as a first Ctrl-C does."""

    def __init__(self, cfg: Config, opts: RunOptions, on_progress: Callable[[dict], object] | None = None):
        self.cfg = cfg
        self.opts = opts
        self.on_progress = on_progress
        self.tail: ProgressTail | None = None
        self.relay: OutputRelay | None = None  # the children's output, when it goes through this process
        self.live: LiveLine | None = None  # the status line, on a terminal
        self.logdir = Path(opts.logdir)
        self.final_path = self.logdir / "learner_final.json"
        self.tmpdir = ""  # private to this run: the default ipc:// endpoint, the ready file
        self.bind = ""  # the learner's control endpoint, as given to it
        self.ready_file: str | None = None  # where the learner says which port it bound (a wildcard bind)
        self.learner: Child | None = None
        self.followers: list[Child] = []  # learners 1.. of a group (learner.num_learners > 1)
        self.group_url: str | None = None  # where the group meets: a file in tmpdir
        self.actors: list[Child] = []  # training actors, then the evaluation actor and agent server if any
        self.stopping = threading.Event()
        self.signals = 0  # SIGINT/SIGTERM received
        self.asked_learner = False  # sent it its SIGINT (once: a second one costs its checkpoint)
        self.forced = False  # a second signal killed every child
        self.failure: tuple[int, str] | None = None  # (exit code, stop reason) when the actors made the run fail
        self.callback_stop = False  # on_progress returned False
        self.resumed_env_steps = 0  # the env steps of the checkpoint a --resume starts from

    @property
    def children(self) -> list[Child]:
        return [self.learner, *self.followers, *self.actors]

    def run(self) -> int:
        if not self._ready_logdir():
            return 2
        self.final_path.unlink(missing_ok=True)
        self.tail = ProgressTail(self.logdir / PROGRESS_FILE)
        self.tmpdir = tempfile.mkdtemp(prefix="zrl-run-")
        with contextlib.ExitStack() as console:
            self._open_console(console)
            self._make_children()
            old = {}
            try:
                old = self._install_signal_handlers()
                print(banner(self.cfg, self.opts.num_actors, self.logdir), flush=True)
                if not self._start():
                    return 130
                self._supervise()
                t_end = time.time()
            finally:
                self._shut_down(old)
        return self._finish(t_end)

    def _open_console(self, stack: contextlib.ExitStack) -> None:
        """The live status line (stdout a terminal) and the relay of the children's output,
        closed by `stack` once the children have exited."""
        if not (self.opts.relay if self.opts.relay is not None else is_terminal(sys.stdout)):
            return
        if self.opts.live and is_terminal(sys.stdout):
            self.live = stack.enter_context(live_line())
        self.relay = OutputRelay()
        stack.callback(self.relay.close)

    def _install_signal_handlers(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}  # (zrl.train called from a thread) only the main thread may set them
        return {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def _ready_logdir(self) -> bool:
        """Readies LOGDIR for this run; False, having said why, when it cannot be used. A resume
        is checked first, as the learner would check it, so that a refused one writes nothing."""
        from zrl.checkpoint import CheckpointError  # lazy: imports torch

        try:
            if self.opts.resume:
                self.resumed_env_steps = self._check_resume()
            else:
                self._make_room()
            self.logdir.mkdir(parents=True, exist_ok=True)
            rundir.save_config(self.logdir, self.cfg)
        except OSError as e:
            print(f"[zrl run] error: cannot use logdir {self.logdir}: {e.strerror or e}", file=sys.stderr, flush=True)
            return False
        except (rundir.RunDirError, CheckpointError, ConfigError) as e:
            print(f"[zrl run] error: {e}", file=sys.stderr, flush=True)
            return False
        return True

    def _check_resume(self) -> int:
        from zrl.learner.resume import check_resume  # lazy: imports torch

        counters = check_resume(self.cfg, self.logdir / "checkpoints")
        return int(counters.get("env_steps", 0)) if counters else 0

    def _make_room(self) -> None:
        moved = rundir.make_room(self.logdir)
        if moved is not None:
            print(f"[zrl run] {self.logdir} held an earlier run: moved it to {moved} (--resume continues a run instead)", flush=True)

    def _make_children(self) -> None:
        self.bind = self.opts.bind or f"ipc://{self.tmpdir}/control"
        # With a wildcard port the actors can only be told the endpoint once the learner has bound it.
        self.ready_file = os.path.join(self.tmpdir, "ready.json") if "*" in self.bind else None
        stdio = self.relay.child_stdio if self.relay else None
        # On a terminal the status line shows the learner's progress in place of its lines.
        quiet = {PROGRESS_LINES_ENV: "0"} if self.live else None
        n = self.cfg.learner.num_learners
        if n > 1:
            self.group_url = f"file://{self.tmpdir}/group"
        self.learner = Child("learner", self._learner_argv(), self.opts.fork, stdio, quiet)
        if n > 1:
            self.followers = [Child(f"learner {r}", self._learner_argv(r), self.opts.fork, stdio, quiet) for r in range(1, n)]
        run = self.cfg.run
        names = [f"actor {i}" for i in range(self.opts.num_actors)] + (["eval actor"] if run.eval_actor else []) + (["agent server"] if run.agent_server else [])
        self.actors = [Child(name, self._actor_argv(i, name, self._endpoint_of(i, self.bind)), self.opts.fork, stdio) for i, name in enumerate(names)]
        for c in self.children:
            c.on_start = self._write_pids

    def _config_args(self) -> list[str]:
        """The config the children read: this run's, as saved in LOGDIR (an actor restarted after
        the user edited the config file still gets the run's)."""
        return ["--config", str(self.logdir / rundir.CONFIG_FILE)]

    def _follower_bind(self, rank: int) -> str:
        return f"ipc://{self.tmpdir}/control-{rank}"

    def _endpoint_of(self, i: int, first: str) -> str:
        """The control endpoint of the learner that actor i feeds: training actors go round the
        group's learners; the evaluation actor and the agent server feed the first, `first`."""
        n = self.cfg.learner.num_learners
        rank = i % n if i < self.opts.num_actors else 0
        return first if rank == 0 else self._follower_bind(rank)

    def _learner_argv(self, rank: int = 0) -> list[str]:
        opts = self.opts
        bind = self.bind if rank == 0 else self._follower_bind(rank)
        argv = [*ZRL, "learner", *self._config_args(), "--bind", bind, "--logdir", str(self.logdir), "--logdir-ready",
                "--seed", str(opts.seed)]
        if self.group_url is not None:
            argv += ["--rank", str(rank), "--dist-url", self.group_url]
        for flag, value in (("--stop-at-return", opts.stop_at_return), ("--max-seconds", opts.max_seconds), ("--max-env-steps", opts.max_env_steps)):
            if value is not None:
                argv += [flag, str(value)]
        if opts.resume:
            argv.append("--resume")
        if self.ready_file and rank == 0:
            argv += ["--ready-file", self.ready_file]
        return argv

    def _actor_argv(self, i: int, name: str, endpoint: str) -> list[str]:
        """The command line of self.actors[i], which connects to the learner at `endpoint`."""
        seed = str(self.opts.seed)
        if name == "agent server":
            # (its own folder: its rejected/* tags are the server's, not the learner's)
            return [*ZRL, "serve", *self._config_args(), "--learner", endpoint, "--seed", seed, "--logdir", str(self.logdir / "server")]
        # The evaluation actor takes the index after the training actors' (its sender id).
        evaluating = i == self.opts.num_actors
        n = self.opts.num_actors + 1 if evaluating else self.opts.num_actors
        argv = [*ZRL, "actor", *self._config_args(), "--learner", endpoint, "--index", str(i), "--num-actors", str(n), "--seed", seed]
        return argv + ["--eval"] if evaluating else argv

    def _write_pids(self) -> None:
        # LOGDIR/pids.json: which process is which (forked children share zrl run's command line).
        tmp = self.logdir / ".pids.json.tmp"
        tmp.write_text(json.dumps({c.name: c.proc.pid for c in self.children if c.proc is not None}, indent=1) + "\n")
        os.replace(tmp, self.logdir / "pids.json")

    def _on_signal(self, signum, frame) -> None:
        self.signals += 1
        if self.signals == 1 and self.stopping.is_set():  # already stopping on its own (failed actors)
            print("\n[zrl run] already stopping; a second signal kills the learner and actors", flush=True)
            return
        if self.stopping.is_set():
            # A second Ctrl-C: the user will not wait for a learner slow to stop.
            if not self.forced:
                self.forced = True
                print("\n[zrl run] second signal: killing the learner and actors now", flush=True)
                for c in self.children:
                    c.signal(signal.SIGKILL)
            return
        self._stop_all("\n[zrl run] stopping: asking the learner to checkpoint and exit")

    def _ask_learner(self) -> None:
        # Once: a second SIGINT makes the learner exit without its checkpoint.
        if not self.asked_learner and self.learner.alive():
            self.asked_learner = True
            self.learner.signal(signal.SIGINT)

    def _stop_all(self, why: str) -> None:
        self.stopping.set()
        self._ask_learner()  # first: nothing below may cost the learner its checkpoint
        for a in self.actors:
            a.stop()
        print(why, flush=True)

    def _start(self) -> bool:
        """Starts the learner, then the actors once it is listening; False if a signal came first."""
        if self.opts.fork:
            preload()
        if self.stopping.is_set():  # Ctrl-C while importing: nothing was started
            print("[zrl run] stopped before the learner started", flush=True)
            return False
        self.learner.start()
        for f in self.followers:
            f.start()
        if self.forced:  # signals during the start found no learner to ask or kill
            for c in (self.learner, *self.followers):
                c.signal(signal.SIGKILL)
        elif self.stopping.is_set():
            self._ask_learner()
        if self.ready_file:
            endpoint = self._wait_ready() or self.bind
            for i, a in enumerate(self.actors):
                a.argv = self._actor_argv(i, a.name, self._endpoint_of(i, endpoint))
        for a in self.actors:
            if not self.stopping.is_set() and self.learner.alive():
                a.start()
        return True

    def _wait_ready(self) -> str | None:
        """The learner's bound control endpoint, once it has written its ready file."""
        while self.learner.alive() and not self.stopping.is_set():
            if os.path.exists(self.ready_file):
                with open(self.ready_file) as f:
                    return json.load(f)["control"]
            self._wait(0.05)
        return None

    def _wait(self, timeout: float) -> None:
        """Up to `timeout` seconds for the learner to exit (or the children to print), then
        passes on the progress records that came."""
        if self.relay is not None:
            self.relay.pump(timeout)
        else:
            wait_for_exit(self.learner, timeout)
        self._poll_progress()

    def _poll_progress(self) -> None:
        if self.live is None and self.on_progress is None:
            return  # nobody reads them
        for record in self.tail.read():
            if self.live is not None:
                self.live.set(status_text(record, self.opts))
            if self.on_progress is not None and self.on_progress(record) is False and not self.stopping.is_set():
                self.callback_stop = True
                self._stop_all("[zrl run] stopping: the progress callback asked to stop")

    def _supervise(self) -> None:
        """Until the learner exits: restarts the actors that die, and stops the run once they cannot feed it."""
        while self.learner.alive():
            self._wait(0.1)
            if self.stopping.is_set():
                continue
            now = time.monotonic()
            for a in self.actors:
                supervise_actor(a, now, self.opts)
            self.failure = actors_failed(self.actors)
            if self.failure is not None:
                self._stop_all(f"[zrl run] stopping: {self.failure[1]}")
        self._poll_progress()  # the learner's last record, written as it stopped

    def _shut_down(self, old_handlers: dict) -> None:
        for a in self.actors:
            a.stop()
        for f in self.followers:  # (they stop with the first learner; one waiting on a dead one does not)
            if f.alive():
                f.signal(signal.SIGINT)
        if self.learner.alive() and not self.forced:
            # Leaving on an error (not a signal, not the learner's own end): it still saves first.
            self._ask_learner()
            self._reap([self.learner], LEARNER_STOP_S)
        self._reap(self.children, CHILDREN_STOP_S)
        for s, h in old_handlers.items():
            signal.signal(s, h)
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def _reap(self, children: list[Child], timeout: float) -> None:
        """processes.reap, printing the children's output meanwhile when it comes through here
        (a child blocked on a full pipe would not exit)."""
        if self.relay is not None:
            deadline = time.monotonic() + timeout
            while any(c.alive() for c in children) and time.monotonic() < deadline:
                self.relay.pump(0.05)
            timeout = 0.0
        reap(children, timeout)

    def _finish(self, t_end: float) -> int:
        """Writes summary.json; the run's exit code."""
        crashed = any(a.restarts or a.restart_at is not None or a.gave_up is not None for a in self.actors)
        reason = self.failure[1] if self.failure else "stopped by the progress callback" if self.callback_stop else None
        code = summarise(self.final_path, self.logdir, self.opts, t_end, self.learner.proc.returncode,
                         stop_reason=reason, actors_crashed=crashed, resumed_env_steps=self.resumed_env_steps)
        return self.failure[0] if self.failure else 130 if self.forced else code


def preload() -> None:
    """Imports what every child needs once, before forking them."""
    import gymnasium  # noqa: F401  # lazy: only zrl run's forking parent needs these loaded
    import torch  # noqa: F401  # lazy: only zrl run's forking parent needs these loaded
    import torch.utils.tensorboard  # noqa: F401  # lazy: only zrl run's forking parent needs these loaded

    import zrl.actors.actor  # noqa: F401  # lazy: imports torch
    import zrl.learner.learner  # noqa: F401  # lazy: imports torch
    import zrl.server  # noqa: F401  # lazy: imports torch


def wait_for_exit(child: Child, timeout: float) -> None:
    """Returns when the child exits or after `timeout` seconds."""
    try:
        child.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass


def supervise_actor(a: Child, now: float, opts: RunOptions) -> None:
    """An actor that exited: schedules its restart after a back-off (doubling, capped), starts
    it once that has passed, or gives up on it (an exit code that a restart would not
    change, or its restart cap reached)."""
    if a.proc is None or a.alive() or a.gave_up is not None:
        return
    if a.restart_at is None:
        code = a.proc.returncode
        if code == 0:
            return  # finished on its own (the learner said shutdown)
        if code in (EXIT_CONFIG, EXIT_REFUSED):  # its config cannot run, or the learner refused its hello (it
            a.gave_up = code  # said why): a restart would fail the same way
            return
        if a.restarts >= opts.max_restarts:
            print(f"[zrl run] {a.name} exited with {code}; restart cap ({opts.max_restarts}) reached, not restarting", flush=True)
            a.gave_up = code
            return
        first, cap = opts.restart_backoff_s
        delay = min(cap, first * (2 ** a.restarts))
        a.restart_at = now + delay
        print(f"[zrl run] {a.name} exited with {code}; restarting in {delay:.1f}s ({a.restarts + 1}/{opts.max_restarts})", flush=True)
    elif now >= a.restart_at:
        a.restarts += 1
        a.restart_at = None
        try:
            a.start()
        except OSError as e:  # (fork or exec failed: out of processes or memory) a failed restart
            print(f"[zrl run] cannot restart {a.name}: {e}", flush=True)


def actors_failed(actors: list[Child]) -> tuple[int, str] | None:
    """(exit code, reason) once the run cannot go on: an actor whose config cannot run (every
    actor shares it) or whose hello the learner refused, or every training actor given up
    after its restarts (an evaluation actor or an agent server left running would not feed
    the learner). With no training actors (run.num_actors 0) the agent server is the data
    source: the run fails once it has given up."""
    for a in actors:
        if a.gave_up == EXIT_CONFIG:
            return EXIT_CONFIG, f"{a.name} cannot run with this config (exit code 2, its error above)"
        if a.gave_up == EXIT_REFUSED:
            return EXIT_REFUSED, f"the learner refused {a.name}'s hello (exit code 3, the reason above)"
    training = [a for a in actors if a.name.startswith("actor ")]
    if training and all(a.gave_up is not None for a in training):
        return 1, "every actor failed and reached its restart cap"
    servers = [a for a in actors if a.name == "agent server"]
    if not training and servers and all(a.gave_up is not None for a in servers):
        return 1, "the agent server (the only data source: run.num_actors is 0) failed and reached its restart cap"
    return None
