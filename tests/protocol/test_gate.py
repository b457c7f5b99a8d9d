"""wire.Gate: the learner's checks, with the C++ FrameGate for layouts it has accepted before.

The fast path may only ever vouch: on any frame, a gate with it must give exactly what
a gate without it (decode, the schema and its rules in Python) gives, the same message or
the same rejection reason.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from zrl import spaces, wire
from zrl.protocol import gate as gate_module
from zrl.algorithms.apex_dqn.algorithm import ApexDQN
from zrl.algorithms.impala.algorithm import Impala
from zrl.config import load_config
from helpers import CAP, KINDS, ROOT, chunk, impala_gate, outcome, small_config


def test_registered_layouts_skip_python_decode(monkeypatch):
    cfg = small_config()
    gate = impala_gate(True, cfg)
    first = bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg, 0), sender_id=3, seq=1))
    msg, bindings = gate.check(first)
    assert bindings == {"T": 5, "K": 4, "M": 2}

    def no_python(*a, **k):
        raise AssertionError("decode called for a layout the C++ gate knows")

    monkeypatch.setattr(gate_module, "decode", no_python)
    arrays = chunk(cfg, 1)
    msg, bindings = gate.check(bytes(wire.encode(wire.Kind.TRAJECTORY, arrays, sender_id=9, seq=2, policy_version=7)))
    assert (msg.kind, msg.sender_id, msg.seq, msg.policy_version) == (wire.Kind.TRAJECTORY, 9, 2, 7)
    assert bindings == {"T": 5, "K": 4, "M": 2}
    for k, v in arrays.items():
        np.testing.assert_array_equal(msg.arrays[k], v)


def test_bad_values_on_a_registered_layout_are_rejected_by_python():
    cfg = small_config()
    gate = impala_gate(True, cfg)
    gate.check(bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg))))
    for name, value in [("action", 2), ("action", -1), ("final_index", 20), ("final_index", -3)]:
        bad = chunk(cfg)
        bad[name].flat[1] = value
        with pytest.raises(wire.WireError) as e:
            gate.check(bytes(wire.encode(wire.Kind.TRAJECTORY, bad)))
        assert e.value.reason == wire.Reason.BAD_VALUE, (name, value)


@pytest.mark.parametrize("fast", [True, False])
def test_a_nan_or_infinity_in_any_float_array_is_rejected(fast):
    # One NaN reward used to reach the update and turn every weight NaN for good.
    cfg = small_config()
    gate = impala_gate(fast, cfg)
    gate.check(bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg, 0, 2))))  # registers the layout
    for name in ("reward", "behaviour_logp", "obs", "final_obs"):
        for value in (np.nan, np.inf, -np.inf):
            bad = chunk(cfg, 0, 2)
            bad[name].flat[-1] = value
            with pytest.raises(wire.WireError, match=name) as e:
                gate.check(bytes(wire.encode(wire.Kind.TRAJECTORY, bad, seq=1)))
            assert e.value.reason == wire.Reason.BAD_VALUE
    big = chunk(cfg, 0, 2)
    big["reward"].flat[0] = np.finfo(np.float32).max  # large but finite: the value checks are the algorithm's
    gate.check(bytes(wire.encode(wire.Kind.TRAJECTORY, big)))
    if fast:
        assert len(gate._fast) == 1


def test_a_policy_version_past_int64_is_rejected_on_a_registered_layout():
    cfg = small_config()
    fast, slow = impala_gate(True, cfg), impala_gate(False, cfg)
    fast.check(bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg))))
    for hdr in ({"policy_version": 2**64 - 1}, {"seq": 2**63}):
        frame = bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg), **hdr))
        assert fast._fast.check(frame) is None
        assert outcome(fast, frame) == outcome(slow, frame) == ("rejected", wire.Reason.BAD_HEADER)


def test_fast_and_python_gates_agree_on_every_damaged_frame():
    cfg = small_config()
    fast, slow = impala_gate(True, cfg), impala_gate(False, cfg)
    rng = np.random.default_rng(7)
    layouts = [bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg, s, M))) for s, M in [(0, 0), (1, 2), (2, 5)]]
    layouts.append(bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg, 3, 1), meta={"note": "meta moves the arrays"})))
    for frame in layouts:
        assert outcome(fast, frame) == outcome(slow, frame)
    stats = bytes(wire.encode(wire.Kind.STATS, {"episode_return": np.ones(3)}))
    results = {"ok": 0, "rejected": 0}
    for i in range(4000):
        b = bytearray(layouts[i % len(layouts)])
        kind = i % 5
        if kind == 0:  # a byte anywhere
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        elif kind == 1:  # a byte in the header or descriptors
            b[int(rng.integers(0, wire.HEADER_SIZE + 8 * wire.DESCRIPTOR_SIZE))] ^= 1 << int(rng.integers(0, 8))
        elif kind == 2:  # a value: action / final_index rows, read as little-endian ints
            msg = wire.decode(bytes(b))
            info = next(x for x in msg.infos if x.name == ("action" if i % 2 else "final_index"))
            if info.nbytes:
                at = info.offset + int(rng.integers(0, info.nbytes // info.dtype.itemsize)) * info.dtype.itemsize
                b[at : at + info.dtype.itemsize] = int(rng.integers(-3, 25)).to_bytes(info.dtype.itemsize, "little", signed=True)
        elif kind == 3:  # length
            b = b[: int(rng.integers(0, len(b)))] if i % 2 else b + bytes(int(rng.integers(1, 80)))
        else:  # the meta length, a field the descriptors do not cover
            b[32:36] = int(rng.integers(0, 300)).to_bytes(4, "little")
        got = outcome(fast, bytes(b))
        assert got == outcome(slow, bytes(b)), i
        results[got[0]] += 1
    assert outcome(fast, stats) == outcome(slow, stats) and outcome(fast, stats)[0] == "ok"
    assert results["ok"] > 500 and results["rejected"] > 1500  # both outcomes well exercised


def test_new_checks_forget_registered_layouts():
    cfg = small_config()
    gate = impala_gate(True, cfg)
    frame = bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg)))
    gate.check(frame)
    assert len(gate._fast) == 1
    # A narrower action space: the action bound the C++ gate holds no longer applies.
    algo = Impala(cfg, spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(1))
    gate.set_trajectory_schema(algo.trajectory_schema(8))
    assert len(gate._fast) == 0
    with pytest.raises(wire.WireError, match="action"):
        gate.check(frame)


def test_schemas_with_rules_the_fast_gate_lacks_stay_on_the_python_path():
    cfg = load_config(ROOT / "configs" / "cartpole_apex.yaml")
    algo = ApexDQN(cfg, spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2))
    schema = algo.trajectory_schema(8)
    assert not schema.vouchable  # its discounts and priorities are held to ranges
    gate = wire.Gate(CAP, KINDS)
    gate.set_trajectory_schema(schema)
    N = 6
    arrays = {
        "obs": np.zeros((N, 4), np.float32), "action": np.ones(N, np.int64), "reward": np.zeros(N, np.float32),
        "discount": np.full(N, 0.99, np.float32), "next_obs": np.zeros((N, 4), np.float32), "priority": np.ones(N, np.float32),
    }
    frame = bytes(wire.encode(wire.Kind.TRAJECTORY, arrays))
    for _ in range(3):
        msg, bindings = gate.check(frame)
        assert bindings == {"N": N}
    assert len(gate._fast) == 0
    arrays["priority"][2] = np.nan  # a float check only Python makes: still caught
    with pytest.raises(wire.WireError, match="priorit"):
        gate.check(bytes(wire.encode(wire.Kind.TRAJECTORY, arrays)))


def test_an_algorithm_that_checks_more_than_its_bounds_is_never_vouched_for():
    class Stricter(Impala):
        def trajectory_schema(self, max_columns):
            schema = super().trajectory_schema(max_columns)
            fields = [wire.Field(f.name, f.dtype, f.shape, high=1.0) if f.name == "reward" else f for f in schema.fields.values()]
            return wire.Schema(fields, schema.fixed, schema.bounds, schema.marks)

    cfg = small_config()
    algo = Stricter(cfg, spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2))
    assert not algo.trajectory_schema(8).vouchable
    gate = impala_gate(True, cfg, algo)
    good = chunk(cfg)
    for _ in range(3):
        gate.check(bytes(wire.encode(wire.Kind.TRAJECTORY, good)))
    assert len(gate._fast) == 0
    good["reward"][0, 0] = 2.0
    with pytest.raises(wire.WireError, match="reward must be <= 1"):
        gate.check(bytes(wire.encode(wire.Kind.TRAJECTORY, good)))


def test_a_view_with_wide_items_is_left_to_python():
    cfg = small_config()
    fast, slow = impala_gate(True, cfg), impala_gate(False, cfg)
    frame = bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg)))
    fast.check(frame)
    assert len(fast._fast) == 1
    wide = memoryview(np.frombuffer(frame, np.uint32))  # len() counts 4-byte items, not bytes
    assert fast._fast.check(wide) is None
    assert outcome(fast, wide) == outcome(slow, wide) and outcome(fast, wide)[0] == "rejected"


def test_more_layouts_than_the_table_holds():
    cfg = small_config("actor.num_envs=8")
    fast, slow = impala_gate(True, cfg), impala_gate(False, cfg)
    frames = []
    for K in range(1, 9):
        for M in range(0, 10):
            shape = SimpleNamespace(actor=SimpleNamespace(unroll_length=cfg.actor.unroll_length, num_envs=K))
            a = chunk(shape, seed=K * 10 + M, M=min(M, 5 * K))
            frames.append(bytes(wire.encode(wire.Kind.TRAJECTORY, a, seq=len(frames))))
    assert len(set(f[wire.HEADER_SIZE : wire.HEADER_SIZE + 8 * wire.DESCRIPTOR_SIZE] for f in frames)) > 64
    for _ in range(3):  # the table fills, then replaces its slots in turn
        for f in frames:
            got = outcome(fast, f)
            assert got[0] == "ok" and got == outcome(slow, f)
    assert len(fast._fast) == 64 == len(fast._layouts) and len(fast._blocks) == 64


@pytest.mark.parametrize("fast", [True, False])
def test_truncation_data_that_does_not_add_up_is_rejected(fast):
    # Each is a way a buggy sender could make the loss bootstrap where it must not (or not
    # where it must); both paths refuse them as bad_value, the fast one after vouching for good ones.
    cfg = small_config()
    gate = impala_gate(fast, cfg)
    good = chunk(cfg, 1, M=2)
    for _ in range(2):
        assert outcome(gate, bytes(wire.encode(wire.Kind.TRAJECTORY, good)))[0] == "ok"
    T, K = good["reward"].shape
    fi = good["final_index"]

    def bad(**edit):
        a = {k: v.copy() for k, v in good.items()}
        for name, fn in edit.items():
            fn(a[name])
        return outcome(gate, bytes(wire.encode(wire.Kind.TRAJECTORY, a)))

    def set_at(p, v):
        return lambda x: x.reshape(-1).__setitem__(p, v)

    rejected = ("rejected", wire.Reason.BAD_VALUE)
    free = next(p for p in range(T * K) if p not in fi)
    assert bad(terminated=set_at(fi[0], True)) == rejected            # a final observation at a terminated step
    assert bad(truncated=set_at(free, True)) == rejected              # a truncated step without one
    assert bad(truncated=set_at(fi[1], False)) == rejected            # one at a step that is not truncated
    assert bad(final_index=lambda x: x.__setitem__(slice(None), x[::-1].copy())) == rejected  # out of order
    assert bad(final_index=set_at(1, fi[0]), truncated=set_at(fi[1], False)) == rejected      # the same step twice
    assert bad(truncated=lambda x: x.view(np.uint8).reshape(-1).__setitem__(fi[0], 2)) == rejected  # a flag byte not 0/1
    # None of them reached the point of registering another layout.
    assert outcome(gate, bytes(wire.encode(wire.Kind.TRAJECTORY, good)))[0] == "ok"
    if fast:
        assert len(gate._fast) == 1


@pytest.mark.parametrize("fast", [True, False])
def test_a_gate_that_leaves_element_rules_to_the_join_checks_everything_else(fast):
    # The learner's gate (the schema's at_join fields): the values of the arrays collate copies
    # pass through unread (tests/algorithms/test_join.py checks them there); final_index's bound and the
    # marks, and everything structural, are still the gate's.
    cfg = small_config()
    gate = impala_gate(fast, cfg, leave_to_join=True)
    gate.check(bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg, 0, 2))))  # registers the layout
    passes = []
    for name in ("reward", "behaviour_logp", "obs", "final_obs"):
        bad = chunk(cfg, 0, 2)
        bad[name].flat[-1] = np.nan
        passes.append(bad)
    for value in (2, -1):
        bad = chunk(cfg, 0, 2)
        bad["action"].flat[1] = value
        passes.append(bad)
    for frame in passes:
        msg, bindings = gate.check(bytes(wire.encode(wire.Kind.TRAJECTORY, frame)))
        assert bindings == {"T": 5, "K": 4, "M": 2}
    fails = []
    for value in (20, -3):
        bad = chunk(cfg, 0, 2)
        bad["final_index"].flat[1] = value
        fails.append(bad)
    unmarked = chunk(cfg, 0, 2)
    unmarked["truncated"].reshape(-1)[unmarked["final_index"][0]] = False  # a final observation for no truncated step
    fails.append(unmarked)
    both = chunk(cfg, 0, 2)
    both["terminated"].reshape(-1)[both["final_index"][1]] = True  # truncated and terminated
    fails.append(both)
    for frame in fails:
        with pytest.raises(wire.WireError) as e:
            gate.check(bytes(wire.encode(wire.Kind.TRAJECTORY, frame)))
        assert e.value.reason == wire.Reason.BAD_VALUE
    if fast:
        assert len(gate._fast) == 1


def test_fast_and_python_gates_that_leave_rules_to_the_join_agree_on_damaged_frames():
    cfg = small_config()
    fast = impala_gate(True, cfg, leave_to_join=True)
    slow = impala_gate(False, cfg, leave_to_join=True)
    rng = np.random.default_rng(11)
    layouts = [bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg, s, M))) for s, M in [(0, 0), (1, 2), (2, 5)]]
    for frame in layouts:
        assert outcome(fast, frame) == outcome(slow, frame)
    results = {"ok": 0, "rejected": 0}
    for i in range(2000):
        b = bytearray(layouts[i % len(layouts)])
        if i % 2:
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        else:
            b[int(rng.integers(0, wire.HEADER_SIZE + 8 * wire.DESCRIPTOR_SIZE))] ^= 1 << int(rng.integers(0, 8))
        got = outcome(fast, bytes(b))
        assert got == outcome(slow, bytes(b)), i
        results[got[0]] += 1
    assert results["ok"] > 300 and results["rejected"] > 300


def test_a_gate_not_told_of_a_join_checks_every_value():
    # leave_to_join is the consumer's promise that it joins with the at_join rules checked
    # (a stream learner); without it (a replay learner, a benchmark's sink) every rule stays here.
    cfg = small_config()
    gate = wire.Gate(CAP, KINDS)
    algo = Impala(cfg, spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2))
    schema = algo.trajectory_schema(8)
    assert schema.join_fields  # fields it could leave
    gate.set_trajectory_schema(schema)
    assert gate.check(bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg), seq=3)))[0].seq == 3
    bad = chunk(cfg)
    bad["obs"].flat[0] = np.inf
    with pytest.raises(wire.WireError, match="obs"):
        gate.check(bytes(wire.encode(wire.Kind.TRAJECTORY, bad, seq=4)))
    bad = chunk(cfg)
    bad["action"].flat[0] = 2
    with pytest.raises(wire.WireError, match="action"):
        gate.check(bytes(wire.encode(wire.Kind.TRAJECTORY, bad, seq=5)))
