"""V-trace targets (IMPALA, Espeholt et al. 2018) computed by the C++ kernel.

`from_importance_weights` is the Python face of `zrl._core.vtrace`: it accepts
numpy arrays or CPU torch tensors (returning the same kind), checks arguments
in C++ (errors name the argument), and releases the GIL while the kernel runs.
Outputs are targets: no gradient flows through them. On CUDA, the learner
moves the five [T, B] inputs to pinned host memory, calls this, and moves the
two outputs back — one synchronising round trip per training step.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from zrl import _core

__all__ = ["VTraceReturns", "from_importance_weights"]


class VTraceReturns(NamedTuple):
    vs: Any  # [T, B] value targets
    pg_advantages: Any  # [T, B] policy-gradient advantages


def _threshold(x: float | None) -> float:
    return math.inf if x is None else float(x)


def from_importance_weights(
    log_rhos,
    discounts,
    rewards,
    values,
    bootstrap_value,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> VTraceReturns:
    """V-trace from log importance ratios, all time-major float32.

    Args:
      log_rhos: [T, B] log(pi(a_t|x_t) / mu(a_t|x_t)).
      discounts: [T, B] gamma * (1 - terminated_t).
      rewards: [T, B] r_t.
      values: [T, B] V(x_t) under the learner's value function.
      bootstrap_value: [B] V(x_T).
      clip_rho_threshold: rho bar (None: no clipping).
      clip_pg_rho_threshold: rho bar of the policy-gradient advantage (None: none).
      clip_c_threshold: c bar (None: no clipping); c_i = lambda * min(c bar, pi/mu).
      lambda_: trace-cutting lambda in [0, 1].

    Returns:
      VTraceReturns(vs, pg_advantages), both [T, B], numpy arrays for numpy
      inputs, CPU torch tensors (no grad) for torch inputs.
    """
    args = (log_rhos, discounts, rewards, values, bootstrap_value)
    thresholds = (
        _threshold(clip_rho_threshold),
        _threshold(clip_pg_rho_threshold),
        _threshold(clip_c_threshold),
        float(lambda_),
    )
    if type(log_rhos) is np.ndarray:
        return VTraceReturns(*_core.vtrace(*args, *thresholds))
    return _from_torch(args, thresholds)


_NAMES = ("log_rhos", "discounts", "rewards", "values", "bootstrap_value")


def _from_torch(args, thresholds) -> VTraceReturns:
    import torch  # lazy: numpy callers of V-trace need no torch

    arrays = []
    for name, x in zip(_NAMES, args):
        if isinstance(x, torch.Tensor):
            if x.device.type != "cpu":
                raise ValueError(f"{name}: expected a CPU tensor, got one on {x.device}")
            x = x.detach().numpy()
        elif not isinstance(x, np.ndarray):
            raise ValueError(f"{name}: expected a numpy array or torch tensor, got {type(x).__name__}")
        arrays.append(x)
    vs, pg = _core.vtrace(*arrays, *thresholds)
    if isinstance(args[0], torch.Tensor):
        return VTraceReturns(torch.from_numpy(vs), torch.from_numpy(pg))
    return VTraceReturns(vs, pg)
