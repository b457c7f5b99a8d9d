"""The learner's batch join with the checks its gate left to it (the schema's at_join fields):
`_core.join_checked` copies chunks' arrays into a batch and checks each element as it
copies it; Impala.collate raises RejectedChunks naming the chunks that broke a rule."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from zrl import _core, spaces, wire
from zrl.algorithms.base import RejectedChunks
from zrl.algorithms.impala.algorithm import Impala
from helpers import small_config

FLOATS = (np.float16, np.float32, np.float64)
INTS = (np.uint8, np.int8, np.int16, np.uint16, np.int32, np.int64, np.uint64)


def _parts(dtype, axis: int, widths=(3, 1, 5), rng=None):
    rng = rng or np.random.default_rng(0)
    parts = []
    for w in widths:
        shape = [4, 2, 3]
        shape[axis] = w
        a = (rng.standard_normal(shape) * 100).astype(dtype) if np.dtype(dtype).kind == "f" else rng.integers(0, 7, shape).astype(dtype)
        a.flags.writeable = False  # as a received frame's views are
        parts.append(a)
    return parts


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("dtype", [*FLOATS, *INTS, np.bool_])
def test_join_checked_joins_as_numpy_does(dtype, axis):
    parts = _parts(dtype, axis)
    want = np.concatenate(parts, axis=axis)
    out = np.empty_like(want)
    kind = np.dtype(dtype).kind
    rule, bound = ("finite", 0) if kind == "f" else ("bound", 8) if kind != "b" else ("bound", 2)
    assert _core.join_checked(parts, axis, out, rule, bound) == []
    np.testing.assert_array_equal(out, want)
    out2 = np.empty_like(want)
    assert _core.join_checked(parts, axis, out2, "none") == []
    np.testing.assert_array_equal(out2, want)


@pytest.mark.parametrize("dtype", FLOATS)
def test_a_nan_or_infinity_is_found_in_its_part_and_still_copied(dtype):
    info = np.finfo(dtype)
    for value in (np.nan, np.inf, -np.inf):
        parts = [p.copy() for p in _parts(dtype, 1)]
        parts[2][3, 4, 2] = value
        parts[0][0, 0, 0] = info.max  # large, tiny, subnormal and negative zero are all finite
        parts[0][0, 0, 1] = info.tiny
        parts[0][0, 1, 0] = info.smallest_subnormal
        parts[1][1, 0, 0] = -0.0
        out = np.empty((4, 9, 3), dtype)
        assert _core.join_checked(parts, 1, out, "finite") == [2], value
        np.testing.assert_array_equal(out, np.concatenate(parts, axis=1))  # NaN compares equal here


@pytest.mark.parametrize("dtype", INTS)
def test_a_bound_reads_elements_as_unsigned(dtype):
    parts = [np.zeros((3, 2), dtype) for _ in range(4)]
    parts[1][2, 1] = 5  # == bound
    if np.dtype(dtype).kind == "i":
        parts[3][0, 0] = -1  # reads as the largest unsigned value
    out = np.empty((3, 8), dtype)
    want = [1, 3] if np.dtype(dtype).kind == "i" else [1]
    assert _core.join_checked(parts, 1, out, "bound", 5) == want
    if np.dtype(dtype).itemsize < 8:  # a bound past the dtype's largest value holds for every element
        assert _core.join_checked(parts, 1, out, "bound", 1 << (8 * np.dtype(dtype).itemsize)) == []


def test_a_flag_other_than_0_or_1_breaks_the_flags_bound():
    parts = [np.zeros((2, 3), np.bool_), np.zeros((2, 3), np.bool_)]
    parts[1].view(np.uint8)[1, 2] = 2  # a bool byte a sender can write
    out = np.empty((2, 6), np.bool_)
    assert _core.join_checked(parts, 1, out, "bound", 2) == [1]


def test_join_checked_refuses_what_it_cannot_join():
    f = np.zeros((4, 2), np.float32)
    out = np.empty((4, 4), np.float32)
    cases = [
        (([f, f.astype(np.float64)], 1, out, "finite"), "dtype"),
        (([f, np.zeros((3, 2), np.float32)], 1, out, "finite"), "dimension 0"),
        (([f, np.zeros((4, 2, 1), np.float32)], 1, out, "finite"), "dimensions"),
        (([f, np.zeros((4, 3), np.float32)], 1, out, "finite"), "along axis"),
        (([f, np.zeros((4, 4), np.float32)[:, ::2]], 1, out, "finite"), "C-contiguous"),
        (([f, f], 2, out, "finite"), "axis 2"),
        (([f, f], 1, out, "odd"), "rule"),
        (([f.astype(np.int32)] * 2, 1, out.astype(np.int32), "finite"), "finite"),
        (([f, f], 1, out, "bound"), "bound"),
        (([f, [0.0]], 1, out, "finite"), r"parts\[1\]"),
        (([f.astype(np.complex128)] * 2, 1, np.empty((4, 4), np.complex128), "none"), "1, 2, 4 or 8 bytes"),
        (([f.astype(">f4")] * 2, 1, np.empty((4, 4), ">f4"), "finite"), "big-endian"),
        (([f, f], 1, np.empty((4, 4), np.float32)[:, :], "finite"), None),  # fine: a sanity case
    ]
    for args, match in cases:
        if match is None:
            assert _core.join_checked(*args) == []
            continue
        with pytest.raises(ValueError, match=match):
            _core.join_checked(*args)
    ro = np.empty((4, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _core.join_checked([f, f], 1, ro, "finite")


def _chunk(cfg, rng, M: int = 0) -> dict:
    T, K = cfg.actor.unroll_length, cfg.actor.num_envs
    a = {
        "obs": rng.standard_normal((T + 1, K, 4)).astype(np.float32),
        "action": rng.integers(0, 2, (T, K)),
        "reward": rng.standard_normal((T, K)).astype(np.float32),
        "terminated": np.zeros((T, K), bool),
        "truncated": np.zeros((T, K), bool),
        "behaviour_logp": rng.standard_normal((T, K)).astype(np.float32),
        "final_index": np.sort(rng.choice(T * K, M, replace=False)).astype(np.int32),
        "final_obs": rng.standard_normal((M, 4)).astype(np.float32),
    }
    a["truncated"].reshape(-1)[a["final_index"]] = True
    return a


def _message(arrays: dict) -> wire.Message:
    return wire.decode(bytes(wire.encode(wire.Kind.TRAJECTORY, arrays)))


def test_collate_rejects_the_chunks_whose_values_break_a_rule_and_names_them():
    cfg = small_config()
    algo = Impala(cfg, spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2))
    rng = np.random.default_rng(1)
    chunks = [_chunk(cfg, rng, M) for M in (0, 2, 1, 0, 1)]
    good = algo.collate([_message(c) for c in chunks], torch.device("cpu"))
    np.testing.assert_array_equal(good["obs"].numpy(), np.concatenate([c["obs"] for c in chunks], axis=1))
    np.testing.assert_array_equal(good["final_obs"].numpy(), np.concatenate([c["final_obs"] for c in chunks]))
    chunks[0]["action"][1, 2] = 2  # outside [0, 2)
    chunks[1]["final_obs"][1, 3] = np.inf  # a final observation
    chunks[2]["obs"][0, 0, 0] = np.nan
    chunks[3]["terminated"].view(np.uint8)[0, 0] = 3
    with pytest.raises(RejectedChunks) as e:
        algo.collate([_message(c) for c in chunks], torch.device("cpu"))
    errors = e.value.errors
    assert sorted(errors) == [0, 1, 2, 3]
    assert all(err.reason == wire.Reason.BAD_VALUE for err in errors.values())
    for i, name in enumerate(("action", "final_obs", "obs", "terminated")):
        assert errors[i].detail.startswith(name + " "), errors[i].detail
    assert "outside [0, 2)" in errors[0].detail and "NaN or an infinity" in errors[2].detail


def test_every_array_a_gate_leaves_to_the_join_is_joined_by_collate():
    # The gate stops reading these arrays: each must be checked by collate, or nothing would.
    cfg = small_config()
    algo = Impala(cfg, spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2))
    rng = np.random.default_rng(2)
    for name in sorted(algo.trajectory_schema(8).join_fields | {"core_h0", "core_c0"}):
        chunks = [_chunk(cfg, rng, 1), _chunk(cfg, rng, 1)]
        for c in chunks:  # an LSTM core's state at the chunk's start, as a recurrent model's actor sends it
            c["core_h0"] = rng.standard_normal((cfg.actor.num_envs, 8)).astype(np.float32)
            c["core_c0"] = rng.standard_normal((cfg.actor.num_envs, 8)).astype(np.float32)
        a = chunks[1][name]
        if a.dtype.kind == "f":
            a.flat[-1] = np.nan
        else:
            a.view(np.uint8).flat[-1] = 0xFF if a.dtype != np.bool_ else 2
        with pytest.raises(RejectedChunks) as e:
            algo.collate([_message(c) for c in chunks], torch.device("cpu"))
        assert list(e.value.errors) == [1] and e.value.errors[1].detail.startswith(name), name


def test_the_join_checks_exactly_the_fields_the_schema_leaves_to_it():
    # final_index keeps its bound at the gate, with its mark; every other field of a chunk is
    # joined by collate, and declared so.
    cfg = small_config("model.lstm_size=8")
    specs = (spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2))
    schema = Impala(cfg, *specs).trajectory_schema(8)
    assert schema.join_fields == set(schema.fields) - {"final_index"}
    assert Impala(small_config(), *specs).trajectory_schema(8).join_fields == schema.join_fields - {"core_h0", "core_c0"}


def test_a_subclass_that_joins_its_own_way_keeps_every_check_at_the_gate():
    # The schema's at_join fields are a promise about the collate of the class that declared
    # the schema: a subclass that joins its own way must declare its schema again.
    class OwnJoin(Impala):
        def collate(self, msgs, device):  # a join that checks nothing
            return {}

    class Declared(OwnJoin):
        def trajectory_schema(self, max_columns):
            return super().trajectory_schema(max_columns)

    cfg = small_config()
    specs = (spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2))
    assert Impala(cfg, *specs).joins_schema_checks()
    assert not OwnJoin(cfg, *specs).joins_schema_checks()
    assert Declared(cfg, *specs).joins_schema_checks()
