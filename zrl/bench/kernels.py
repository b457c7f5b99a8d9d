"""`zrl bench kernels`: V-trace through zrl's C++ kernel against the same
formula as a PyTorch reverse-scan loop (the shape of TorchBeast's vtrace.py,
what most PyTorch IMPALA learners run) and as a numpy loop.

Each implementation gets numpy float32 [T, B] inputs (torch gets tensors made
from them once, outside the timing) and returns (vs, pg_advantages). The
three agree to 1e-4 before anything is timed. Effective GB/s counts the bytes
the kernel must touch: 4 [T, B] inputs + [B] bootstrap read, 2 [T, B] written.
"""
from __future__ import annotations

import numpy as np
import torch

from zrl.bench.harness import BenchOptions, BenchResult, time_call
from zrl.algorithms.vtrace import from_importance_weights

SIZES = [(20, 32), (80, 32), (80, 256), (1000, 256)]


def torch_vtrace(log_rhos, discounts, rewards, values, bootstrap_value, rho_bar=1.0, pg_rho_bar=1.0, c_bar=1.0, lambda_=1.0):
    """The reverse-scan loop of TorchBeast's vtrace.py, written out here (with lambda)."""
    with torch.no_grad():
        rhos = torch.exp(log_rhos)
        clipped_rhos = torch.clamp(rhos, max=rho_bar)
        cs = lambda_ * torch.clamp(rhos, max=c_bar)
        values_t_plus_1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
        deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)
        acc = torch.zeros_like(bootstrap_value)
        result = []
        for t in range(discounts.shape[0] - 1, -1, -1):
            acc = deltas[t] + discounts[t] * cs[t] * acc
            result.append(acc)
        result.reverse()
        vs = torch.stack(result) + values
        vs_t_plus_1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
        pg_advantages = torch.clamp(rhos, max=pg_rho_bar) * (rewards + discounts * vs_t_plus_1 - values)
        return vs, pg_advantages


def numpy_vtrace(log_rhos, discounts, rewards, values, bootstrap_value, rho_bar=1.0, pg_rho_bar=1.0, c_bar=1.0, lambda_=1.0):
    """The same reverse scan in numpy: vectorised over B, a Python loop over T."""
    rhos = np.exp(log_rhos)
    clipped_rhos = np.minimum(rhos, rho_bar)
    cs = lambda_ * np.minimum(rhos, c_bar)
    values_t_plus_1 = np.concatenate([values[1:], bootstrap_value[None]], axis=0)
    deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)
    vs_minus_v = np.empty_like(values)
    acc = np.zeros_like(bootstrap_value)
    for t in range(values.shape[0] - 1, -1, -1):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + values
    vs_t_plus_1 = np.concatenate([vs[1:], bootstrap_value[None]], axis=0)
    pg = np.minimum(rhos, pg_rho_bar) * (rewards + discounts * vs_t_plus_1 - values)
    return vs, pg


def make_inputs(T: int, B: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    log_rhos = rng.normal(0.0, 0.5, (T, B)).astype(np.float32)
    discounts = np.where(rng.random((T, B)) < 0.02, 0.0, 0.99).astype(np.float32)
    rewards = rng.normal(size=(T, B)).astype(np.float32)
    values = rng.normal(size=(T, B)).astype(np.float32)
    bootstrap = rng.normal(size=B).astype(np.float32)
    return log_rhos, discounts, rewards, values, bootstrap


def run(opts: BenchOptions) -> BenchResult:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the C++ kernel is single-threaded; so is the comparison
    try:
        return _run(opts)
    finally:
        torch.set_num_threads(threads)  # (`zrl bench all` runs others after this one)


def _run(opts: BenchOptions) -> BenchResult:
    result = BenchResult(
        name="kernels",
        title="V-trace: zrl C++ kernel vs PyTorch reverse-scan loop vs numpy loop (us per call)",
        columns=["T", "B", "zrl_us", "torch_us", "numpy_us", "zrl_GB/s", "x_torch", "x_numpy"],
    )
    sizes = SIZES[:2] if opts.quick else SIZES
    for T, B in sizes:
        args = make_inputs(T, B)
        targs = tuple(torch.from_numpy(a) for a in args)
        ours = from_importance_weights(*args)
        ref_t = torch_vtrace(*targs)
        ref_n = numpy_vtrace(*args)
        for got, want in ((ours.vs, ref_t[0].numpy()), (ours.pg_advantages, ref_t[1].numpy()), (ours.vs, ref_n[0])):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        repeats = 3 if opts.quick else opts.repeats
        t_zrl = time_call(lambda: from_importance_weights(*args), repeats=repeats)
        t_torch = time_call(lambda: torch_vtrace(*targs), repeats=repeats)
        t_np = time_call(lambda: numpy_vtrace(*args), repeats=repeats)
        nbytes = (6 * T * B + B) * 4
        result.add(
            T=T,
            B=B,
            zrl_us=t_zrl.median_us,
            torch_us=t_torch.median_us,
            numpy_us=t_np.median_us,
            **{"zrl_GB/s": nbytes / t_zrl.median_s / 1e9},
            x_torch=t_torch.median_s / t_zrl.median_s,
            x_numpy=t_np.median_s / t_zrl.median_s,
        )
    result.notes.append(
        "Medians of repeated timed batches after a warm-up; numpy float32 inputs through "
        "zrl.algorithms.vtrace.from_importance_weights (argument checks included); torch with 1 thread."
    )
    result.notes.append("x_torch / x_numpy: how many times faster zrl is than that reference in this run.")
    return result
