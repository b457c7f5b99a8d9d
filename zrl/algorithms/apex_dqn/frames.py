"""Stacked frames sent and stored once (Ape-X on Atari).

An Atari observation is a stack of S frames (uint8 [S, H, W]), and consecutive
stacks of one env share S-1 of them; an n-step transition holds two stacks.
Stored whole, a Pong transition takes 2 x 4 x 84 x 84 bytes (56 KB) for about one
new frame (7 KB). Here an actor's message carries each distinct frame of its
transitions once (`split_frames`), with per-transition indices into them, and the
learner appends those frames to a `FrameRing` and keeps frame ids in the
prioritised replay (`FrameReplay`), gathering stacks only for a sampled batch.

Frames are matched by content, so the encoding is exact for any env: nothing
assumes how an env stacks, resets or pads.
"""
from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np

from zrl import spaces
from zrl.replay import PrioritizedReplay

FRAMES_PER_TRANSITION = 1.5
"""FrameReplay's frame ring holds this many frames per transition of capacity. An Atari
actor's message of T steps of K envs needs about (T + S - 1 + n) K frames for its T K
transitions (1.3 for T 20, S 4, n 3); a transition whose frames have nonetheless left
the ring (a sender of mostly distinct frames) is dropped from its batch, and counted."""


def is_frame_stack(spec: spaces.Spec) -> bool:
    """Observations that are stacks of 8-bit frames: uint8 [S, H, W] with S > 1."""
    return isinstance(spec, spaces.BoxSpec) and np.dtype(spec.dtype) == np.uint8 and len(spec.shape) == 3 and spec.shape[0] > 1


def split_frames(obs: np.ndarray, next_obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(frames [M, H, W], obs_frames [N, S], next_frames [N, S]) with
    frames[obs_frames[i]] == obs[i] and frames[next_frames[i]] == next_obs[i]: each
    distinct frame of the 2 N stacks once, in order of first appearance."""
    n, s = obs.shape[:2]
    rows = np.concatenate([obs.reshape(n * s, -1), next_obs.reshape(n * s, -1)])
    _, keep, ids = np.unique(_fingerprints(rows), return_index=True, return_inverse=True)
    # In order of first appearance, as transitions are: the ring then drops a message's
    # frames oldest first, with the transitions that the replay drops first.
    order = np.argsort(keep)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    keep, ids = keep[order], rank[ids.reshape(-1)]
    dup = np.flatnonzero(keep[ids] != np.arange(len(rows)))
    if not np.array_equal(rows[keep[ids[dup]]], rows[dup]):  # two distinct frames with one fingerprint
        keep, ids = _distinct_rows(rows)
    frames = rows[keep].reshape(len(keep), *obs.shape[2:])
    ids = ids.astype(np.int64).reshape(2, n, s)
    return frames, ids[0], ids[1]


def _distinct_rows(rows: np.ndarray) -> tuple[list[int], np.ndarray]:
    """(the first row of each distinct content, each row's index among those), by the bytes."""
    first: dict[bytes, int] = {}
    ids = np.empty(len(rows), np.int64)
    keep: list[int] = []
    for i, row in enumerate(rows):
        j = first.setdefault(row.tobytes(), len(keep))
        if j == len(keep):
            keep.append(i)
        ids[i] = j
    return keep, ids


_FINGERPRINT_WEIGHTS: dict[int, np.ndarray] = {}


def _fingerprints(rows: np.ndarray) -> np.ndarray:
    """A 64-bit fingerprint per row of bytes (equal rows, equal prints; a match is still
    compared whole): its 8-byte words times random odd weights, summed (mod 2**64). Hashing
    each row's bytes in Python cost several times as much."""
    if rows.shape[1] % 8:
        rows = np.pad(rows, ((0, 0), (0, 8 - rows.shape[1] % 8)))
    words = np.ascontiguousarray(rows).view(np.uint64)
    weights = _FINGERPRINT_WEIGHTS.get(words.shape[1])
    if weights is None:
        weights = np.random.default_rng(words.shape[1]).integers(1, 2**63, words.shape[1], dtype=np.uint64) | np.uint64(1)
        _FINGERPRINT_WEIGHTS[words.shape[1]] = weights
    return (words * weights).sum(axis=1, dtype=np.uint64)


class FrameRing:
    """The newest `capacity` frames, each under a global id (0, 1, 2, ... in order added)."""

    def __init__(self, capacity: int, frame_shape: tuple[int, ...]):
        self.capacity = capacity
        self.frames = np.empty((capacity, *frame_shape), np.uint8)  # pages are touched as it fills
        self.added = 0  # frames ever added: the next id

    def add(self, frames: np.ndarray) -> int:
        """Appends frames [M, H, W]; returns the id of the first."""
        first = self.added
        m = len(frames)
        if m > self.capacity:  # only the newest fit; the older ids are gone at once
            frames = frames[m - self.capacity:]
        slots = (self.added + (m - len(frames)) + np.arange(len(frames))) % self.capacity
        self.frames[slots] = frames
        self.added += m
        return first

    def held(self, ids: np.ndarray) -> np.ndarray:
        """Whether each id's frame is still in the ring."""
        return (ids >= self.added - self.capacity) & (ids < self.added)

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """frames [*ids.shape, H, W] of held ids."""
        return self.frames[ids % self.capacity]

    def state_dict(self) -> dict[str, np.ndarray]:
        """The held frames, oldest first, and the count ever added."""
        count = min(self.added, self.capacity)
        ids = np.arange(self.added - count, self.added)
        return {"frames": self.gather(ids), "added": np.array(self.added, np.int64)}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """The newest frames of a saved ring (of any capacity), under their ids."""
        frames, added = np.asarray(state["frames"]), int(state["added"])
        if frames.dtype != np.uint8 or frames.shape[1:] != self.frames.shape[1:] or not 0 <= len(frames) <= added:
            raise ValueError(f"frame ring: saved frames {frames.dtype}{list(frames.shape)} (of {added} added) do not fit "
                             f"uint8[N, {', '.join(map(str, self.frames.shape[1:]))}]")
        self.added = added - len(frames)
        self.add(frames)


class FrameReplay:
    """A PrioritizedReplay of transitions whose two stacks are frame ids into a FrameRing.

    `add` takes a message's frames and its per-transition indices into them; `sample`
    gives stacks, as a PrioritizedReplay of whole stacks would. One lock keeps the
    ring's frames and the replay's ids in step (a receiver thread adds while the learner
    samples).
    """

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], fields: Mapping, alpha: float, seed: int | None):
        stack = (tuple(obs_shape[:1]), np.int64)
        self.replay = PrioritizedReplay(capacity, {"obs_ids": stack, "next_ids": stack, **fields}, alpha=alpha, seed=seed)
        self.ring = FrameRing(int(capacity * FRAMES_PER_TRANSITION) + 1, tuple(obs_shape[1:]))
        self.lost = 0  # sampled transitions dropped: their frames had left the ring
        self._lock = threading.Lock()

    capacity = property(lambda self: self.replay.capacity)
    alpha = property(lambda self: self.replay.alpha)
    max_priority = property(lambda self: self.replay.max_priority)

    def __len__(self) -> int:
        return len(self.replay)

    def add(self, frames: np.ndarray, obs_frames: np.ndarray, next_frames: np.ndarray, rest: Mapping[str, np.ndarray],
            priorities: np.ndarray) -> None:
        """Appends N transitions: frames [M, H, W], obs_frames and next_frames [N, S]
        indices into them, `rest` the other fields [N, ...], priorities [N]."""
        with self._lock:
            first = self.ring.add(frames)
            self.replay.add({"obs_ids": obs_frames + first, "next_ids": next_frames + first, **rest}, priorities)

    def sample(self, batch_size: int, beta: float) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """As PrioritizedReplay.sample, with "obs" and "next_obs" stacks in place of ids; a
        transition whose frames have left the ring is left out of the batch (so it may be
        smaller, or empty) and given the smallest priority held (not less: the importance
        weights are scaled by the weight of the least likely item)."""
        with self._lock:
            keys, weights, batch = self.replay.sample(batch_size, beta)
            obs_ids, next_ids = batch.pop("obs_ids"), batch.pop("next_ids")
            held = self.ring.held(obs_ids).all(1) & self.ring.held(next_ids).all(1)
            if not held.all():
                lost = int((~held).sum())
                self.lost += lost
                self.replay.update_priorities(keys[~held], np.full(lost, self._smallest_priority()))
                keys, weights, obs_ids, next_ids = keys[held], weights[held], obs_ids[held], next_ids[held]
                batch = {k: v[held] for k, v in batch.items()}
            batch["obs"] = self.ring.gather(obs_ids)
            batch["next_obs"] = self.ring.gather(next_ids)
        return keys, weights, batch

    def _smallest_priority(self) -> float:
        alpha = self.replay.alpha
        if alpha == 0:
            return 1.0
        return max(self.replay._tree_min() ** (1.0 / alpha), float(np.finfo(np.float32).tiny))

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        return self.replay.update_priorities(keys, priorities)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The replay's state_dict with the ring's under "ring/"."""
        with self._lock:
            ring = {f"ring/{k}": v for k, v in self.ring.state_dict().items()}
            return {**self.replay.state_dict(), **ring}

    def load_ring(self, state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Restores the frames of a saved FrameReplay's state; returns the rest, the state of
        its PrioritizedReplay of frame ids (for `replay`: apex_dqn's _restore loads or moves it)."""
        ring = {k[len("ring/"):]: v for k, v in state.items() if k.startswith("ring/")}
        if set(ring) != {"frames", "added"}:
            raise ValueError("replay checkpoint: it holds whole stacks, not frames (it was saved with algo.frames_once false)")
        with self._lock:
            self.ring.load_state_dict(ring)
        return {k: v for k, v in state.items() if not k.startswith("ring/")}

    def _check_invariants(self) -> None:
        self.replay._check_invariants()
