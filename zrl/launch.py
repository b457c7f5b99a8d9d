"""Process entry points: one learner, one actor, or a whole local run.

`run_local` is `zrl run`: it starts the learner and N actors as child
processes of this one (each in its own session, so a Ctrl-C on the terminal
reaches only this process, which forwards it once), restarts an actor that
dies (with a back-off and a cap), stops every child when the learner exits
or on Ctrl-C, and writes DIR/summary.json. Children get PR_SET_PDEATHSIG, so
even a SIGKILL of this process leaves none behind.
"""
from __future__ import annotations

import ctypes
import io
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from zrl.config import Config

# How long `zrl run`, leaving on an error of its own, waits for the learner to save and exit.
LEARNER_STOP_S = 120.0


def run_learner(cfg: Config, bind: str, logdir, *, resume=False, stop_at_return=None, max_seconds=None, max_env_steps=None, ready_file=None, install_signals: Callable | None = None) -> int:
    from zrl.checkpoint import CheckpointError
    from zrl.learner.learner import Learner

    try:
        learner = Learner(cfg, bind, logdir, resume=resume, stop_at_return=stop_at_return, max_seconds=max_seconds, max_env_steps=max_env_steps)
    except (OSError, CheckpointError, ValueError) as e:
        print(f"[learner] error: {e}", file=sys.stderr, flush=True)
        return 2
    if install_signals is not None:
        install_signals(learner.request_stop)
    _warn_if_exposed("learner", learner.control_endpoint, cfg)
    if ready_file:
        tmp = f"{ready_file}.tmp"
        with open(tmp, "w") as f:
            json.dump({"control": learner.control_endpoint, "trajectory": learner.trajectory_endpoint, "weights": learner.weights_endpoint, "pid": os.getpid()}, f)
        os.replace(tmp, ready_file)
    try:
        result = learner.run()
    finally:
        learner.close()
    if result.stop_reason.startswith("receiver failed"):
        return 1
    return 130 if result.stop_reason == "interrupted" else 0


def run_actor(cfg: Config, learner_endpoint: str, index: int, num_actors: int, seed, install_signals: Callable | None = None, eval_mode: bool = False) -> int:
    from zrl.actors.actor import Actor, HelloError
    from zrl.config import ConfigError

    stop = threading.Event()
    if install_signals is not None:
        install_signals(stop.set)
    try:
        Actor(cfg, learner_endpoint, index, num_actors, seed, stop=stop, eval_mode=eval_mode).run()
    except ConfigError as e:  # e.g. an env id that gymnasium cannot make: a restart would not help
        print(f"[actor {index}] error: {e}", file=sys.stderr, flush=True)
        return 2
    except HelloError as e:
        print(f"[actor {index}] error: {e}", file=sys.stderr, flush=True)
        return 3
    return 130 if stop.is_set() else 0  # stopped by a signal, or told to by the learner


def run_server(cfg: Config, bind: str | None, learner_endpoint: str | None, *, checkpoint_path=None, seed=None, install_signals: Callable | None = None) -> int:
    from zrl.actors.actor import HelloError
    from zrl.checkpoint import CheckpointError
    from zrl.server import AgentServer

    stop = threading.Event()
    if install_signals is not None:
        install_signals(stop.set)
    try:
        server = AgentServer(cfg, bind, learner_endpoint, stop=stop, checkpoint_path=checkpoint_path, seed=seed)
    except (ValueError, CheckpointError) as e:
        print(f"[server] error: {e}", file=sys.stderr, flush=True)
        return 2
    except OSError as e:  # e.g. its port in use: zrl run tries again later
        print(f"[server] error: {e}", file=sys.stderr, flush=True)
        return 1
    _warn_if_exposed("server", server.endpoint, cfg)
    try:
        server.run()
    except HelloError as e:
        print(f"[server] error: {e}", file=sys.stderr, flush=True)
        return 3
    return 0  # stopping on a signal is how a server ends


def _warn_if_exposed(role: str, endpoint: str, cfg: Config) -> None:
    from zrl.transport import is_loopback

    if not is_loopback(endpoint) and not cfg.security.curve:
        print(f"[{role}] warning: bound to {endpoint}, reachable from other machines, without CURVE: "
              "anyone who can reach it can send data and read weights (see docs/DEPLOY.md, security.curve)", file=sys.stderr, flush=True)


@dataclass
class RunOptions:
    config_path: str | None
    overrides: list[str]
    num_actors: int
    seed: int
    logdir: str
    bind: str | None = None
    stop_at_return: float | None = None
    max_seconds: float | None = None
    max_env_steps: int | None = None
    resume: bool = False
    t_start: float = field(default_factory=time.time)
    max_restarts: int = 10  # per actor
    fork: bool = hasattr(os, "fork")  # children forked from this process (fast start) or exec'd
    restart_backoff_s: tuple[float, float] = (0.5, 30.0)  # first delay, cap (doubling)


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the parent dies (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _line_buffered_stdio() -> None:
    """One write per line on stdout and stderr, so the lines of children that share a pipe
    never interleave mid-line. Unbuffered (PYTHONUNBUFFERED), print() writes a line's text
    and its newline in two writes, and another child's line could land between them."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or not isinstance(getattr(stream, "buffer", None), io.FileIO):
            continue
        raw = io.FileIO(stream.fileno(), "w", closefd=False)
        setattr(sys, name, io.TextIOWrapper(io.BufferedWriter(raw), encoding=stream.encoding, errors=stream.errors, line_buffering=True))


class _ForkedProcess:
    """A child made by fork() that runs `zrl ARGS` in-process: the Popen calls run_local needs.

    zrl run imports torch and the rest once, then forks its children, which
    start with all of it loaded instead of each importing it again (three
    processes importing torch at once cost over a second on two cores). The
    parent has started no threads and no ZeroMQ context when it forks.
    """

    def __init__(self, argv: list[str]):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.setsid()
                _die_with_parent()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_DFL)
                _line_buffered_stdio()
                from zrl.cli import main

                main(args=argv, prog_name="zrl", standalone_mode=True)
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
        self.pid = pid
        self.returncode: int | None = None
        try:
            self._pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = None

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


class _Child:
    def __init__(self, name: str, argv: list[str], fork: bool):
        self.name = name
        self.argv = argv  # [python, -m, zrl, COMMAND, ...]
        self.fork = fork
        self.proc: subprocess.Popen | _ForkedProcess | None = None
        self.restarts = 0
        self.restart_at: float | None = None
        self.gave_up: int | None = None  # the exit code after which it is not restarted
        self.on_start = None  # called after each (re)start
        self._stopped = None  # the process stop() signalled

    def start(self) -> None:
        if self.fork:
            self.proc = _ForkedProcess(self.argv[3:])
        else:
            self.proc = subprocess.Popen(self.argv, start_new_session=True, preexec_fn=_die_with_parent)
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


def run_local(cfg: Config, opts: RunOptions) -> int:
    logdir = Path(opts.logdir)
    try:
        logdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"[zrl run] error: cannot use logdir {logdir}: {e.strerror or e}", file=sys.stderr, flush=True)
        return 2
    final_path = logdir / "learner_final.json"
    final_path.unlink(missing_ok=True)
    tmpdir = tempfile.mkdtemp(prefix="zrl-run-")
    bind = opts.bind or f"ipc://{tmpdir}/control"
    base = [sys.executable, "-m", "zrl"]
    cfg_args = (["--config", opts.config_path] if opts.config_path else []) + [a for o in opts.overrides for a in ("-o", o)]
    learner_argv = [*base, "learner", *cfg_args, "--bind", bind, "--logdir", str(logdir), "--seed", str(opts.seed)]
    if opts.stop_at_return is not None:
        learner_argv += ["--stop-at-return", str(opts.stop_at_return)]
    if opts.max_seconds is not None:
        learner_argv += ["--max-seconds", str(opts.max_seconds)]
    if opts.max_env_steps is not None:
        learner_argv += ["--max-env-steps", str(opts.max_env_steps)]
    if opts.resume:
        learner_argv.append("--resume")
    # With a wildcard port the actors can only be told the endpoint once the learner has bound it.
    ready_file = os.path.join(tmpdir, "ready.json") if "*" in bind else None
    if ready_file:
        learner_argv += ["--ready-file", ready_file]
    learner = _Child("learner", learner_argv, opts.fork)

    def actor_argv(i: int, endpoint: str) -> list[str]:
        # The evaluation actor takes the index after the training actors' (its sender id).
        evaluating = i == opts.num_actors
        n = opts.num_actors + 1 if evaluating else opts.num_actors
        argv = [*base, "actor", *cfg_args, "--learner", endpoint, "--index", str(i), "--num-actors", str(n), "--seed", str(opts.seed)]
        return argv + ["--eval"] if evaluating else argv

    names = [f"actor {i}" for i in range(opts.num_actors)] + (["eval actor"] if cfg.run.eval_actor else [])
    actors = [_Child(name, actor_argv(i, bind), opts.fork) for i, name in enumerate(names)]
    if cfg.run.agent_server:
        server_argv = lambda ep: [*base, "serve", *cfg_args, "--learner", ep, "--seed", str(opts.seed)]  # noqa: E731
        actors.append(_Child("agent server", server_argv(bind), opts.fork))
    stopping = threading.Event()
    asked = {"learner": False, "forced": False, "signals": 0}
    failure: tuple[int, str] | None = None  # (exit code, stop reason) when the actors made the run fail

    def ask_learner() -> None:
        # Once: a second SIGINT makes the learner exit without its checkpoint.
        if not asked["learner"] and learner.alive():
            asked["learner"] = True
            learner.signal(signal.SIGINT)

    def on_signal(signum, frame):
        asked["signals"] += 1
        if asked["signals"] == 1 and stopping.is_set():  # already stopping on its own (failed actors)
            print("\n[zrl run] already stopping; a second signal kills the learner and actors", flush=True)
            return
        if stopping.is_set():
            # A second Ctrl-C: the user will not wait for a learner slow to stop.
            if not asked["forced"]:
                asked["forced"] = True
                print("\n[zrl run] second signal: killing the learner and actors now", flush=True)
                for c in children:
                    c.signal(signal.SIGKILL)
            return
        stop_all("\n[zrl run] stopping: asking the learner to checkpoint and exit")

    def stop_all(why: str) -> None:
        stopping.set()
        ask_learner()  # first: nothing below may cost the learner its checkpoint
        for a in actors:
            a.stop()
        print(why, flush=True)

    children = [learner, *actors]

    def write_pids() -> None:
        # LOGDIR/pids.json: which process is which (forked children share zrl run's command line).
        tmp = logdir / ".pids.json.tmp"
        tmp.write_text(json.dumps({c.name: c.proc.pid for c in children if c.proc is not None}, indent=1) + "\n")
        os.replace(tmp, logdir / "pids.json")

    for c in children:
        c.on_start = write_pids
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    extra = (" + a greedy evaluation actor" if cfg.run.eval_actor else "") + (f" + an agent server on {cfg.server.bind}" if cfg.run.agent_server else "")
    print(f"[zrl run] learner + {opts.num_actors} actors{extra} on {cfg.env.id} ({cfg.algo.name}); logdir {logdir}", flush=True)
    try:
        if opts.fork:
            _preload()
        if stopping.is_set():  # Ctrl-C while importing: nothing was started
            print("[zrl run] stopped before the learner started", flush=True)
            return 130
        learner.start()
        if asked["forced"]:  # signals during the start found no learner to ask or kill
            learner.signal(signal.SIGKILL)
        elif stopping.is_set():
            ask_learner()
        if ready_file:
            control = _wait_ready(ready_file, learner, stopping)
            for i, a in enumerate(actors):
                a.argv = server_argv(control or bind) if a.name == "agent server" else actor_argv(i, control or bind)
        for a in actors:
            if not stopping.is_set() and learner.alive():
                a.start()
        while learner.alive():
            _wait_any(learner, 0.1)
            if stopping.is_set():
                continue
            now = time.monotonic()
            for a in actors:
                _supervise_actor(a, now, opts)
            failure = _actors_failed(actors)
            if failure is not None:
                stop_all(f"[zrl run] stopping: {failure[1]}")
        t_end = time.time()
    finally:
        for a in actors:
            a.stop()
        if learner.alive() and not asked["forced"]:
            # Leaving on an error (not a signal, not the learner's own end): it still saves first.
            ask_learner()
            _reap([learner], timeout=LEARNER_STOP_S)
        _reap([learner, *actors], timeout=10.0)
        for s, h in old.items():
            signal.signal(s, h)
        shutil.rmtree(tmpdir, ignore_errors=True)
    crashed = any(a.restarts or a.restart_at is not None or a.gave_up is not None for a in actors)
    code = _summarise(final_path, logdir, opts, t_end, learner.proc.returncode, stop_reason=failure and failure[1], actors_crashed=crashed)
    return failure[0] if failure else 130 if asked["forced"] else code


def _preload() -> None:
    """Imports what every child needs once, before forking them."""
    import gymnasium  # noqa: F401
    import torch  # noqa: F401
    import torch.utils.tensorboard  # noqa: F401

    import zrl.actors.actor  # noqa: F401
    import zrl.learner.learner  # noqa: F401
    import zrl.server  # noqa: F401


def _wait_ready(path: str, learner: _Child, stopping: threading.Event) -> str | None:
    """The learner's bound control endpoint, once it has written its ready file."""
    while learner.alive() and not stopping.is_set():
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)["control"]
        _wait_any(learner, 0.05)
    return None


def _wait_any(learner: _Child, timeout: float) -> None:
    try:
        learner.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass


def _supervise_actor(a: _Child, now: float, opts: RunOptions) -> None:
    if a.proc is None or a.alive() or a.gave_up is not None:
        return
    if a.restart_at is None:
        code = a.proc.returncode
        if code == 0:
            return  # finished on its own (the learner said shutdown)
        if code in (2, 3):  # its config cannot run, or the learner refused its hello (it said
            a.gave_up = code  # why): a restart would fail the same way
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


def _actors_failed(actors: list[_Child]) -> tuple[int, str] | None:
    """(exit code, reason) once the run cannot go on: an actor whose config cannot run (every
    actor shares it) or whose hello the learner refused, or every training actor given up
    after its restarts (an evaluation
    actor or an agent server left running would not feed the learner). With no training
    actors (run.num_actors 0) the agent server is the data source: the run fails once it
    has given up."""
    for a in actors:
        if a.gave_up == 2:
            return 2, f"{a.name} cannot run with this config (exit code 2, its error above)"
        if a.gave_up == 3:
            return 3, f"the learner refused {a.name}'s hello (exit code 3, the reason above)"
    training = [a for a in actors if a.name.startswith("actor ")]
    if training and all(a.gave_up is not None for a in training):
        return 1, "every actor failed and reached its restart cap"
    servers = [a for a in actors if a.name == "agent server"]
    if not training and servers and all(a.gave_up is not None for a in servers):
        return 1, "the agent server (the only data source: run.num_actors is 0) failed and reached its restart cap"
    return None


def _reap(children: list[_Child], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for c in children:
        if c.proc is None:
            continue
        try:
            c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait()


def _summarise(final_path: Path, logdir: Path, opts: RunOptions, t_end: float, learner_code: int | None, stop_reason: str | None = None,
               actors_crashed: bool = False) -> int:
    wall = t_end - opts.t_start
    final = {}
    if final_path.exists():
        try:
            final = json.loads(final_path.read_text())
        except ValueError:
            final = {}
    steps = int(final.get("env_steps", 0))
    run_steps = steps - int(final.get("resumed_env_steps", 0))  # this run's, after a --resume
    reached_unix = final.get("reached_at_unix")
    summary = {
        "started_at_unix": round(opts.t_start, 3),  # (wall_s and time_to_target_s count from here)
        "wall_s": round(wall, 3),
        "time_to_target_s": round(reached_unix - opts.t_start, 3) if reached_unix else None,
        "env_steps": steps,
        "env_steps_this_run": run_steps,
        "env_steps_per_s": round(run_steps / wall, 1) if wall > 0 else 0.0,
        "final_mean_return": final.get("final_mean_return"),
        "reached": bool(final.get("reached", False)),
        "stop_at_return": opts.stop_at_return,
        "updates": final.get("updates"),
        "episodes": final.get("episodes"),
        "stop_reason": stop_reason or final.get("stop_reason", "learner failed"),
        "return_source": final.get("return_source", "train"),
        "num_actors": opts.num_actors,
        "seed": opts.seed,
        "learner_exit_code": learner_code,
    }
    tmp = logdir / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, logdir / "summary.json")
    ret = summary["final_mean_return"]
    ret_s = f"{ret:.1f}" if isinstance(ret, (int, float)) else "-"
    if summary["return_source"] == "eval":
        ret_s += " (greedy evaluation actor)"
    target = f" (target {opts.stop_at_return:g}: {'reached' if summary['reached'] else 'not reached'})" if opts.stop_at_return is not None else ""
    print(
        f"[zrl run] {summary['stop_reason']}: {wall:.1f}s wall, {steps:,} env steps"
        f"{f' ({run_steps:,} in this run)' if run_steps != steps else ''} ({summary['env_steps_per_s']:,.0f}/s), "
        f"mean return {ret_s}{target}; summary in {logdir / 'summary.json'}",
        flush=True,
    )
    if learner_code is not None and learner_code < 0:  # killed by a signal
        return 128 - learner_code
    if learner_code == 0 and summary["stop_reason"] == "time limit" and run_steps == 0 and actors_crashed:
        # Out of time with nothing trained, while actors crashed and were restarted: a failure.
        # (With none crashed: a limit shorter than the start-up, or no client of a serve-only run.)
        print("[zrl run] no env steps in this run: the actors kept failing (their errors are above)", file=sys.stderr, flush=True)
        return 1
    return 0 if learner_code == 0 else (learner_code or 1)
