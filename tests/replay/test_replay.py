"""zrl.replay: prioritised and uniform replay over the C++ buffers.

Sampling is checked against the definition P(i) = p_i^alpha / sum_k p_k^alpha
with a chi-square test, weights against (N P(i))^-beta / max_k (N P(k))^-beta,
and the tree against a sum over its leaves after concurrent use from Python
threads (the C++ calls release the GIL, so they really overlap).
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from zrl.replay import PrioritizedReplay, UniformReplay

FIELDS = {
    "obs": ((3,), np.float32),
    "id": ((), np.int64),
    "frame": ((2, 2), np.uint8),
    "done": ((), np.bool_),
}


def make_batch(first_id: int, n: int) -> dict[str, np.ndarray]:
    """Items whose every field is derived from their id, so a sample can be checked row by row."""
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    return {
        "obs": (ids[:, None] + np.array([0.0, 0.25, 0.5])).astype(np.float32),
        "id": ids,
        "frame": np.broadcast_to((ids % 251).astype(np.uint8)[:, None, None], (n, 2, 2)).copy(),
        "done": ids % 3 == 0,
    }


def assert_rows_consistent(batch: dict[str, np.ndarray]) -> None:
    ids = batch["id"]
    np.testing.assert_array_equal(batch["obs"], (ids[:, None] + np.array([0.0, 0.25, 0.5])).astype(np.float32))
    frames = np.broadcast_to((ids % 251).astype(np.uint8)[:, None, None], (len(ids), 2, 2))
    np.testing.assert_array_equal(batch["frame"], frames)
    np.testing.assert_array_equal(batch["done"], ids % 3 == 0)


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


# Upper 0.1% points of the chi-square distribution, from
# scipy.stats.chi2.ppf(0.999, df) (also in any chi-square table). Stratified
# draws vary less than independent ones, so the test is conservative: it
# still catches a biased sampler, and a correct one fails 1 time in 1000 at most.
CHI2_999 = {9: 27.877, 16: 39.252, 19: 43.820}


# ---------------------------------------------------------------------------
# Prioritised replay: sampling and weights


def test_sampling_frequencies_follow_priorities_to_the_alpha():
    alpha = 0.6
    rb = PrioritizedReplay(10, FIELDS, alpha=alpha, seed=1)
    priorities = np.arange(1, 11, dtype=np.float64)
    rb.add(make_batch(0, 10), priorities)
    counts = np.zeros(10)
    for _ in range(200):
        _, _, batch = rb.sample(100, beta=0.4)
        counts += np.bincount(batch["id"], minlength=10)
    probs = priorities**alpha / (priorities**alpha).sum()
    assert chi_square(counts, probs) < CHI2_999[9]


def test_sampling_frequencies_after_wrap_and_updates_with_odd_capacity():
    # 17 slots (not a power of two or of 16), overwritten, then re-prioritised.
    alpha = 0.8
    rb = PrioritizedReplay(17, FIELDS, alpha=alpha, seed=2)
    rb.add(make_batch(0, 30))  # ids 13..29 remain
    keys, _, batch = rb.sample(400, beta=1.0)
    order = np.argsort(batch["id"])
    keys, ids = keys[order], batch["id"][order]
    _, first = np.unique(ids, return_index=True)
    assert len(first) == 17
    priorities = np.linspace(0.1, 5.0, 17)
    assert rb.update_priorities(keys[first], priorities) == 17
    counts = np.zeros(17)
    for _ in range(200):
        _, _, b = rb.sample(128, beta=0.4)
        counts += np.bincount(b["id"] - 13, minlength=17)
    probs = priorities**alpha / (priorities**alpha).sum()
    assert chi_square(counts, probs) < CHI2_999[16]


def test_alpha_zero_samples_uniformly():
    rb = PrioritizedReplay(20, FIELDS, alpha=0.0, seed=3)
    rb.add(make_batch(0, 20), np.geomspace(0.01, 100.0, 20))
    counts = np.zeros(20)
    for _ in range(100):
        _, weights, batch = rb.sample(100, beta=0.5)
        counts += np.bincount(batch["id"], minlength=20)
        np.testing.assert_array_equal(weights, 1.0)
    assert chi_square(counts, np.full(20, 1 / 20)) < CHI2_999[19]


def test_weights_are_normalised_importance_weights():
    alpha, beta = 0.7, 0.4
    rb = PrioritizedReplay(8, FIELDS, alpha=alpha, seed=4)
    priorities = np.array([0.5, 1.0, 2.0, 3.0, 8.0])
    rb.add(make_batch(0, 5), priorities)
    keys, weights, batch = rb.sample(300, beta=beta)
    assert keys.dtype == np.int64 and keys.shape == (300,)
    assert weights.dtype == np.float32 and weights.shape == (300,)
    probs = priorities**alpha / (priorities**alpha).sum()
    n = len(rb)
    expected = (n * probs[batch["id"]]) ** -beta / (n * probs.min()) ** -beta
    np.testing.assert_allclose(weights, expected, rtol=1e-5)
    assert weights.max() <= 1.0
    # The item with the smallest priority gets weight exactly 1.
    assert np.all(weights[batch["id"] == 0] == 1.0)


def test_new_items_get_the_largest_priority_seen():
    rb = PrioritizedReplay(10, FIELDS, alpha=0.5, seed=5)
    rb.add(make_batch(0, 2))
    assert rb.max_priority == 1.0
    keys, _, batch = rb.sample(8, beta=0.4)
    rb.update_priorities(keys[:1], np.array([16.0]))
    assert rb.max_priority == 16.0
    rb.add(make_batch(2, 1))
    assert rb._scaled_priorities()[2] == pytest.approx(4.0)  # 16 ** 0.5
    rb.add(make_batch(3, 1), priorities=np.array([0.25], dtype=np.float32))
    assert rb._scaled_priorities()[3] == pytest.approx(0.5)


def test_samples_are_fresh_arrays_with_declared_dtypes_and_shapes():
    rb = PrioritizedReplay(50, FIELDS, seed=6)
    rb.add(make_batch(0, 50))
    keys, weights, batch = rb.sample(64, beta=0.4)
    assert list(batch) == list(FIELDS)
    for name, (shape, dtype) in FIELDS.items():
        assert batch[name].dtype == np.dtype(dtype)
        assert batch[name].shape == (64, *shape)
        assert batch[name].flags.c_contiguous and batch[name].flags.writeable
    assert_rows_consistent(batch)
    batch["obs"][:] = -1.0  # must not reach the storage
    _, _, again = rb.sample(64, beta=0.4)
    assert_rows_consistent(again)


def test_same_seed_same_samples():
    a = PrioritizedReplay(100, FIELDS, seed=7)
    b = PrioritizedReplay(100, FIELDS, seed=7)
    for rb in (a, b):
        rb.add(make_batch(0, 100), np.linspace(0.1, 3.0, 100))
    for _ in range(3):
        ka, wa, ba = a.sample(32, beta=0.5)
        kb, wb, bb = b.sample(32, beta=0.5)
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(wa, wb)
        np.testing.assert_array_equal(ba["id"], bb["id"])


# ---------------------------------------------------------------------------
# Eviction and stale keys


def stored_ids(rb) -> set[int]:
    return set(rb.state_dict()["field/id"].tolist())


def test_eviction_is_first_in_first_out():
    rb = PrioritizedReplay(5, FIELDS, seed=8)
    rb.add(make_batch(0, 3))
    assert len(rb) == 3 and stored_ids(rb) == {0, 1, 2}
    rb.add(make_batch(3, 4))  # ids 5 and 6 overwrite 0 and 1
    assert len(rb) == 5 and stored_ids(rb) == {2, 3, 4, 5, 6}
    _, _, batch = rb.sample(500, beta=0.4)
    assert set(batch["id"].tolist()) == {2, 3, 4, 5, 6}
    rb.add(make_batch(100, 12))  # more than the capacity in one call: the last 5 stay
    assert stored_ids(rb) == {107, 108, 109, 110, 111}
    rb._check_invariants()


def test_updates_for_overwritten_items_are_ignored():
    rb = PrioritizedReplay(4, FIELDS, alpha=1.0, seed=9)
    rb.add(make_batch(0, 4))
    keys, _, batch = rb.sample(64, beta=0.4)
    rb.add(make_batch(4, 2))  # evicts ids 0 and 1
    applied = rb.update_priorities(keys, np.full(64, 50.0))
    assert applied == int(np.sum(batch["id"] >= 2))
    scaled = rb._scaled_priorities()
    # Slots 0 and 1 now hold ids 4 and 5 with the priority they were added with.
    np.testing.assert_array_equal(scaled[:2], [1.0, 1.0])
    for slot in (2, 3):
        assert scaled[slot] == (50.0 if slot in batch["id"] else 1.0)
    rb._check_invariants()


def test_keys_this_buffer_never_issued_are_rejected():
    rb = PrioritizedReplay(8, FIELDS, seed=10)
    rb.add(make_batch(0, 5))
    for bad in (-1, 5, 7, 1 << 32, 1 << 40):
        with pytest.raises(ValueError, match="keys"):
            rb.update_priorities(np.array([bad]), np.array([1.0]))
    # A bad key anywhere in the batch changes nothing.
    with pytest.raises(ValueError, match="keys"):
        rb.update_priorities(np.array([0, 99]), np.array([5.0, 5.0]))
    assert rb._scaled_priorities()[0] == 1.0


# ---------------------------------------------------------------------------
# Capacities and the tree


@pytest.mark.parametrize("capacity", [1, 3, 16, 17, 100, 257, 4099])
def test_any_capacity_keeps_the_tree_consistent(capacity):
    rng = np.random.default_rng(capacity)
    rb = PrioritizedReplay(capacity, FIELDS, alpha=0.6, seed=capacity)
    added = 0
    for n in (1, capacity // 2 + 1, capacity, 7):
        rb.add(make_batch(added, n), rng.uniform(0.1, 10.0, n))
        added += n
        assert len(rb) == min(added, capacity)
    keys, weights, batch = rb.sample(256, beta=0.4)
    assert set(batch["id"].tolist()) <= set(range(added - capacity, added))
    rb.update_priorities(keys, rng.uniform(0.01, 5.0, 256))
    rb._check_invariants()
    leaves = rb._scaled_priorities().astype(np.float64)
    assert len(leaves) == len(rb)
    assert rb._tree_total() == pytest.approx(leaves.sum(), rel=1e-6)
    assert rb._tree_min() == leaves.min()


@pytest.mark.timeout(60)
def test_concurrent_add_sample_and_update_from_python_threads():
    rb = PrioritizedReplay(2000, FIELDS, alpha=0.6, seed=11)
    rb.add(make_batch(0, 100))
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def adder(thread: int) -> None:
        try:
            rng = np.random.default_rng(thread)
            start.wait()
            for i in range(300):
                first = 100 + (thread * 300 + i) * 13
                rb.add(make_batch(first, 13), rng.uniform(0.1, 4.0, 13) if i % 2 else None)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    def learner() -> None:
        try:
            rng = np.random.default_rng(99)
            start.wait()
            for _ in range(300):
                keys, weights, batch = rb.sample(128, beta=0.4)
                assert_rows_consistent(batch)  # never a torn item
                assert np.all((weights > 0) & (weights <= 1))
                rb.update_priorities(keys, rng.uniform(0.01, 10.0, 128))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=adder, args=(t,)) for t in range(2)] + [threading.Thread(target=learner)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=50)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert len(rb) == 2000
    rb._check_invariants()
    leaves = rb._scaled_priorities().astype(np.float64)
    assert rb._tree_total() == pytest.approx(leaves.sum(), rel=1e-6)
    assert rb._tree_min() == leaves.min()


# ---------------------------------------------------------------------------
# Checkpoint state


def test_state_dict_round_trips_through_npz_and_resumes_the_same_samples(tmp_path):
    a = PrioritizedReplay(7, FIELDS, alpha=0.6, seed=12)
    a.add(make_batch(0, 10))
    keys, _, _ = a.sample(16, beta=0.4)
    a.update_priorities(keys, np.linspace(0.1, 3.0, 16))
    state = a.state_dict()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    np.savez(tmp_path / "replay.npz", **state)
    with np.load(tmp_path / "replay.npz", allow_pickle=False) as f:
        loaded = dict(f)
    b = PrioritizedReplay(7, FIELDS, alpha=0.6, seed=999)
    b.load_state_dict(loaded)
    assert len(b) == 7 and b.max_priority == a.max_priority
    np.testing.assert_array_equal(b._scaled_priorities(), a._scaled_priorities())
    ka, wa, ba = a.sample(32, beta=0.4)
    kb, wb, bb = b.sample(32, beta=0.4)
    np.testing.assert_array_equal(ka, kb)
    np.testing.assert_array_equal(wa, wb)
    for name in FIELDS:
        np.testing.assert_array_equal(ba[name], bb[name])
    b._check_invariants()


def test_load_state_dict_rejects_inconsistent_states_and_changes_nothing():
    a = PrioritizedReplay(7, FIELDS, alpha=0.6, seed=13)
    a.add(make_batch(0, 10))
    good = a.state_dict()
    b = PrioritizedReplay(7, FIELDS, alpha=0.6, seed=14)
    b.add(make_batch(50, 3))
    before = b.state_dict()

    def broken(**changes):
        d = {k: v.copy() for k, v in good.items()}
        for k, v in changes.items():
            if v is None:
                del d[k]
            else:
                d[k] = v
        return d

    cases = [
        (broken(capacity=np.array(8)), "capacity"),
        (broken(alpha=np.array(0.5)), "alpha"),
        (broken(cursor=np.array(7)), "cursor"),
        (broken(size=np.array(8)), "size"),
        (broken(generations=np.arange(7)), "generations"),
        (broken(scaled_priorities=np.zeros(7, np.float32)), "scaled_priorities"),
        (broken(**{"field/obs": np.zeros((7, 3), np.float64)}), "field/obs"),
        (broken(**{"field/id": np.zeros(6, np.int64)}), "field/id"),
        (broken(rng_state=np.zeros(4, np.uint64)), "rng_state"),
        (broken(max_priority=None), "max_priority"),
        ({**good, "extra": np.zeros(1)}, "extra"),
        (broken(format_version=np.array(2)), "format_version"),
    ]
    for state, name in cases:
        with pytest.raises(ValueError, match=name):
            b.load_state_dict(state)
    after = b.state_dict()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])


# ---------------------------------------------------------------------------
# Bad arguments


def test_sampling_an_empty_buffer_raises():
    with pytest.raises(ValueError, match="empty"):
        PrioritizedReplay(4, FIELDS, seed=0).sample(1, beta=0.4)
    with pytest.raises(ValueError, match="empty"):
        UniformReplay(4, FIELDS, seed=0).sample(1)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(capacity=0), "capacity"),
        (dict(capacity=2.5), "capacity"),
        (dict(alpha=-0.5), "alpha"),
        (dict(alpha=float("nan")), "alpha"),
        (dict(fields={}), "fields"),
        (dict(fields={"x": ((3,), np.float64)}), "fields"),
        (dict(fields={"x": ((0,), np.float32)}), "fields"),
        (dict(fields={"x": ("abc", np.float32)}), "fields"),
        (dict(fields={"x": np.float32}), "fields"),
        (dict(seed=-1), "seed"),
    ],
)
def test_bad_constructor_arguments_raise_value_error_naming_them(kwargs, name):
    args = dict(capacity=8, fields=FIELDS, alpha=0.6, seed=0) | kwargs
    with pytest.raises(ValueError, match=name):
        PrioritizedReplay(args.pop("capacity"), args.pop("fields"), **args)


def test_bad_add_arguments_raise_value_error_naming_them():
    rb = PrioritizedReplay(8, FIELDS, seed=0)
    good = make_batch(0, 4)
    cases = [
        ({k: v for k, v in good.items() if k != "id"}, None, "missing field 'id'"),
        (good | {"extra": np.zeros(4)}, None, "unexpected field 'extra'"),
        (good | {"obs": good["obs"].astype(np.float64)}, None, r"batch\['obs'\]: expected dtype float32"),
        (good | {"id": good["id"].astype(np.int32)}, None, r"batch\['id'\]: expected dtype int64"),
        (good | {"obs": good["obs"][:, :2]}, None, r"batch\['obs'\]: expected shape \(N, 3\)"),
        (good | {"frame": good["frame"][:3]}, None, r"batch\['frame'\]: has 3 rows"),
        (good | {"obs": good["obs"].tolist()}, None, r"batch\['obs'\]: expected a numpy array"),
        ([good], None, "batch"),
        (good, np.ones(3), "priorities"),
        (good, np.array([1.0, 0.0, 1.0, 1.0]), "priorities"),
        (good, np.array([1.0, -2.0, 1.0, 1.0]), "priorities"),
        (good, np.array([1.0, np.nan, 1.0, 1.0]), "priorities"),
        (good, np.array([1.0, np.inf, 1.0, 1.0]), "priorities"),
        (good, np.array(["a", "b", "c", "d"]), "priorities"),
    ]
    for batch, priorities, message in cases:
        with pytest.raises(ValueError, match=message):
            rb.add(batch, priorities)
    assert len(rb) == 0


def test_bad_sample_and_update_arguments_raise_value_error_naming_them():
    rb = PrioritizedReplay(8, FIELDS, seed=0)
    rb.add(make_batch(0, 4))
    for batch_size in (0, -3, 2.5):
        with pytest.raises(ValueError, match="batch_size"):
            rb.sample(batch_size, beta=0.4)
    for beta in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="beta"):
            rb.sample(4, beta=beta)
    keys, _, _ = rb.sample(4, beta=0.4)
    with pytest.raises(ValueError, match="keys"):
        rb.update_priorities(keys.astype(np.float64), np.ones(4))
    with pytest.raises(ValueError, match="keys"):
        rb.update_priorities(keys.reshape(2, 2), np.ones(4))
    with pytest.raises(ValueError, match="priorities"):
        rb.update_priorities(keys, np.ones(3))
    with pytest.raises(ValueError, match="priorities"):
        rb.update_priorities(keys, np.array([1.0, 1.0, 0.0, 1.0]))
    np.testing.assert_array_equal(rb._scaled_priorities(), 1.0)


def test_zero_row_add_is_a_no_op():
    rb = PrioritizedReplay(8, FIELDS, seed=0)
    rb.add(make_batch(0, 0))
    assert len(rb) == 0


# ---------------------------------------------------------------------------
# Uniform replay


def test_uniform_replay_samples_stored_items_uniformly_and_evicts_fifo():
    rb = UniformReplay(20, FIELDS, seed=15)
    assert rb.capacity == 20
    rb.add(make_batch(0, 25))  # ids 5..24 remain
    assert len(rb) == 20
    counts = np.zeros(20)
    for _ in range(100):
        batch = rb.sample(100)
        assert_rows_consistent(batch)
        assert batch["id"].min() >= 5
        counts += np.bincount(batch["id"] - 5, minlength=20)
    assert chi_square(counts, np.full(20, 1 / 20)) < CHI2_999[19]


def test_uniform_replay_state_round_trips_and_rejects_bad_arguments():
    a = UniformReplay(6, FIELDS, seed=16)
    a.add(make_batch(0, 9))
    b = UniformReplay(6, FIELDS, seed=17)
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(a.sample(10)["id"], b.sample(10)["id"])
    with pytest.raises(ValueError, match="batch_size"):
        a.sample(0)
    with pytest.raises(ValueError, match=r"batch\['id'\]"):
        a.add(make_batch(0, 2) | {"id": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="capacity"):
        UniformReplay(0, FIELDS)
    with pytest.raises(ValueError, match="capacity"):
        b.load_state_dict(UniformReplay(5, FIELDS, seed=0).state_dict())


@pytest.mark.timeout(60)
def test_uniform_replay_concurrent_add_and_sample_never_tear_an_item():
    rb = UniformReplay(500, FIELDS, seed=18)
    rb.add(make_batch(0, 10))
    errors: list[BaseException] = []

    def adder() -> None:
        try:
            for i in range(400):
                rb.add(make_batch(10 + 17 * i, 17))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=adder)
    t.start()
    for _ in range(300):
        assert_rows_consistent(rb.sample(64))
    t.join(timeout=50)
    assert not t.is_alive() and not errors, errors
    assert len(rb) == 500
