"""The process entry points of `zrl learner`, `zrl actor` and `zrl serve`: each builds its
role's object from a config, runs it until it stops, and returns the exit code the command
exits with (which `zrl run` reads to decide whether to restart it: see supervisor.py).

This module imports nothing heavy itself, so that `zrl --help` stays fast; each entry point
imports its role (and torch with it) when it runs.
"""
from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Callable

from zrl.config import Config, ConfigError
from zrl.launch import rundir
from zrl.protocol.endpoints import is_loopback

# Exit codes a restart would not change: the config cannot run, or the learner refused the hello.
EXIT_CONFIG = 2
EXIT_REFUSED = 3


def run_learner(cfg: Config, bind: str, logdir, *, resume=False, stop_at_return=None, max_seconds=None, max_env_steps=None, ready_file=None,
                install_signals: Callable | None = None, own_logdir: bool = False, rank: int = 0, dist_url: str | None = None) -> int:
    """own_logdir: this learner readies LOGDIR itself, as `zrl run` does for its learner (an
    earlier run moved aside unless resuming; config.yaml written once the learner has taken
    the config and any checkpoint, so that a refused resume writes nothing). With
    learner.num_learners > 1 it is member `rank` of the group that meets at `dist_url`."""
    from zrl.checkpoint import CheckpointError  # lazy: imports torch
    from zrl.learner.learner import Learner  # lazy: imports torch

    group = None
    try:
        if own_logdir and not resume and rank == 0:
            moved = rundir.make_room(Path(logdir))
            if moved is not None:
                print(f"[learner] {logdir} held an earlier run: moved it to {moved} (--resume continues a run instead)", flush=True)
        group = join_group(cfg, rank, dist_url)
        learner = Learner(cfg, bind, logdir, resume=resume, stop_at_return=stop_at_return, max_seconds=max_seconds, max_env_steps=max_env_steps,
                          group=group)
    except (OSError, CheckpointError, ValueError, RuntimeError) as e:  # (rundir.RunDirError and ConfigError are ValueErrors;
        # RuntimeError: a group whose members did not all come within learner.group_timeout_s)
        print(f"[learner] error: {e}", file=sys.stderr, flush=True)
        if group is not None:
            group.close()
        return EXIT_CONFIG
    try:
        if own_logdir and rank == 0:  # (the other learners of a group share learner 0's LOGDIR, and only read it)
            rundir.save_config(Path(logdir), cfg)
    except OSError as e:
        learner.close()
        print(f"[learner] error: cannot write {Path(logdir) / rundir.CONFIG_FILE}: {e.strerror or e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    if install_signals is not None:
        install_signals(learner.request_stop)
    warn_if_exposed("learner", {"control": learner.control_endpoint, "trajectory": learner.trajectory_endpoint,
                                "weights": learner.weights_endpoint}, cfg)
    if ready_file:
        write_ready_file(ready_file, learner)
    try:
        result = learner.run()
    finally:
        learner.close()
        if group is not None:
            group.close()
    if result.stop_reason.startswith("receiver failed"):
        return 1
    return 130 if result.stop_reason == "interrupted" else 0


def join_group(cfg: Config, rank: int, dist_url: str | None):
    """This learner's membership of its group (learner.num_learners > 1), or None."""
    n = cfg.learner.num_learners
    if n == 1:
        return None
    if dist_url is None:
        raise ValueError(f"learner.num_learners is {n}: each learner needs --rank and --dist-url (zrl run gives them)")
    if not 0 <= rank < n:
        raise ValueError(f"--rank {rank} outside [0, learner.num_learners {n})")
    from zrl.learner.group import LearnerGroup  # lazy: imports torch

    return LearnerGroup(rank, n, dist_url, timeout_s=cfg.learner.group_timeout_s)


def write_ready_file(path: str, learner) -> None:
    """The learner's bound endpoints as JSON, written whole (a reader never sees half of it)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"control": learner.control_endpoint, "trajectory": learner.trajectory_endpoint, "weights": learner.weights_endpoint, "pid": os.getpid()}, f)
    os.replace(tmp, path)


def run_actor(cfg: Config, learner_endpoint: str, index: int, num_actors: int, seed, install_signals: Callable | None = None, eval_mode: bool = False) -> int:
    from zrl.actors.actor import Actor, HelloError  # lazy: imports torch

    stop = threading.Event()
    if install_signals is not None:
        install_signals(stop.set)
    try:
        Actor(cfg, learner_endpoint, index, num_actors, seed, stop=stop, eval_mode=eval_mode).run()
    except ConfigError as e:  # e.g. an env id that gymnasium cannot make: a restart would not help
        print(f"[actor {index}] error: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except HelloError as e:
        print(f"[actor {index}] error: {e}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    return 130 if stop.is_set() else 0  # stopped by a signal, or told to by the learner


def run_server(cfg: Config, bind: str | None, learner_endpoint: str | None, *, checkpoint_path=None, seed=None, logdir=None,
               install_signals: Callable | None = None) -> int:
    from zrl.actors.actor import HelloError  # lazy: imports torch
    from zrl.checkpoint import CheckpointError  # lazy: imports torch
    from zrl.server import AgentServer  # lazy: imports torch

    stop = threading.Event()
    if install_signals is not None:
        install_signals(stop.set)
    try:
        server = AgentServer(cfg, bind, learner_endpoint, stop=stop, checkpoint_path=checkpoint_path, seed=seed, logdir=logdir)
    except (ValueError, CheckpointError) as e:
        print(f"[server] error: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except OSError as e:  # e.g. its port in use: zrl run tries again later
        print(f"[server] error: {e}", file=sys.stderr, flush=True)
        return 1
    warn_if_exposed("server", {"client": server.endpoint}, cfg)
    try:
        server.run()
    except HelloError as e:
        print(f"[server] error: {e}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    return 0  # stopping on a signal is how a server ends


def warn_if_exposed(role: str, endpoints: dict[str, str], cfg: Config) -> None:
    """A warning on stderr for each of the role's binds ({socket name: bound endpoint}) that
    other machines can reach without CURVE: each is bound on its own (learner.trajectory_bind,
    learner.weights_bind), so a loopback control endpoint says nothing of the others."""
    if cfg.security.curve:
        return
    for name, endpoint in endpoints.items():
        if not is_loopback(endpoint):
            print(f"[{role}] warning: {name} socket bound to {endpoint}, reachable from other machines, without CURVE: "
                  "anyone who can reach it can send data and read weights (see docs/DEPLOY.md, security.curve)", file=sys.stderr, flush=True)
