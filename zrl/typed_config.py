"""Typed config sections: YAML values coerced into frozen dataclass fields.

The machinery under zrl.config and every algorithm's config: a section is a
frozen dataclass whose fields carry a docstring each (the string literal after
the field); `build_section` checks that every key is known, coerces each value
to its field's type and lets `__post_init__` check invariants with `check`.
Errors are ConfigError and name the key; config.py adds the file.

This module imports nothing from zrl and nothing heavy, so that any section can
be defined and validated without torch.
"""
from __future__ import annotations

import ast
import dataclasses
import decimal
import inspect
import math
import textwrap
import types
import typing
from typing import Any, Union


class ConfigError(ValueError):
    """A bad config: the message names the file and the key."""


def check(cond: bool, key: str, why: str) -> None:
    """Raises ConfigError("key: why") unless cond holds (for __post_init__)."""
    if not cond:
        raise ConfigError(f"{key}: {why}")


def build_section(cls: type, data: Any, section: str, source: str):
    """An instance of the dataclass `cls` from the plain mapping `data` (section `section` of `source`)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: section {section!r} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise ConfigError(f"{source}: unknown key {section}.{unknown[0]} (known in {section}: {', '.join(names)})")
    infinite = getattr(cls, "infinity_allowed", frozenset())
    kwargs = {k: coerce(v, hints[k], f"{section}.{k}", k in infinite) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def field_docs(cls: type) -> dict[str, str]:
    """{field: its docstring} from the class source (the string literal after each field)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def coerce(value: Any, tp: Any, key: str, infinity_allowed: bool = False) -> Any:
    """`value` as type `tp` (a field's annotation), or ConfigError naming `key`. Floats must be
    finite unless `infinity_allowed` (a setting where .inf means what null does)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return _coerce_union(value, tp, args, key, infinity_allowed)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        return _coerce_int(value, key)
    if tp is float:
        return _coerce_float(value, key, infinity_allowed)
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if origin is tuple:
        return _coerce_tuple(value, args, key, infinity_allowed)
    if tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
        raise ConfigError(f"{key}: expected a mapping, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp}")


def _coerce_union(value, tp, args, key, infinity_allowed):
    if value is None and type(None) in args:
        return None
    inner = [a for a in args if a is not type(None)]
    if len(inner) == 1:
        return coerce(value, inner[0], key, infinity_allowed)
    for a in inner:
        try:
            return coerce(value, a, key, infinity_allowed)
        except ConfigError:
            pass
    raise ConfigError(f"{key}: {value!r} does not match {tp}")


def _coerce_int(value, key) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        # YAML 1.1 reads 1e7 (no dot) as a string, as float keys accept: a finite float's worth
        # (so no 1e999999 of a billion digits), integral as written (Decimal: exact, 1e30 is 10**30)
        try:
            number, exact = float(value), decimal.Decimal(value.strip())
        except (ValueError, decimal.InvalidOperation):
            pass
        else:
            if math.isfinite(number) and exact == exact.to_integral_value():
                return int(exact)
    raise ConfigError(f"{key}: expected an integer, got {value!r}")


def _coerce_float(value, key, infinity_allowed) -> float:
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)  # YAML reads 1e-3 without a dot as a string
        except ValueError:
            pass
    if number is None:
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if math.isnan(number) or (math.isinf(number) and not infinity_allowed):
        raise ConfigError(f"{key}: must be a finite number, got {value!r}")
    return number


def _coerce_tuple(value, args, key, infinity_allowed) -> tuple:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}: expected a list, got {value!r}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(coerce(v, args[0], key, infinity_allowed) for v in value)
    if len(value) != len(args):
        raise ConfigError(f"{key}: expected {len(args)} values, got {len(value)}")
    return tuple(coerce(v, a, key, infinity_allowed) for v, a in zip(value, args))
