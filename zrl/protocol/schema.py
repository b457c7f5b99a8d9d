"""What an algorithm's messages must contain, as data: a `Schema` of named `Field`s.

A field has a dtype, a shape whose dims may be symbols (T, K, "T+1"), and
per-element rules: floats must be finite, and may be held to a range
(`low`, `high`) or, as a whole array, to an L2 norm (`max_norm`); integers
and flags may be held below a `bound` (read as unsigned, so a negative value
reads as huge), an int or a product of dims ("T*K"). `Mark`s tie an index
array to the flags it lists. `at_join` marks the fields whose per-element
rules a stream learner checks as it joins them into a batch rather than on
receipt. The learner's gate and the batch join read these rules; an
algorithm writes no checking code. Each check raises WireError.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Collection, Iterable, Mapping

import numpy as np

from zrl.protocol.frame import Reason, WireError
from zrl.protocol.message import ArrayInfo, Message

Dim = int | str  # an int, or a symbol such as "T", "K", "M" or "T+1"


@dataclass(frozen=True)
class Field:
    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]
    bound: int | str | None = None
    """Integers and flags: every element, read as unsigned, is below this (an int, or dims
    multiplied, e.g. "T*K")."""
    low: float | None = None
    """Floats: every element is >= low (> low with low_open)."""
    high: float | None = None
    """Floats: every element is <= high."""
    low_open: bool = False
    at_join: bool = False
    """Its per-element rules (finite, bound) may be left to the join that copies it into a batch."""
    max_norm: float | None = None
    """Floats: the L2 norm of the whole array is at most this (an actor's gradient)."""

    @property
    def ranged(self) -> bool:
        return self.low is not None or self.high is not None or self.max_norm is not None


@dataclass(frozen=True)
class Mark:
    """`index` lists, in increasing order, exactly the flat positions where `marked` is set,
    and `excluded` is not set at any of them (see check_marks)."""

    index: str
    marked: str
    excluded: str


class Schema:
    """The arrays a message kind must carry: names, dtypes and shapes with symbols.

    Symbols are bound by `fixed` (e.g. T from the config) or by the first
    field that uses them (e.g. K, the sender's number of envs); `bounds`
    limits free symbols. `check` raises WireError or returns the bindings.
    """

    def __init__(self, fields: Iterable[Field], fixed: Mapping[str, int] | None = None, bounds: Mapping[str, tuple[int, int]] | None = None,
                 marks: Iterable[Mark] = ()):
        self.fields = {f.name: _typed(f) for f in fields}
        self.fixed = dict(fixed or {})
        self.bounds = dict(bounds or {})
        self.marks = tuple(marks)
        self.join_fields = frozenset(f.name for f in self.fields.values() if f.at_join)
        # The C++ gate checks finite floats, bounds and marks; a range or a norm keeps frames on the Python path.
        self.vouchable = not any(f.ranged for f in self.fields.values())
        # Accepted layouts by id of decode's cached infos tuple (kept alive here, so the id
        # stays its own): hashing 8 frozen dataclasses per message costs more than the check.
        self._ok_layouts: dict[int, tuple[tuple[ArrayInfo, ...], dict[str, int]]] = {}

    def check(self, msg: Message) -> dict[str, int]:
        hit = self._ok_layouts.get(id(msg.infos))
        if hit is not None and hit[0] is msg.infos:
            return hit[1]
        got = {i.name: i for i in msg.infos}
        missing = [n for n in self.fields if n not in got]
        if missing:
            raise WireError(Reason.MISSING_FIELD, f"missing {missing}")
        extra = [n for n in got if n not in self.fields]
        if extra:
            raise WireError(Reason.UNKNOWN_FIELD, f"unexpected {extra}")
        env = dict(self.fixed)
        for name, f in self.fields.items():
            info = got[name]
            if info.dtype != f.dtype:
                raise WireError(Reason.BAD_DTYPE, f"{name}: dtype {info.dtype}, expected {f.dtype}")
            if len(info.shape) != len(f.shape):
                raise WireError(Reason.BAD_SHAPE, f"{name}: shape {info.shape}, expected {self.describe(f)}")
            for d, want in zip(info.shape, f.shape):
                if isinstance(want, int):
                    if d != want:
                        raise WireError(Reason.BAD_SHAPE, f"{name}: shape {info.shape}, expected {self.describe(f)}")
                    continue
                sym, plus = _parse_dim(want)
                value = d - plus
                if sym in env:
                    if env[sym] != value:
                        raise WireError(Reason.BAD_SHAPE, f"{name}: shape {info.shape}, expected {self.describe(f)} with {sym}={env[sym]}")
                else:
                    lo, hi = self.bounds.get(sym, (0, 1 << 31))
                    if not lo <= value <= hi:
                        raise WireError(Reason.BAD_SHAPE, f"{name}: {sym}={value} outside [{lo}, {hi}]")
                    env[sym] = value
        if len(self._ok_layouts) >= 64:
            self._ok_layouts.clear()
        self._ok_layouts[id(msg.infos)] = (msg.infos, env)
        return env

    def element_bounds(self, bindings: Mapping[str, int]) -> dict[str, int]:
        """{field: bound} for these bindings."""
        return {f.name: _resolve(f.bound, bindings) for f in self.fields.values() if f.bound is not None}

    def value_rules(self, bindings: Mapping[str, int]) -> tuple[dict[str, int] | None, list[tuple[str, str, str]] | None]:
        """(bounds, marks) as the C++ gate takes them (None where there are none)."""
        bounds = self.element_bounds(bindings)
        marks = [(m.index, m.marked, m.excluded) for m in self.marks]
        return bounds or None, marks or None

    def check_values(self, msg: Message, bindings: Mapping[str, int], skip: Collection[str] = ()) -> None:
        """Every per-element rule: finite floats, ranges and norms, bounds, then marks; the
        finite and bound rules of the fields in `skip` are left to a later check (a checked join)."""
        check_finite(msg, skip)
        for f in self.fields.values():
            if f.ranged:
                _check_range(msg.arrays[f.name], f)
        bounds = {n: b for n, b in self.element_bounds(bindings).items() if n not in skip}
        if bounds:
            check_bounds(msg, bounds)
        if self.marks:
            check_marks(msg, [(m.index, m.marked, m.excluded) for m in self.marks])

    def describe(self, f: Field) -> str:
        return "(" + ", ".join(str(self.fixed.get(d, d)) if isinstance(d, str) else str(d) for d in f.shape) + ")"


def check_finite(msg: Message, skip: Collection[str] = ()) -> None:
    """WireError(bad_value) if a floating-point array (other than those in skip) holds a NaN
    or an infinity: in a trajectory, one such reward or observation turns every weight NaN
    at the next update."""
    for info in msg.infos:
        if info.dtype.kind == "f" and info.nbytes and info.name not in skip and not np.isfinite(msg.arrays[info.name]).all():
            raise WireError(Reason.BAD_VALUE, f"{info.name} holds a NaN or an infinity")


def check_bounds(msg: Message, bounds: Mapping[str, int]) -> None:
    """WireError(bad_value) unless every element of each named integer array, read as
    unsigned (so a negative one reads as huge), is below its bound."""
    for name, bound in bounds.items():
        a = msg.arrays[name]
        if a.size and int(a.view(_UNSIGNED[a.dtype.itemsize]).max()) >= bound:
            raise WireError(Reason.BAD_VALUE, f"{name} outside [0, {bound})")


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def check_marks(msg: Message, marks) -> None:
    """WireError(bad_value) unless, for each (index, marked, excluded): the integer array
    `index` lists, in increasing order, exactly the flat positions where `marked` (an array
    of bytes, e.g. bool) is non-zero, and `excluded` is zero at each of them. IMPALA: each
    truncated step has its one final observation, and no step is truncated and terminated."""
    for index, marked, excluded in marks:
        a = msg.arrays
        where = np.flatnonzero(a[marked].reshape(-1).view(np.uint8))
        idx = a[index].reshape(-1)
        if idx.shape != where.shape or not np.array_equal(idx.view(_UNSIGNED[idx.dtype.itemsize]), where):
            raise WireError(Reason.BAD_VALUE, f"{index} must list each step where {marked} is set, once and in order")
        if a[excluded].reshape(-1).view(np.uint8)[where].any():
            raise WireError(Reason.BAD_VALUE, f"a step both {marked} and {excluded}")


def _typed(f: Field) -> Field:
    """The field with its dtype and shape normalised; ValueError for a rule its dtype cannot have."""
    f = dataclasses.replace(f, dtype=np.dtype(f.dtype), shape=tuple(f.shape))
    if f.bound is not None and f.dtype.kind not in "biu":
        raise ValueError(f"field {f.name}: a bound is for integers and flags, not {f.dtype}")
    if f.ranged and f.dtype.kind != "f":
        raise ValueError(f"field {f.name}: low, high and max_norm are for floats, not {f.dtype}")
    return f


def _resolve(bound: int | str, bindings: Mapping[str, int]) -> int:
    if isinstance(bound, int):
        return bound
    value = 1
    for sym in bound.split("*"):
        value *= bindings[sym.strip()]
    return value


def _check_range(a: np.ndarray, f: Field) -> None:
    if not a.size:
        return
    if f.max_norm is not None:
        norm = float(np.linalg.norm(a.reshape(-1).astype(np.float64, copy=False)))  # (float64: no overflow to inf)
        if not norm <= f.max_norm:
            raise WireError(Reason.BAD_VALUE, f"{f.name} has norm {norm:.4g}, above {f.max_norm:g}")
    if f.low is None and f.high is None:
        return
    lo, hi = a.min(), a.max()
    if f.low is not None and (lo <= f.low if f.low_open else lo < f.low):
        raise WireError(Reason.BAD_VALUE, f"{f.name} must be {'>' if f.low_open else '>='} {f.low:g}")
    if f.high is not None and hi > f.high:
        raise WireError(Reason.BAD_VALUE, f"{f.name} must be <= {f.high:g}")


def _parse_dim(d: str) -> tuple[str, int]:
    if "+" in d:
        sym, plus = d.split("+", 1)
        return sym.strip(), int(plus)
    return d.strip(), 0
