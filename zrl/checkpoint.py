"""Atomic checkpoints with resume from the newest complete one.

A checkpoint is one torch file (loaded with weights_only=True: tensors and
plain containers, no arbitrary objects) holding the model, optimiser and
algorithm state, the counters, the config, the specs, a format version and
the hash of what shapes the model. It is written to a temporary file in the
same directory and renamed over, so a kill mid-write leaves the previous
checkpoint intact; the last K are kept. A fresh run (not --resume) first moves
an earlier run's checkpoints aside (`set_aside`), so every checkpoint in the
directory belongs to one run.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("zrl.checkpoint")

FORMAT_VERSION = 1
_NAME = re.compile(r"^ckpt-(\d{12})\.pt$")


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
    state = {"format_version": FORMAT_VERSION, **state}
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".tmp", dir=ckdir)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        final = path_for(ckdir, updates)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    for old in list_checkpoints(ckdir)[:-keep]:
        try:
            old.unlink()
        except OSError:
            pass
    for stale in ckdir.glob(".ckpt-*.tmp"):  # left by a process killed mid-write
        if stale.name != os.path.basename(tmp):
            try:
                stale.unlink()
            except OSError:
                pass
    return final


def set_aside(ckdir: Path) -> Path | None:
    """Moves a checkpoint directory that holds checkpoints (of an earlier run) to a sibling
    named after the time, and returns it; None if there was nothing to move.

    Checkpoints are ordered by update count, so a new run writing beside an older one's
    would have its own pruned first, and --resume, `zrl eval` and `zrl serve` would load the
    older run's. A fresh run calls this before its first save: nothing is deleted."""
    if not list_checkpoints(ckdir):
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
    theirs = state["model_shaping"]
    diffs = []
    for key in sorted(set(theirs) | set(shaping)):
        if theirs.get(key) != shaping.get(key):
            diffs.append(f"{key}: checkpoint has {theirs.get(key)!r}, config has {shaping.get(key)!r}")
    raise CheckpointError(f"{path} was written for a different model and cannot be resumed: " + "; ".join(diffs or ["model hash differs"]))


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
