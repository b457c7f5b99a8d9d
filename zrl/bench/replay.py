"""`zrl bench replay`: zrl's C++ prioritised replay against cpprb's
PrioritizedReplayBuffer and a plain vectorised numpy sum-tree.

Two workloads, each filled to capacity before anything is timed:

- cartpole: capacity 1,000,000 of obs float32[4], action int64, reward
  float32, next_obs float32[4], done bool (45 bytes a transition);
- atari: capacity 100,000 of obs uint8[84, 84], action int64, reward
  float32, next_obs uint8[84, 84], done bool (14 kB a transition). Single
  frames, not 4-frame stacks: with next_obs a stack would need 5.6 GB per
  implementation, too much for a shared machine; a single frame keeps what
  the benchmark is about (a gather of large rows) at a quarter of the bytes.

Figures, each the median over interleaved rounds (every implementation is
timed once per round, so a noisy neighbour hits all of them alike):

- add/s: transitions per second added in batches of 256 to a full buffer;
- sample/s: sample(512, beta=0.4) calls per second;
- update/s: update_priorities(512) calls per second, fresh random priorities
  every call (cpprb, like a sum-tree that compares, would otherwise be
  flattered by unchanged values);
- cycle/s: sample(512) + update_priorities(512) pairs per second, the
  learner's inner loop.

The numpy reference is the textbook structure: a binary sum-tree and
min-tree in two float64 arrays (power-of-two padded), batched set and
descent vectorised over the batch with one numpy operation per tree level.
"""
from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from zrl.bench.harness import BenchOptions, BenchResult, Timing, percentile
from zrl.replay import PrioritizedReplay

ALPHA = 0.6
BETA = 0.4
SAMPLE_BATCH = 512
ADD_BATCH = 256


@dataclass(frozen=True)
class Workload:
    name: str
    capacity: int
    quick_capacity: int
    fields: dict[str, tuple[tuple[int, ...], Any]]

    def batch(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        out = {}
        for name, (shape, dtype) in self.fields.items():
            dt = np.dtype(dtype)
            if dt == np.bool_:
                out[name] = rng.random((n, *shape)) < 0.05
            elif dt.kind == "f":
                out[name] = rng.standard_normal((n, *shape)).astype(dt)
            else:
                out[name] = rng.integers(0, 256 if dt == np.uint8 else 4, (n, *shape)).astype(dt)
        return out


WORKLOADS = [
    Workload(
        "cartpole",
        1_000_000,
        20_000,
        {
            "obs": ((4,), np.float32),
            "action": ((), np.int64),
            "reward": ((), np.float32),
            "next_obs": ((4,), np.float32),
            "done": ((), np.bool_),
        },
    ),
    Workload(
        "atari",
        100_000,
        2_000,
        {
            "obs": ((84, 84), np.uint8),
            "action": ((), np.int64),
            "reward": ((), np.float32),
            "next_obs": ((84, 84), np.uint8),
            "done": ((), np.bool_),
        },
    ),
]


class NumpyPrioritizedReplay:
    """Prioritised replay with a binary sum-tree and min-tree in numpy, vectorised over the batch.

    The tree has 2 * size float64 nodes (size = capacity rounded up to a power
    of two, leaves at [size, 2 * size)); set and sample walk the levels with
    one fancy-indexing operation per level for the whole batch.
    """

    def __init__(self, capacity: int, fields: dict[str, tuple[tuple[int, ...], Any]], alpha: float, seed: int = 0):
        self.capacity = capacity
        self.alpha = alpha
        self.size = 1 << max(1, math.ceil(math.log2(capacity)))
        self.depth = int(math.log2(self.size))
        self.sum = np.zeros(2 * self.size)
        self.min = np.full(2 * self.size, np.inf)
        self.storage = {k: np.empty((capacity, *shape), dtype) for k, (shape, dtype) in fields.items()}
        self.cursor = 0
        self.count = 0
        self.max_priority = 1.0
        self.rng = np.random.default_rng(seed)

    def _set(self, slots: np.ndarray, scaled: np.ndarray) -> None:
        i = slots + self.size
        self.sum[i] = scaled
        self.min[i] = scaled
        for _ in range(self.depth):
            i = i >> 1  # repeated parents just recompute the same value
            self.sum[i] = self.sum[2 * i] + self.sum[2 * i + 1]
            self.min[i] = np.minimum(self.min[2 * i], self.min[2 * i + 1])

    def add(self, batch: dict[str, np.ndarray]) -> None:
        n = len(next(iter(batch.values())))
        slots = (self.cursor + np.arange(n)) % self.capacity
        for k, v in batch.items():
            self.storage[k][slots] = v
        self._set(slots, np.full(n, self.max_priority**self.alpha))
        self.cursor = (self.cursor + n) % self.capacity
        self.count = min(self.count + n, self.capacity)

    def sample(self, n: int, beta: float):
        total = self.sum[1]
        u = (np.arange(n) + self.rng.random(n)) * (total / n)
        i = np.ones(n, dtype=np.int64)
        for _ in range(self.depth):
            left = self.sum[2 * i]
            right = u >= left
            u = np.where(right, u - left, u)
            i = 2 * i + right
        slots = np.minimum(i - self.size, self.count - 1)  # rounding can step past the last leaf
        weights = (self.sum[slots + self.size] / self.min[1]) ** -beta
        return slots, weights.astype(np.float32), {k: v[slots] for k, v in self.storage.items()}

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self._set(slots, priorities**self.alpha)


class _Impl:
    """One implementation behind a common face: add(batch), sample() -> keys, update(keys, p)."""

    def __init__(self, name: str, add: Callable, sample: Callable, update: Callable, close: Callable = lambda: None):
        self.name, self.add, self.sample, self.update, self.close = name, add, sample, update, close


def _zrl(w: Workload, capacity: int) -> _Impl:
    rb = PrioritizedReplay(capacity, w.fields, alpha=ALPHA, seed=0)
    return _Impl("zrl", rb.add, lambda: rb.sample(SAMPLE_BATCH, BETA)[0], rb.update_priorities)


def _numpy(w: Workload, capacity: int) -> _Impl:
    rb = NumpyPrioritizedReplay(capacity, w.fields, ALPHA)
    return _Impl("numpy", rb.add, lambda: rb.sample(SAMPLE_BATCH, BETA)[0], rb.update_priorities)


def _cpprb(w: Workload, capacity: int) -> _Impl:
    import cpprb  # lazy: optional (the bench extra)

    env = {k: {"shape": shape if shape else 1, "dtype": dtype} for k, (shape, dtype) in w.fields.items()}
    rb = cpprb.PrioritizedReplayBuffer(capacity, env, alpha=ALPHA)
    return _Impl(
        "cpprb",
        lambda batch: rb.add(**batch),
        lambda: rb.sample(SAMPLE_BATCH, beta=BETA)["indexes"],
        rb.update_priorities,
    )


def _interleaved(fns: dict[str, Callable[[], Any]], rounds: int, min_batch_s: float) -> dict[str, Timing]:
    """Per-call timings of several callables, one timed batch of each per round."""
    calls = {}
    for name, fn in fns.items():
        fn()  # warm up
        n, dt = 1, 0.0
        while dt < min_batch_s and n < 1 << 20:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            dt = time.perf_counter() - t0
            if dt < min_batch_s:
                n = max(2 * n, int(n * min_batch_s / max(dt, 1e-9)))
        calls[name] = n
    per_call: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            n = calls[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            per_call[name].append((time.perf_counter() - t0) / n)
    return {name: Timing(per_call[name], calls[name]) for name in fns}


def _fill(impl: _Impl, w: Workload, capacity: int, rng: np.random.Generator) -> float:
    """Fills the buffer to capacity; returns the seconds it took (page faults included)."""
    batch = w.batch(ADD_BATCH, rng)
    t0 = time.perf_counter()
    for _ in range(-(-capacity // ADD_BATCH)):
        impl.add(batch)
    return time.perf_counter() - t0


def _measure(impls: list[_Impl], w: Workload, rounds: int, min_batch_s: float, rng: np.random.Generator):
    pool = [rng.uniform(0.01, 2.0, SAMPLE_BATCH) for _ in range(61)]  # fresh values every call
    add_batch = w.batch(ADD_BATCH, rng)
    state = {"i": 0}

    def priorities() -> np.ndarray:
        state["i"] += 1
        return pool[state["i"] % len(pool)]

    def cycle(impl: _Impl) -> Callable[[], None]:
        return lambda: impl.update(impl.sample(), priorities())

    fixed_keys = {impl.name: impl.sample() for impl in impls}
    timings = {}
    for what, make in (
        ("cycle", cycle),
        ("sample", lambda impl: impl.sample),
        ("update", lambda impl: (lambda: impl.update(fixed_keys[impl.name], priorities()))),
        ("add", lambda impl: (lambda: impl.add(add_batch))),
    ):
        timings[what] = _interleaved({impl.name: make(impl) for impl in impls}, rounds, min_batch_s)
    return timings


def run(opts: BenchOptions) -> BenchResult:
    result = BenchResult(
        name="replay",
        title="Prioritised replay: zrl C++ vs cpprb vs numpy sum-tree (sample/update batch 512, add batch 256)",
        columns=["workload", "capacity", "impl", "cycle/s", "sample/s", "update/s", "add tr/s",
                 "x_cpprb_cycle", "x_cpprb_sample", "x_cpprb_add"],
    )
    try:
        import cpprb  # noqa: F401  # lazy: optional (the bench extra): the reference is skipped without it

        have_cpprb = True
    except ImportError:
        have_cpprb = False
        result.columns = [c for c in result.columns if not c.startswith("x_cpprb")]
        result.notes.append("cpprb is NOT installed (pip install cpprb, or the [bench] extra): "
                            "no cpprb rows and no x_cpprb ratios in this run.")
    rounds = 3 if opts.quick else max(opts.repeats, 5)
    min_batch_s = 0.02 if opts.quick else 0.1
    rng = np.random.default_rng(0)
    makers = [("zrl", _zrl)] + ([("cpprb", _cpprb)] if have_cpprb else []) + [("numpy", _numpy)]
    fill_s: dict[str, dict[str, float]] = {}
    for w in WORKLOADS:
        capacity = w.quick_capacity if opts.quick else w.capacity
        impls = []
        fill_s[w.name] = {}
        for name, make in makers:
            impl = make(w, capacity)
            fill_s[w.name][name] = _fill(impl, w, capacity, rng)
            impls.append(impl)
        timings = _measure(impls, w, rounds, min_batch_s, rng)
        per_s = {what: {n: 1.0 / t.median_s for n, t in ts.items()} for what, ts in timings.items()}
        for impl in impls:
            n = impl.name
            row: dict[str, Any] = {
                "workload": w.name,
                "capacity": capacity,
                "impl": n,
                "cycle/s": per_s["cycle"][n],
                "sample/s": per_s["sample"][n],
                "update/s": per_s["update"][n],
                "add tr/s": per_s["add"][n] * ADD_BATCH,
            }
            if have_cpprb:
                row["x_cpprb_cycle"] = per_s["cycle"][n] / per_s["cycle"]["cpprb"]
                row["x_cpprb_sample"] = per_s["sample"][n] / per_s["sample"]["cpprb"]
                row["x_cpprb_add"] = per_s["add"][n] / per_s["add"]["cpprb"]
            result.add(**row)
        result.extra.setdefault("p90_us", {})[w.name] = {
            what: {n: percentile(t.per_call_s, 90) * 1e6 for n, t in ts.items()} for what, ts in timings.items()
        }
        del impls, timings
        gc.collect()  # the atari buffers are 1.4 GB each
    result.extra["fill_s"] = fill_s
    result.notes += [
        f"Medians over {rounds} interleaved rounds (each implementation timed once per round) on full buffers; "
        "cycle = sample(512, beta=0.4) + update_priorities(512) with fresh random priorities.",
        "add tr/s: transitions per second in add() calls of 256 to a full (wrapping) buffer.",
        "cartpole: obs/next_obs float32[4], action int64, reward float32, done bool; atari: obs/next_obs "
        "uint8[84,84] single frames (not 4-stacks, to fit 3 implementations in memory), same scalars.",
        "zrl always checks keys for staleness (slot generations); cpprb runs with its default "
        "check_for_update=False. numpy: binary float64 sum/min trees, one vectorised op per level.",
    ]
    if opts.quick:
        result.notes.append(
            "QUICK run: small capacities (20,000 / 2,000), few rounds; a smoke test, not a measurement."
        )
    return result
