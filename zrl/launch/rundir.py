"""A run's directory: which one it is, what becomes of an earlier run found there, and the
config the run keeps in it.

`zrl run` and `zrl learner` write a run to one directory: `--logdir DIR`, or else a new
directory named after the UTC time under run.logdir (runs/<config file's name> when
unset). A fresh run in a DIR that holds an earlier run first moves all of it (events,
checkpoints, summary, config.yaml, logs) to DIR/previous-<UTC time>/, so TensorBoard shows
each run as a curve of its own and nothing loads another run's checkpoints. `--resume`
continues DIR in place, with the config the run saved there (config.yaml: every key
resolved) and only this command line's overrides on top.

Import-light (no torch): the cli resolves the run's directory before anything starts.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from zrl.config import Config, config_differences, default_config_path, dump_config

CONFIG_FILE = "config.yaml"
PREVIOUS = "previous-"
# What zrl leaves in a run's directory. A non-empty DIR with none of these is not a run: a
# fresh run refuses it rather than moving someone's files aside.
RUN_MARKERS = ("config.yaml", "summary.json", "learner_final.json", "pids.json", "checkpoints")
CONFIG_HEADER = ("The config this run used: its config file with the command line's overrides, every key resolved.\n"
                 "`--resume` starts from it (with that command's overrides on top).")
# Keys that say where a run goes, not what it trains: a resume's --config may differ in them.
PLACE_KEYS = ("run.logdir",)


class RunDirError(ValueError):
    """A run directory that cannot be used as asked (exit code 2, as a bad config)."""


def utc_stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def runs_root(cfg: Config, config_path: str | None) -> Path:
    """Where runs of this config go: run.logdir, else runs/<config file's name>."""
    if cfg.run.logdir:
        return Path(cfg.run.logdir)
    return Path("runs") / Path(config_path or default_config_path()).stem


def new_run_dir(root: Path) -> Path:
    """A new, empty directory root/<UTC time>/ (with -N appended if another run has that second)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        return _claim(root, utc_stamp())
    except OSError as e:
        raise RunDirError(f"cannot make a run directory in {root}: {e.strerror or e}") from None


def newest_run(root: Path) -> Path:
    """The newest run directory under root, for `--resume` without `--logdir`."""
    runs = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not runs:
        raise RunDirError(f"--resume: no earlier run in {root}/ (where runs of this config go without --logdir); "
                          "give --logdir DIR, the directory of the run to continue")
    return runs[-1]


def _claim(parent: Path, name: str) -> Path:
    """Creates parent/name (or name-1, name-2, ...: the first free one) and returns it."""
    for n in range(1000):
        path = parent / (name if n == 0 else f"{name}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise RunDirError(f"cannot find a free name for {parent / name}")


def make_room(logdir: Path) -> Path | None:
    """Moves an earlier run found in logdir (everything but earlier previous-* folders) into
    logdir/previous-<UTC time>/ and returns that; None if there was none. A directory holding
    files but no zrl run is refused (RunDirError), not emptied."""
    try:
        logdir.mkdir(parents=True, exist_ok=True)
        entries = [p for p in logdir.iterdir() if not (p.name.startswith(PREVIOUS) and p.is_dir())]
        if not entries:
            return None
        if not any(_is_marker(p.name) for p in entries):
            raise RunDirError(f"{logdir} is not empty and holds no zrl run (no {', '.join(RUN_MARKERS)} or TensorBoard events): "
                              "give --logdir an empty or new directory")
        dest = _claim(logdir, PREVIOUS + utc_stamp())
        for p in entries:
            os.rename(p, dest / p.name)
    except OSError as e:
        raise RunDirError(f"cannot use logdir {logdir}: {e.strerror or e}") from None
    return dest


def _is_marker(name: str) -> bool:
    return name in RUN_MARKERS or name.startswith(("events.out.tfevents", "checkpoints-"))


def save_config(logdir: Path, cfg: Config) -> Path:
    """Writes logdir/config.yaml whole (a reader never sees half of it)."""
    path = logdir / CONFIG_FILE
    tmp = logdir / f".{CONFIG_FILE}.tmp"
    tmp.write_text(dump_config(cfg, CONFIG_HEADER))
    os.replace(tmp, path)
    return path


def resume_config(logdir: Path, config_path: str | None, load: Callable[[str | None], Config],
                  say: Callable[[str], None]) -> Config:
    """The config a `--resume` of logdir continues with: the run's config.yaml, loaded by
    `load` (which puts this command line's overrides on top). A --config that differs from it
    is refused, naming the keys: the run's own config is what its checkpoints were trained
    with. A run without config.yaml (an older zrl's, or none yet) takes this command line's."""
    stored = logdir / CONFIG_FILE
    if not stored.exists():
        if logdir.is_dir() and any(logdir.iterdir()):
            say(f"{logdir} has no {CONFIG_FILE} (a run of an older zrl): resuming with this command line's config")
        return load(config_path)
    cfg = load(str(stored))
    if config_path is not None:
        diffs = config_differences(cfg, load(config_path), ignore=PLACE_KEYS)
        if diffs:
            raise RunDirError(_differs(stored, config_path, diffs))
    say(f"resuming {logdir} with its config ({stored})")
    return cfg


def _differs(stored: Path, config_path: str, diffs: list) -> str:
    shown = "; ".join(f"{key}: the run's {ours!r}, --config's {theirs!r}" for key, ours, theirs in diffs[:5])
    more = f"; and {len(diffs) - 5} more" if len(diffs) > 5 else ""
    return (f"--resume continues a run with its own config ({stored}), and --config {config_path} (with this command "
            f"line's overrides) differs from it: {shown}{more}. Leave out --config, and give -o SECTION.KEY=VALUE "
            "for a key you mean to change; or start a fresh run without --resume")
