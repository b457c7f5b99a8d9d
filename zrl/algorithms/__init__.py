"""The algorithm registry: `algo.name` -> an algorithm's config and implementation.

Each algorithm is a package here. Its `__init__.py` defines the hyper-parameter
dataclass and binds it to `CONFIG` (light: no torch, so that config.py can
validate a config and `zrl --help` stays fast); its `algorithm.py` defines
`ALGORITHM`, the `zrl.algorithms.base.Algorithm` subclass, imported only when
a process builds the algorithm. The registry finds the packages by listing
this one, so adding an algorithm adds a package and touches nothing else. The
name is the config's default `name`.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil

_CONFIGS: dict[str, type] = {}


# What the learner can feed an algorithm (zrl.learner.batches.SOURCES): fresh chunks as they
# come, a replay, the chunks of exactly one policy version (synchronous PPO), or gradients
# computed by the actors (A3C).
BATCH_SOURCES = ("stream", "replay", "version", "gradients")


def _discover() -> dict[str, type]:
    if not _CONFIGS:
        found = {}  # filled whole or not at all: a package that fails to import fails every lookup
        for info in pkgutil.iter_modules(__path__):
            if not info.ispkg:
                continue
            module = importlib.import_module(f"{__name__}.{info.name}")
            config = getattr(module, "CONFIG", None)
            if config is None:
                continue
            found[info.name] = _checked(info.name, config)
        _CONFIGS.update(found)
    return _CONFIGS


def _checked(package: str, config: type) -> type:
    where = f"zrl.algorithms.{package}.CONFIG"
    name = {f.name: f.default for f in dataclasses.fields(config)}.get("name")
    if name != package:
        raise RuntimeError(f"{where}: its name field defaults to {name!r}; it must be the package's name")
    if getattr(config, "batch_source", None) not in BATCH_SOURCES:
        raise RuntimeError(f"{where}: batch_source must be one of {BATCH_SOURCES}, a class attribute")
    return config


def names() -> list[str]:
    """The registered algorithms' names, sorted."""
    return sorted(_discover())


def config_class(name: str) -> type:
    """The hyper-parameter dataclass of algorithm `name` (ValueError naming the known ones)."""
    configs = _discover()
    if name not in configs:
        raise ValueError(f"unknown algorithm {name!r} (known: {sorted(configs)})")
    return configs[name]


def get(name: str) -> type:
    """The Algorithm class of `name` (imports its implementation, and with it torch)."""
    config_class(name)
    return importlib.import_module(f"{__name__}.{name}.algorithm").ALGORITHM
