"""Observation and action specs that cross the wire in the handshake.

The learner and the agent server never build a gymnasium env: models are
built from these specs, which actors read from their envs (`from_gym`) and
external clients declare. Specs serialise to plain JSON-able dicts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import numpy as np

# The dtypes an observation may have on the wire.
OBS_DTYPES = ("float32", "uint8", "float64", "int64", "int32", "bool")


class SpecError(ValueError):
    pass


@dataclass(frozen=True)
class BoxSpec:
    """A tensor of fixed shape and dtype, with optional element-wise bounds."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    low: float | None = None  # a scalar bound; per-element bounds are not needed on the wire
    high: float | None = None

    def __post_init__(self):
        if self.dtype not in OBS_DTYPES:
            raise SpecError(f"box dtype {self.dtype!r} is not one of {OBS_DTYPES}")
        if any((not isinstance(d, int)) or d <= 0 for d in self.shape):
            raise SpecError(f"box shape {self.shape} must be positive ints")

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    def to_json(self) -> dict[str, Any]:
        return {"type": "box", "shape": list(self.shape), "dtype": self.dtype, "low": self.low, "high": self.high}


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


def from_json(d: Any) -> Spec:
    """Parses a spec dict from a hello or a config; raises SpecError saying what is wrong."""
    if not isinstance(d, dict) or "type" not in d:
        raise SpecError(f"a space spec must be a mapping with a 'type', got {d!r}")
    kind = d["type"]
    try:
        if kind == "discrete":
            extra = set(d) - {"type", "n"}
            if extra:
                raise SpecError(f"unknown keys in discrete spec: {sorted(extra)}")
            return DiscreteSpec(n=int(d["n"]))
        if kind == "box":
            extra = set(d) - {"type", "shape", "dtype", "low", "high"}
            if extra:
                raise SpecError(f"unknown keys in box spec: {sorted(extra)}")
            shape = d["shape"]
            if not isinstance(shape, (list, tuple)):
                raise SpecError(f"box shape must be a list, got {shape!r}")
            low, high = d.get("low"), d.get("high")
            return BoxSpec(
                shape=tuple(int(x) for x in shape),
                dtype=str(d.get("dtype", "float32")),
                low=None if low is None else float(low),
                high=None if high is None else float(high),
            )
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, SpecError):
            raise
        raise SpecError(f"bad {kind} spec {d!r}: {e}") from None
    raise SpecError(f"unknown space type {kind!r} (known: box, discrete)")


def from_gym(space) -> Spec:
    """The spec of a gymnasium space (Box or Discrete)."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        if int(space.start) != 0:
            raise SpecError(f"Discrete spaces must start at 0, got start={space.start}")
        return DiscreteSpec(n=int(space.n))
    if isinstance(space, gym.spaces.Box):
        low = np.unique(space.low)
        high = np.unique(space.high)
        scalar = lambda u: float(u[0]) if len(u) == 1 and np.isfinite(u[0]) else None  # noqa: E731
        return BoxSpec(shape=tuple(int(x) for x in space.shape), dtype=str(space.dtype), low=scalar(low), high=scalar(high))
    raise SpecError(f"unsupported gymnasium space {space!r} (zrl handles Box and Discrete)")
