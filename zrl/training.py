"""`zrl.train`: `zrl run` from Python. The same pipeline (a learner and actor processes under
zrl.launch's Supervisor), the same run directories and summary.json, and the learner's
progress records (LOGDIR/progress.jsonl) passed to a callback as they come.

(The module is not zrl/train.py: importing a submodule binds its name on the package, and
`zrl.train` would then be the module rather than the function.)
"""
from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from zrl.config import Config, load_config, resolve_config_path
from zrl.launch import rundir
from zrl.launch.options import RunOptions, check_something_feeds_the_learner
from zrl.launch.supervisor import Supervisor


@dataclass(frozen=True)
class RunResult:
    """What a `zrl.train` run did: its summary.json, its directory, its exit code (that of
    `zrl run`: 0 ended on its own, 130 interrupted, ...), and whether Ctrl-C stopped it."""

    summary: dict
    logdir: Path
    exit_code: int
    interrupted: bool

    @property
    def mean_return(self) -> float | None:
        return self.summary.get("final_mean_return")

    @property
    def env_steps(self) -> int:
        return self.summary.get("env_steps", 0)

    @property
    def reached(self) -> bool:
        """Whether the mean return reached the run's stop_at_return target."""
        return bool(self.summary.get("reached"))


def train(config: str | Path, *, logdir: str | Path | None = None, seed: int | None = None, max_seconds: float | None = None,
          max_env_steps: int | None = None, stop_at_return: float | None = None, overrides: Iterable[str] = (),
          callback: Callable[[dict], object] | None = None) -> RunResult:
    """Trains `config` (a YAML file, or a shipped config's name such as "cartpole_impala") as
    `zrl run` does, and returns when the run ends.

    logdir: the run's directory (default: runs/<config name>/<UTC time>/). seed, max_seconds,
    max_env_steps, stop_at_return: the run.* keys of the same names. overrides: "section.key=value"
    strings, as `-o`. callback(progress): called in this thread with each progress record of the
    learner (a dict: env_steps, steps_per_s, updates, mean_return, elapsed_s, ...; a record of a
    learner waiting for data has waiting_for instead of the rates and returns). Returning False
    stops the run cleanly, as Ctrl-C does (stop_reason "stopped by the progress callback", exit
    code 130); an exception it raises stops the run the same way, then is raised here.

    Ctrl-C (from the main thread) stops the run cleanly: the learner checkpoints, summary.json is
    written, and the result comes back with interrupted=True. A second Ctrl-C kills the learner
    and actors and raises KeyboardInterrupt. Raises ConfigError for a bad config or override.
    """
    if isinstance(overrides, str):
        raise TypeError("overrides: a list of 'section.key=value' strings, not one string")
    path = resolve_config_path(config)
    flags = {"run.seed": seed, "run.max_seconds": max_seconds, "run.max_env_steps": max_env_steps, "run.stop_at_return": stop_at_return}
    cfg = load_config(path, [*overrides, *(f"{key}={value!r}" for key, value in flags.items() if value is not None)])
    check_something_feeds_the_learner(cfg)  # (before a run directory is made)
    run_dir = Path(logdir) if logdir is not None else rundir.new_run_dir(rundir.runs_root(cfg, str(path)))
    guard = _Callback(callback)
    supervisor = Supervisor(cfg, _options(cfg, run_dir), on_progress=guard)
    code = supervisor.run()
    if guard.error is not None:
        raise guard.error
    if supervisor.forced:
        raise KeyboardInterrupt
    return RunResult(_summary(run_dir, code), run_dir, code, interrupted=supervisor.signals > 0)


def _options(cfg: Config, run_dir: Path) -> RunOptions:
    run = cfg.run
    # The children's output comes through this process: a notebook's cell shows it.
    return RunOptions(num_actors=run.num_actors, seed=run.seed, logdir=str(run_dir), stop_at_return=run.stop_at_return,
                      max_seconds=run.max_seconds, max_env_steps=run.max_env_steps, fork=_can_fork(), relay=True)


def _can_fork() -> bool:
    """Whether the children may be forked from this process (a start without importing torch
    again in each), as `zrl run` does: not where another thread (a notebook kernel's, say)
    could hold a lock a child would need, nor once CUDA is initialised, which a fork breaks."""
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return False
    torch = sys.modules.get("torch")
    return torch is None or not torch.cuda.is_initialized()


def _summary(run_dir: Path, code: int) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        raise RuntimeError(f"zrl.train: the run in {run_dir} did not start (exit code {code}); the reason is printed above") from None


class _Callback:
    """The user's callback as the Supervisor calls it: an exception it raises stops the run
    (returning False) and is kept to be raised once the run has stopped cleanly."""

    def __init__(self, fn: Callable[[dict], object] | None):
        self.fn = fn
        self.error: Exception | None = None

    def __call__(self, record: dict) -> object:
        if self.fn is None or self.error is not None:
            return None
        try:
            return self.fn(record)
        except Exception as e:  # noqa: BLE001 - any error of the user's: the run stops, then it is raised
            self.error = e
            return False
