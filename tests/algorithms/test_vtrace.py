"""V-trace: the shipped C++ kernel against a slow reference written like the paper."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from zrl.algorithms.vtrace import VTraceReturns, from_importance_weights


def reference_vtrace(log_rhos, discounts, rewards, values, bootstrap, rho_bar=1.0, pg_rho_bar=1.0, c_bar=1.0, lam=1.0):
    """vs_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t, in float64 double loops.

    delta_t = min(rho_bar, rho_t) (r_t + gamma_t V(x_{t+1}) - V(x_t)), c_i = lam * min(c_bar, rho_i),
    V(x_T) = bootstrap; pg_s = min(pg_rho_bar, rho_s) (r_s + gamma_s vs_{s+1} - V(x_s)), vs_T = bootstrap.
    None thresholds mean no clipping.
    """
    clip = lambda x, bar: x if bar is None else min(bar, x)  # noqa: E731
    T, B = log_rhos.shape
    rho = np.exp(log_rhos.astype(np.float64))
    vs = np.zeros((T, B))
    pg = np.zeros((T, B))
    for b in range(B):
        V = lambda t: float(values[t, b]) if t < T else float(bootstrap[b])  # noqa: E731
        for s in range(T):
            total = 0.0
            for t in range(s, T):
                prod = 1.0
                for i in range(s, t):  # prod_{i=s}^{t-1}
                    prod *= discounts[i, b] * lam * clip(rho[i, b], c_bar)
                delta = clip(rho[t, b], rho_bar) * (rewards[t, b] + discounts[t, b] * V(t + 1) - V(t))
                total += prod * delta
            vs[s, b] = V(s) + total
        for s in range(T):
            vs_next = vs[s + 1, b] if s + 1 < T else float(bootstrap[b])
            pg[s, b] = clip(rho[s, b], pg_rho_bar) * (rewards[s, b] + discounts[s, b] * vs_next - V(s))
    return vs, pg


def make_inputs(T, B, seed, log_rho_scale=1.0, term_prob=0.2):
    rng = np.random.default_rng(seed)
    log_rhos = (rng.normal(size=(T, B)) * log_rho_scale).astype(np.float32)
    discounts = np.where(rng.random((T, B)) < term_prob, 0.0, 0.9).astype(np.float32)
    rewards = rng.normal(size=(T, B)).astype(np.float32)
    values = rng.normal(size=(T, B)).astype(np.float32)
    bootstrap = rng.normal(size=B).astype(np.float32)
    return log_rhos, discounts, rewards, values, bootstrap


CASES = [
    # (T, B, rho_bar, pg_rho_bar, c_bar, lambda)
    (7, 5, 1.0, 1.0, 1.0, 1.0),
    (9, 4, 1.3, 0.8, 0.9, 1.0),
    (6, 3, 1.0, 1.0, 1.0, 0.7),
    (8, 2, None, None, None, 1.0),
    (1, 5, 1.0, 1.0, 1.0, 1.0),  # T = 1
    (10, 1, 1.0, 1.0, 1.0, 0.95),  # B = 1
    (1, 1, 2.0, 0.5, 1.5, 0.5),
]


@pytest.mark.parametrize("T,B,rho_bar,pg_rho_bar,c_bar,lam", CASES)
def test_matches_paper_reference(T, B, rho_bar, pg_rho_bar, c_bar, lam):
    args = make_inputs(T, B, seed=T * 100 + B)
    # Ratios on both sides of every threshold.
    rho = np.exp(args[0])
    for bar in (rho_bar, pg_rho_bar, c_bar):
        if bar is not None and T * B >= 6:
            assert (rho < bar).any() and (rho > bar).any()
    got = from_importance_weights(*args, clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar, clip_c_threshold=c_bar, lambda_=lam)
    want_vs, want_pg = reference_vtrace(*args, rho_bar=rho_bar, pg_rho_bar=pg_rho_bar, c_bar=c_bar, lam=lam)
    np.testing.assert_allclose(got.vs, want_vs, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got.pg_advantages, want_pg, rtol=2e-5, atol=2e-5)


def test_terminations_cut_the_trace():
    # A termination at t=1 in column 0: vs_0 must not depend on anything after t=1.
    log_rhos, discounts, rewards, values, bootstrap = make_inputs(5, 2, seed=3, term_prob=0.0)
    discounts[1, 0] = 0.0
    a = from_importance_weights(log_rhos, discounts, rewards, values, bootstrap)
    rewards2 = rewards.copy()
    rewards2[2:, 0] += 100.0
    bootstrap2 = bootstrap.copy()
    bootstrap2[0] += 100.0
    b = from_importance_weights(log_rhos, discounts, rewards2, values, bootstrap2)
    np.testing.assert_allclose(a.vs[:2, 0], b.vs[:2, 0], rtol=1e-6)
    assert not np.allclose(a.vs[2:, 0], b.vs[2:, 0])


def test_on_policy_is_n_step_return():
    # pi == mu, lambda 1: vs_s is the discounted return bootstrapped with V(x_T).
    T = 4
    rewards = np.array([[1.0], [2.0], [3.0], [4.0]], np.float32)
    discounts = np.full((T, 1), 0.5, np.float32)
    values = np.full((T, 1), 7.0, np.float32)
    bootstrap = np.array([8.0], np.float32)
    out = from_importance_weights(np.zeros((T, 1), np.float32), discounts, rewards, values, bootstrap)
    expect = [1 + 0.5 * (2 + 0.5 * (3 + 0.5 * (4 + 0.5 * 8)))]
    np.testing.assert_allclose(out.vs[0], expect, rtol=1e-6)


def test_golden_values():
    # Computed by hand from the definition (float64), T=2, B=1, rho_0 = e^0.5 (clipped to 1), rho_1 = e^-0.5.
    log_rhos = np.array([[0.5], [-0.5]], np.float32)
    discounts = np.array([[0.9], [0.9]], np.float32)
    rewards = np.array([[1.0], [-1.0]], np.float32)
    values = np.array([[0.5], [2.0]], np.float32)
    bootstrap = np.array([1.0], np.float32)
    out = from_importance_weights(log_rhos, discounts, rewards, values, bootstrap)
    r1 = math.exp(-0.5)
    delta1 = r1 * (-1.0 + 0.9 * 1.0 - 2.0)
    vs1 = 2.0 + delta1
    delta0 = 1.0 * (1.0 + 0.9 * 2.0 - 0.5)
    c0 = min(1.0, math.exp(0.5))  # = 1: the trace coefficient is clipped too
    vs0 = 0.5 + delta0 + 0.9 * c0 * delta1
    np.testing.assert_allclose(out.vs[:, 0], [vs0, vs1], rtol=1e-6)
    np.testing.assert_allclose(out.pg_advantages[:, 0], [1.0 * (1.0 + 0.9 * vs1 - 0.5), r1 * (-1.0 + 0.9 * 1.0 - 2.0)], rtol=1e-6)
    # The same numbers, written out (float64 evaluation of the lines above).
    np.testing.assert_allclose(out.vs[:, 0], [1.6536570531, 0.7262856146], rtol=1e-6)
    np.testing.assert_allclose(out.pg_advantages[:, 0], [1.1536570531, -1.2737143854], rtol=1e-6)


def test_returns_named_tuple_of_numpy_for_numpy():
    out = from_importance_weights(*make_inputs(3, 2, 0))
    assert isinstance(out, VTraceReturns)
    assert isinstance(out.vs, np.ndarray) and out.vs.dtype == np.float32 and out.vs.shape == (3, 2)
    assert out.pg_advantages.shape == (3, 2)


def test_torch_in_torch_out_without_gradient():
    args = [torch.from_numpy(a) for a in make_inputs(6, 3, 1)]
    values = args[3].clone().requires_grad_(True)
    args[3] = values
    out = from_importance_weights(*args)
    assert isinstance(out.vs, torch.Tensor) and out.vs.dtype == torch.float32
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad
    ref = from_importance_weights(*[a.detach().numpy() for a in args])
    np.testing.assert_array_equal(out.vs.numpy(), ref.vs)


def test_non_contiguous_inputs_are_handled():
    args = list(make_inputs(8, 4, 2))
    big = np.zeros((8, 8), np.float32)
    big[:, ::2] = args[2]
    args_nc = list(args)
    args_nc[2] = big[:, ::2]
    assert not args_nc[2].flags.c_contiguous
    np.testing.assert_array_equal(from_importance_weights(*args_nc).vs, from_importance_weights(*args).vs)


@pytest.mark.parametrize(
    "index,bad,name",
    [
        (0, np.zeros((3, 2), np.float64), "log_rhos"),
        (1, np.zeros((3, 3), np.float32), "discounts"),
        (2, np.zeros((3,), np.float32), "rewards"),
        (3, np.zeros((2, 2), np.float32), "values"),
        (4, np.zeros((3,), np.float32), "bootstrap_value"),
        (4, [0.0, 0.0], "bootstrap_value"),
        (1, np.zeros((3, 2), np.int32), "discounts"),
    ],
)
def test_bad_arguments_name_the_argument(index, bad, name):
    args = list(make_inputs(3, 2, 0))
    args[index] = bad
    with pytest.raises(ValueError, match=name):
        from_importance_weights(*args)


def test_bad_parameters_raise():
    args = make_inputs(3, 2, 0)
    with pytest.raises(ValueError, match="lambda_"):
        from_importance_weights(*args, lambda_=1.5)
    with pytest.raises(ValueError, match="clip_c_threshold"):
        from_importance_weights(*args, clip_c_threshold=0.0)
    with pytest.raises(ValueError, match="log_rhos"):
        from_importance_weights(np.zeros((0, 2), np.float32), *args[1:])


def test_cuda_tensor_is_refused_clearly():
    # No GPU here: a meta-device tensor stands in for "not on the CPU".
    args = [torch.from_numpy(a) for a in make_inputs(3, 2, 0)]
    args[2] = torch.empty((3, 2), device="meta")
    with pytest.raises(ValueError, match="rewards"):
        from_importance_weights(*args)
