"""Atomic checkpoints with resume from the newest complete one.

A checkpoint is one torch file (loaded with weights_only=True: tensors and
plain containers, no arbitrary objects) holding the model, optimiser and
algorithm state, the counters, the config, the specs, a format version and
the hash of what shapes the model. It is written to a temporary file in the
same directory and renamed over, so a kill mid-write leaves the previous
checkpoint intact; the last K are kept, and besides them `best.pt`, the one
saved with the highest mean return (`mark_best`; `load_latest` never picks
it, so --resume continues from the newest). A fresh run (not --resume) first moves
an earlier run's checkpoints aside (`set_aside`; `zrl run` and `zrl learner` move
the whole earlier run, zrl.launch.rundir), so every checkpoint in the directory
belongs to one run.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("zrl.checkpoint")

FORMAT_VERSION = 1
_NAME = re.compile(r"^ckpt-(\d{12})\.pt$")
BEST_NAME = "best.pt"  # the checkpoint saved with the highest mean return (not matched by _NAME)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: corrupt, another format, or another model."""


def path_for(ckdir: Path, updates: int) -> Path:
    return ckdir / f"ckpt-{updates:012d}.pt"


def list_checkpoints(ckdir: Path) -> list[Path]:
    """Complete checkpoints (not temporaries), oldest first."""
    if not ckdir.is_dir():
        return []
    return sorted(p for p in ckdir.iterdir() if _NAME.match(p.name))


def save(ckdir: Path, updates: int, state: dict[str, Any], keep: int) -> Path:
    ckdir.mkdir(parents=True, exist_ok=True)
    final = path_for(ckdir, updates)
    _write_atomic(final, {"format_version": FORMAT_VERSION, **state})
    for old in list_checkpoints(ckdir)[:-keep]:
        try:
            old.unlink()
        except OSError:
            pass
    for stale in ckdir.glob(".ckpt-*.tmp"):  # left by a process killed mid-write
        try:
            stale.unlink()
        except OSError:
            pass
    return final


def _write_atomic(final: Path, state: dict[str, Any]) -> None:
    """Writes `state` to a temporary file beside `final` and renames it over."""
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".tmp", dir=final.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def best_path(ckdir: Path) -> Path:
    return ckdir / BEST_NAME


def mark_best(saved: Path) -> Path:
    """Makes the checkpoint just written at `saved` its directory's best.pt, replaced atomically.

    A hard link shares the file's bytes (pruning `saved` later leaves best.pt whole); a
    filesystem without hard links gets a copy."""
    best = best_path(saved.parent)
    tmp = saved.parent / f".ckpt-best-{os.getpid()}.tmp"
    try:
        tmp.unlink(missing_ok=True)
        try:
            os.link(saved, tmp)
        except OSError:
            shutil.copyfile(saved, tmp)
            with open(tmp, "rb") as f:  # (durable before the rename, as the checkpoint itself is)
                os.fsync(f.fileno())
        os.replace(tmp, best)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return best


def best_return(ckdir: Path) -> float | None:
    """The mean return best.pt was saved with; None without a readable one."""
    path = best_path(ckdir)
    if not path.is_file():
        return None
    try:
        value = load(path).get("mean_return")
    except CheckpointError as e:
        log.warning("ignoring the best checkpoint: %s", e)
        return None
    return float(value) if value is not None else None


def set_aside(ckdir: Path) -> Path | None:
    """Moves a checkpoint directory that holds checkpoints (of an earlier run) to a sibling
    named after the time, and returns it; None if there was nothing to move.

    Checkpoints are ordered by update count, so a new run writing beside an older one's
    would have its own pruned first, and --resume, `zrl eval` and `zrl serve` would load the
    older run's. A fresh run calls this before its first save: nothing is deleted."""
    if not list_checkpoints(ckdir) and not best_path(ckdir).exists():
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for n in range(1000):
        dest = ckdir.with_name(f"{ckdir.name}-{stamp}" + (f"-{n}" if n else ""))
        try:
            ckdir.rename(dest)  # fails on an existing, non-empty dest (and it would not be empty)
        except OSError:
            if dest.exists():
                continue
            raise
        return dest
    raise CheckpointError(f"cannot find a free name to move {ckdir} aside")


def load(path: Path) -> dict[str, Any]:
    """Loads one checkpoint file; CheckpointError if it is corrupt or of another format."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a damaged file
        # The weights-only loader's text advises weights_only=False (running whatever the
        # file holds): keep only what it found.
        m = re.search(r"WeightsUnpickler error:\s*(.+?)\s*(\n\n|$)", str(e), re.S)
        if m:
            raise CheckpointError(f"{path}: not a zrl checkpoint: damaged, or holding more than tensors and plain data ({m.group(1)})") from None
        raise CheckpointError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        got = state.get("format_version") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path}: checkpoint format {got!r}, this zrl reads {FORMAT_VERSION}")
    for key in ("model_hash", "model_shaping", "model", "optimizer", "counters", "config"):
        if key not in state:
            raise CheckpointError(f"{path}: missing {key!r}, not a complete zrl checkpoint")
    return state


def check_compatible(path: Path, state: dict[str, Any], model_hash: str, shaping: dict[str, Any]) -> None:
    """Refuses a checkpoint whose model differs from the config's, saying what differs."""
    if state["model_hash"] == model_hash:
        return
    diffs = shaping_differences(state["model_shaping"], shaping, ("checkpoint", "config"))
    raise CheckpointError(f"{path} was written for a different model and cannot be resumed: " + "; ".join(diffs or ["model hash differs"]))


def shaping_differences(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str] = ("the model", "the config")) -> list[str]:
    """What differs between two `Config.model_shaping`s, one line each ("key: A has x, B has y")."""
    norm = lambda v: json.loads(json.dumps(v))  # noqa: E731 (tuples and lists alike, as torch.save keeps either)
    return [f"{key}: {names[0]} has {a.get(key)!r}, {names[1]} has {b.get(key)!r}"
            for key in sorted(set(a) | set(b)) if norm(a.get(key)) != norm(b.get(key))]


def weight_differences(expected: dict[str, tuple], got: dict[str, tuple]) -> list[str]:
    """How the weights' {name: shape} differ from those a model of the config has (at most 3 named)."""
    diffs = [f"{k}: the config's model has {expected.get(k)}, the weights {got.get(k)}"
             for k in sorted(set(expected) | set(got)) if expected.get(k) != got.get(k)]
    return diffs[:3] + ([f"and {len(diffs) - 3} more tensors"] if len(diffs) > 3 else [])


def algo_changes(state: dict[str, Any], config) -> list[tuple[str, Any, Any]]:
    """(key, checkpoint's value, config's value) for each algorithm hyper-parameter that
    differs from the checkpoint's run. Resuming with them is allowed (the learner warns):
    some change what the trained nets mean (algo.discount, algo.reward_scale). A setting the
    checkpoint's config lacks (added to zrl since) had its default then."""
    return _changes(state, config, "algo")


def optimizer_of(state: dict[str, Any]) -> str:
    """The checkpoint's learner.optimizer (its state carries over only to the same one)."""
    return state["config"].get("learner", {}).get("optimizer", "adam")


def optimizer_changes(state: dict[str, Any], config) -> list[tuple[str, Any, Any]]:
    """(key, checkpoint's value, config's value) for each setting of the config's optimiser
    (learner.learning_rate, learner.<optimizer>_*) that differs from the checkpoint's run
    (the learner says so; the config's apply)."""
    prefix = f"{config.learner.optimizer}_"
    return [c for c in _changes(state, config, "learner") if c[0] == "learning_rate" or c[0].startswith(prefix)]


def _changes(state: dict[str, Any], config, section: str) -> list[tuple[str, Any, Any]]:
    ours = config.to_dict()[section]
    theirs = {**dataclasses.asdict(type(getattr(config, section))()), **state["config"].get(section, {})}
    norm = lambda v: list(v) if isinstance(v, tuple) else v  # noqa: E731 (YAML and torch.save give lists)
    return [(k, theirs.get(k), v) for k, v in ours.items() if norm(theirs.get(k)) != norm(v)]


def load_latest(ckdir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads; damaged ones are skipped with a warning."""
    for path in reversed(list_checkpoints(ckdir)):
        try:
            return path, load(path)
        except CheckpointError as e:
            log.warning("skipping checkpoint: %s", e)
    return None


def checkpoint_folder(p: Path) -> Path:
    """Where a folder's checkpoints are: in LOGDIR/checkpoints, in the folder itself, or, for a
    folder of runs (run.logdir, whose runs are named by their start time), in its newest run's."""
    if (p / "checkpoints").is_dir():
        return p / "checkpoints"
    if list_checkpoints(p) or best_path(p).is_file():
        return p
    runs = sorted(d for d in p.iterdir() if (d / "checkpoints").is_dir())
    return runs[-1] / "checkpoints" if runs else p


def find(path: str | Path, best: bool = False) -> tuple[Path, dict[str, Any]]:
    """(file, loaded state) of the checkpoint a command was pointed at: a file as is; a logdir,
    a checkpoints folder or a folder of runs (`checkpoint_folder`) gives its newest checkpoint,
    or with `best` its best.pt. FileNotFoundError or CheckpointError, saying what to give."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder (give a run's logdir, a checkpoints folder, a .pt file or a folder of runs)")
    if not path.is_dir():
        if best:
            raise CheckpointError(f"{path} is a file: --best picks the best checkpoint of a logdir")
        if not zipfile.is_zipfile(path):  # (torch.load's own error on other files says little)
            raise CheckpointError(f"{path}: not a zrl checkpoint (those are torch .pt files, as runs write in LOGDIR/checkpoints)")
        return path, load(path)
    folder = checkpoint_folder(path)
    if best:
        if best_path(folder).is_file():
            return best_path(folder), load(best_path(folder))
        raise CheckpointError(f"no best checkpoint ({BEST_NAME}) in {path}: one is written with the first checkpoint "
                              "saved after an episode has ended")
    found = load_latest(folder)
    if found is None:
        raise CheckpointError(f"{path}: no checkpoint in it (looked for ckpt-*.pt files that load in {folder})")
    return found
