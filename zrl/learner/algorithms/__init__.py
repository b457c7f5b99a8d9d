"""Algorithms: one module each, found by `algo.name`.

An algorithm says how an actor acts and what it records (`make_actor`), what
its messages must contain (`trajectory_schema`), whether the learner trains
on a stream of fresh trajectories or on replay (`uses_replay`), and the loss
over a batch. Everything else — sockets, queues, batching, weight publishing,
checkpoints, metrics — is the pipeline's and knows no algorithm.
"""
from __future__ import annotations

import importlib

from zrl.learner.algorithms.base import Algorithm, ActorAlgo

# algo.name -> module defining ALGORITHM (an Algorithm subclass)
_MODULES = {
    "impala": "zrl.learner.algorithms.impala",
    "apex_dqn": "zrl.learner.algorithms.apex_dqn",
}


def get(name: str) -> type[Algorithm]:
    if name not in _MODULES:
        raise ValueError(f"algo.name: unknown algorithm {name!r} (known: {sorted(_MODULES)})")
    return importlib.import_module(_MODULES[name]).ALGORITHM


__all__ = ["Algorithm", "ActorAlgo", "get"]
