"""The Python faces of zrl._core.PrioritizedReplay and zrl._core.UniformReplay.

They normalise the field declarations, pick a seed, and carry the
docstrings; every array is checked in C++ (csrc/python/replay.cc), where errors
name the argument: `batch['obs']: expected dtype float32, got float64`.
"""
from __future__ import annotations

import operator
import secrets
from collections.abc import Mapping
from typing import Any, Dict, Tuple

import numpy as np
import numpy.typing as npt

from zrl import _core

__all__ = ["FieldSpecs", "PrioritizedReplay", "UniformReplay"]

# name -> (shape, dtype), e.g. {"obs": ((4,), np.float32), "done": ((), np.bool_)}.
FieldSpecs = Mapping[str, Tuple[Tuple[int, ...], Any]]
Batch = Dict[str, np.ndarray]

_DTYPES = {
    np.dtype(np.float32): "float32",
    np.dtype(np.uint8): "uint8",
    np.dtype(np.int64): "int64",
    np.dtype(np.bool_): "bool",
}


def _fields(fields: FieldSpecs) -> list[tuple[str, tuple[int, ...], str]]:
    """[(name, shape, dtype name)] in declaration order, or ValueError naming the bad entry."""
    if not isinstance(fields, Mapping) or not fields:
        raise ValueError("fields: expected a non-empty mapping of name -> (shape, dtype)")
    out = []
    for name, spec in fields.items():
        where = f"fields[{name!r}]"
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: names must be non-empty strings")
        try:
            shape, dtype = spec
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected (shape, dtype), got {spec!r}") from None
        if isinstance(shape, (int, np.integer)):
            shape = (shape,)
        try:
            shape = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise ValueError(f"{where}: shape must be a tuple of ints, got {shape!r}") from None
        if any(d <= 0 for d in shape):
            raise ValueError(f"{where}: every dimension must be > 0, got {shape}")
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise ValueError(f"{where}: not a dtype: {dtype!r}") from None
        if dt.newbyteorder("=") not in _DTYPES:
            raise ValueError(f"{where}: dtype must be float32, uint8, int64 or bool, got {dt}")
        out.append((name, shape, _DTYPES[dt.newbyteorder("=")]))
    return out


def _seed(seed: int | None) -> int:
    if seed is None:
        return secrets.randbits(64)
    try:
        seed = operator.index(seed)
    except TypeError:
        raise ValueError(f"seed: expected an int or None, got {type(seed).__name__}") from None
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed: must be in [0, 2**64), got {seed}")
    return seed


def _capacity(capacity: int) -> int:
    try:
        capacity = operator.index(capacity)
    except TypeError:
        raise ValueError(f"capacity: expected an int, got {type(capacity).__name__}") from None
    if capacity <= 0:
        raise ValueError(f"capacity: must be positive, got {capacity}")
    return capacity


def _batch_size(batch_size: int) -> int:
    try:
        return operator.index(batch_size)
    except TypeError:
        raise ValueError(f"batch_size: expected an int, got {type(batch_size).__name__}") from None


class PrioritizedReplay:
    """Proportional prioritised replay (Schaul et al. 2016) with FIFO eviction.

    Item i is drawn with probability P(i) = p_i**alpha / sum_k p_k**alpha, one
    draw per equal segment of the total (stratified). New items get the
    largest priority seen so far (1 to start with) unless `add` is given
    priorities. Storage for `capacity` items of every field is allocated up
    front (pages are touched as it fills).

    Thread safety: any method may be called from any thread; each call is
    atomic (one mutex in C++) and runs without the GIL, so a receiver thread
    can `add` while the learner thread samples and updates.

    Args:
      capacity: the number of items kept; the oldest is evicted first.
      fields: name -> (shape, dtype) for every field of an item; dtypes
        float32, uint8, int64 or bool; shape () for a scalar.
      alpha: the priority exponent, >= 0 (0 samples uniformly).
      seed: seeds the buffer's own RNG (None: a random seed), so sampling is
        reproducible.
    """

    def __init__(self, capacity: int, fields: FieldSpecs, alpha: float = 0.6, *, seed: int | None = None):
        self._impl = _core.PrioritizedReplay(_capacity(capacity), _fields(fields), float(alpha), _seed(seed))
        self._field_specs = {name: (shape, np.dtype(dt)) for name, shape, dt in self._impl.fields}

    @property
    def capacity(self) -> int:
        return self._impl.capacity

    @property
    def alpha(self) -> float:
        return self._impl.alpha

    @property
    def fields(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """name -> (shape, dtype), as declared."""
        return dict(self._field_specs)

    @property
    def max_priority(self) -> float:
        """The largest raw priority seen so far: what a new item gets by default."""
        return self._impl.max_priority

    def __len__(self) -> int:
        return len(self._impl)

    def add(self, batch: Batch, priorities: npt.ArrayLike | None = None) -> None:
        """Appends N items.

        Args:
          batch: {name: array [N, *shape]} for every field, of the declared
            dtype (no conversion is done), all with the same N.
          priorities: [N] raw priorities, finite and > 0; None gives every
            item the largest priority seen so far.
        """
        self._impl.add(batch, priorities)

    def sample(self, batch_size: int, beta: float) -> tuple[np.ndarray, np.ndarray, Batch]:
        """Draws `batch_size` items (with replacement), one per equal segment of the total priority.

        Args:
          batch_size: > 0.
          beta: importance-sampling exponent in [0, 1].

        Returns:
          (keys, weights, batch): keys int64 [batch_size] for update_priorities;
          weights float32 [batch_size] = (N * P(i))**-beta divided by the
          largest such weight of any stored item, so 0 < w <= 1; batch
          {name: new array [batch_size, *shape]}.

        Raises ValueError when the buffer is empty.
        """
        return self._impl.sample(_batch_size(batch_size), float(beta))

    def update_priorities(self, keys: npt.ArrayLike, priorities: npt.ArrayLike) -> int:
        """Sets new raw priorities (finite, > 0) for sampled items.

        Keys of items that have been evicted since they were sampled are
        skipped (each slot's generation is part of its key). Returns how many
        priorities were applied. A key this buffer never issued is a ValueError.
        """
        return self._impl.update_priorities(keys, priorities)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The full state as a flat dict of numpy arrays (no pickle needed).

        Keys: format_version, capacity, alpha, max_priority, size, cursor,
        rng_state, generations [size], scaled_priorities [size] (p**alpha as
        the tree holds it) and field/NAME [size, *shape] per field.
        """
        return self._impl.state_dict()

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Replaces the state with one from `state_dict()` of a buffer with the same
        capacity, fields and alpha. Checks every array first (ValueError naming
        it) and changes nothing if any check fails."""
        self._impl.load_state_dict(dict(state))

    # Debugging and tests.
    def _tree_total(self) -> float:
        return self._impl._tree_total()

    def _tree_min(self) -> float:
        return self._impl._tree_min()

    def _scaled_priorities(self) -> np.ndarray:
        """p**alpha of the stored slots [0, len(self)), in slot order."""
        return self._impl._scaled_priorities()

    def _check_invariants(self) -> None:
        """Raises AssertionError unless every tree node equals the sum/min of its children."""
        why = self._impl._check_invariants()
        if why:
            raise AssertionError(why)


class UniformReplay:
    """Uniform replay with FIFO eviction; the same storage and threading as PrioritizedReplay.

    Args:
      capacity: the number of items kept; the oldest is evicted first.
      fields: name -> (shape, dtype); dtypes float32, uint8, int64 or bool.
      seed: seeds the buffer's own RNG (None: a random seed).
    """

    def __init__(self, capacity: int, fields: FieldSpecs, *, seed: int | None = None):
        self._impl = _core.UniformReplay(_capacity(capacity), _fields(fields), _seed(seed))
        self._field_specs = {name: (shape, np.dtype(dt)) for name, shape, dt in self._impl.fields}

    @property
    def capacity(self) -> int:
        return self._impl.capacity

    @property
    def fields(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        return dict(self._field_specs)

    def __len__(self) -> int:
        return len(self._impl)

    def add(self, batch: Batch) -> None:
        """Appends N items: {name: array [N, *shape]} of the declared dtypes, same N."""
        self._impl.add(batch)

    def sample(self, batch_size: int) -> Batch:
        """Draws `batch_size` > 0 items uniformly with replacement: {name: new array [batch_size, *shape]}.

        Raises ValueError when the buffer is empty.
        """
        return self._impl.sample(_batch_size(batch_size))

    def state_dict(self) -> dict[str, np.ndarray]:
        """The full state as a flat dict of numpy arrays (see PrioritizedReplay.state_dict)."""
        return self._impl.state_dict()

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Replaces the state with one from `state_dict()`; validates first, changes nothing on error."""
        self._impl.load_state_dict(dict(state))
