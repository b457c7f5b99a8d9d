"""Replay buffers for off-policy learners, backed by C++ (csrc/replay/).

`PrioritizedReplay` samples transitions in proportion to p**alpha with
stratified draws and returns importance weights (Schaul et al. 2016);
`UniformReplay` samples uniformly. Both store declared fields in
preallocated columns, evict first-in first-out, are safe to share between a
receiver thread that adds and a learner thread that samples (the C++ side
holds one mutex per buffer and releases the GIL), and export their full state
as a dict of numpy arrays for checkpoints.
"""
from __future__ import annotations

from zrl.replay.buffers import FieldSpecs, PrioritizedReplay, UniformReplay

__all__ = ["FieldSpecs", "PrioritizedReplay", "UniformReplay"]
