"""Observation and action specs that cross the wire in the handshake.

The learner and the agent server never build a gymnasium env: models are
built from these specs, which actors read from their envs (`from_gym`) and
external clients declare. Specs serialise to plain JSON-able dicts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

# The dtypes an observation may have on the wire.
OBS_DTYPES = ("float32", "uint8", "float64", "int64", "int32", "bool")
CLIENT_OBS_DTYPES = ("float32", "uint8")  # what an agent server's clients may send


class SpecError(ValueError):
    pass


# A side of a Box's bounds: one for every element (a float), one per element in C order (a
# tuple of floats, None where that element has none), or none (None).
Bound = Union[float, tuple, None]


@dataclass(frozen=True)
class BoxSpec:
    """A tensor of fixed shape and dtype, with optional element-wise bounds."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    low: Bound = None  # (an action Box's bounds may differ per element; an observation's are kept scalar: from_gym)
    high: Bound = None

    def __post_init__(self):
        if self.dtype not in OBS_DTYPES:
            raise SpecError(f"box dtype {self.dtype!r} is not one of {OBS_DTYPES}")
        if any((not isinstance(d, int)) or d <= 0 for d in self.shape):
            raise SpecError(f"box shape {self.shape} must be positive ints")
        # An infinity on its own side is no bound (as from_json reads it; JSON has no inf).
        for side in ("low", "high"):
            v = getattr(self, side)
            if v is not None:
                object.__setattr__(self, side, _bounds(v, side, math.prod(self.shape)))

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @property
    def per_element(self) -> bool:
        """Whether the bounds differ from element to element."""
        return isinstance(self.low, tuple) or isinstance(self.high, tuple)

    def bound_array(self, side: str) -> np.ndarray:
        """One side's bounds as float64 [*shape]: -inf (low) or +inf (high) where there is none."""
        v, none = getattr(self, side), (-math.inf if side == "low" else math.inf)
        if isinstance(v, tuple):
            return np.array([none if x is None else x for x in v], np.float64).reshape(self.shape)
        return np.full(self.shape, none if v is None else v, np.float64)

    def to_json(self) -> dict[str, Any]:
        side = lambda v: list(v) if isinstance(v, tuple) else v  # noqa: E731
        return {"type": "box", "shape": list(self.shape), "dtype": self.dtype, "low": side(self.low), "high": side(self.high)}


@dataclass(frozen=True)
class DiscreteSpec:
    """One of n actions, 0..n-1."""

    n: int

    def __post_init__(self):
        if not isinstance(self.n, int) or self.n < 1:
            raise SpecError(f"discrete n must be a positive int, got {self.n!r}")

    @property
    def shape(self) -> tuple[int, ...]:
        return ()

    @property
    def dtype(self) -> str:
        return "int64"

    def to_json(self) -> dict[str, Any]:
        return {"type": "discrete", "n": self.n}


Spec = Union[BoxSpec, DiscreteSpec]


# What the wire can carry (docs/PROTOCOL.md): at most 6 dims of u32, an int64 action.
MAX_DIMS = 6
MAX_DIM = 2**32 - 1
MAX_ELEMENTS = 2**40  # far beyond any real observation; keeps sizes computable
MAX_N = 2**63 - 1


def _int(x: Any, what: str, most: int) -> int:
    """An integer in [1, most]: ints, or floats with an integral value (4.0); not bools or strings."""
    if isinstance(x, float) and math.isfinite(x) and x == int(x):
        x = int(x)
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not 1 <= x <= most:
        raise SpecError(f"{what} must be an integer in [1, {most}], got {_short(x)}")
    return int(x)


def _bound(x: Any, side: str) -> float | None:
    """A finite scalar bound, or None (no bound: null, or an infinity on its own side,
    as gymnasium writes an unbounded Box)."""
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise SpecError(f"{side} must be a number or null, got {_short(x)}")
    try:
        v = float(x)
    except OverflowError:
        v = math.inf if x > 0 else -math.inf
    if v == (-math.inf if side == "low" else math.inf):
        return None
    if not math.isfinite(v):
        raise SpecError(f"{side} must be finite, null or {'-' if side == 'low' else '+'}inf, got {_short(x)}")
    return v


def _bounds(x: Any, side: str, n: int) -> Bound:
    """A side's bounds: a number or null (_bound) for every element, or a list of n of them, one
    per element in C order, kept as a tuple (a scalar where they all agree)."""
    if isinstance(x, np.ndarray):
        x = x.reshape(-1).tolist()
    if not isinstance(x, (list, tuple)):
        return _bound(x, side)
    if len(x) != n:
        raise SpecError(f"{side} must be a number, null, or a list of {n} (one per element), got {_short(x)}")
    per = tuple(_bound(v, side) for v in x)
    return per[0] if len(set(per)) == 1 else per


def _dtype(x: Any) -> str:
    if isinstance(x, np.dtype):
        x = x.name
    if not isinstance(x, str) or x not in OBS_DTYPES:
        raise SpecError(f"box dtype {_short(x)} is not one of {OBS_DTYPES}")
    return x


def _short(x: Any) -> str:
    """repr(x), cut short: the value may be a hostile 400-digit number."""
    r = repr(x)
    return r if len(r) <= 120 else r[:100] + f"... ({len(r)} chars)"


def from_json(d: Any) -> Spec:
    """Parses a spec dict from a hello or a config; raises SpecError saying what is wrong."""
    if not isinstance(d, dict) or "type" not in d:
        raise SpecError(f"a space spec must be a mapping with a 'type', got {_short(d)}")
    kind = d["type"]
    try:
        if kind == "discrete":
            extra = set(d) - {"type", "n"}
            if extra:
                raise SpecError(f"unknown keys in discrete spec: {sorted(extra)}")
            return DiscreteSpec(n=_int(d["n"], "discrete n", MAX_N))
        if kind == "box":
            extra = set(d) - {"type", "shape", "dtype", "low", "high"}
            if extra:
                raise SpecError(f"unknown keys in box spec: {sorted(extra)}")
            shape = d["shape"]
            if not isinstance(shape, (list, tuple)) or len(shape) > MAX_DIMS:
                raise SpecError(f"box shape must be a list of at most {MAX_DIMS} dims, got {_short(shape)}")
            dims = tuple(_int(x, "box dim", MAX_DIM) for x in shape)
            if math.prod(dims) > MAX_ELEMENTS:
                raise SpecError(f"box shape {list(dims)} has more than {MAX_ELEMENTS} elements")
            return BoxSpec(
                shape=dims,
                dtype=_dtype(d.get("dtype", "float32")),
                low=d.get("low"),  # (BoxSpec reads its bounds: _bounds)
                high=d.get("high"),
            )
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        # Whatever a hello carries (JSON allows 1e400, NaN and 400-digit integers)
        # ends here as a SpecError, never as another exception.
        if isinstance(e, SpecError):
            raise
        raise SpecError(f"bad {kind} spec {_short(d)}: {e}") from None
    raise SpecError(f"unknown space type {_short(kind)} (known: box, discrete)")


def from_gym(space, per_element_bounds: bool = False) -> Spec:
    """The spec of a gymnasium space (Box or Discrete). A Box whose bounds differ from element
    to element keeps them with `per_element_bounds` (an action space: the agent and exported
    policies clip to them, SAC rescales to them), else has none on that side (an observation
    space: its bounds are not needed, and per element they could be many)."""
    import gymnasium as gym  # lazy: slow to import, and only gymnasium spaces need it

    if isinstance(space, gym.spaces.Discrete):
        if int(space.start) != 0:
            raise SpecError(f"Discrete spaces must start at 0, got start={space.start}")
        return DiscreteSpec(n=int(space.n))
    if isinstance(space, gym.spaces.Box):
        shape = tuple(int(x) for x in space.shape)
        if per_element_bounds:
            return BoxSpec(shape=shape, dtype=str(space.dtype), low=space.low, high=space.high)
        low = np.unique(space.low)
        high = np.unique(space.high)
        scalar = lambda u: float(u[0]) if len(u) == 1 and np.isfinite(u[0]) else None  # noqa: E731
        return BoxSpec(shape=shape, dtype=str(space.dtype), low=scalar(low), high=scalar(high))
    raise SpecError(f"unsupported gymnasium space {space!r} (zrl handles Box and Discrete)")
