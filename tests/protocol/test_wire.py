"""The wire format: round trips, every rejection reason, golden frames."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import zmq

from zrl import wire
from zrl.wire import Kind, Reason, WireError
from helpers import ROOT

GOLDEN = ROOT / "tests" / "data" / "golden"


def frame(kind=Kind.TRAJECTORY, arrays=None, meta=None, **hdr) -> bytes:
    if arrays is None:
        arrays = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    return bytes(wire.encode(kind, arrays, meta, **hdr))


def reason_of(data, **kw) -> Reason:
    with pytest.raises(WireError) as e:
        wire.decode(data, **kw)
    return e.value.reason


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64, np.uint16, np.uint32])
def test_round_trip_every_dtype(dtype):
    a = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    msg = wire.decode(frame(arrays={"a": a}, sender_id=7, seq=123456789012, policy_version=99))
    assert msg.kind == Kind.TRAJECTORY and msg.sender_id == 7 and msg.seq == 123456789012 and msg.policy_version == 99
    got = msg.arrays["a"]
    assert got.dtype == np.dtype(dtype) and got.shape == (2, 3, 4)
    np.testing.assert_array_equal(got, a)


def test_round_trip_scalars_empty_arrays_and_meta():
    arrays = {"scalar": np.float64(2.5), "empty": np.zeros((0, 4), np.float32), "six_dims": np.ones((1, 2, 1, 2, 1, 2), np.uint8)}
    msg = wire.decode(frame(Kind.HELLO, arrays, {"role": "actor", "n": [1, 2]}))
    assert msg.arrays["scalar"].shape == () and msg.arrays["scalar"] == 2.5
    assert msg.arrays["empty"].shape == (0, 4)
    assert msg.arrays["six_dims"].shape == (1, 2, 1, 2, 1, 2)
    assert msg.json() == {"role": "actor", "n": [1, 2]}


def test_big_endian_arrays_cross_as_their_values():
    a = np.array([21.0, -3.5], dtype=">f8")
    msg = wire.decode(frame(Kind.STATS, {"episode_return": a, "n": np.array([7, 8], ">i4")}))
    assert msg.arrays["episode_return"].dtype == np.dtype("<f8")
    np.testing.assert_array_equal(msg.arrays["episode_return"], [21.0, -3.5])
    np.testing.assert_array_equal(msg.arrays["n"], [7, 8])
    # A Layout declared big-endian fills little-endian views: values convert as written.
    out = wire.Layout(Kind.STATS, [("r", ">f4", (2,))]).allocate()
    out.arrays["r"][:] = np.array([1.5, 2.5], ">f4")
    got = wire.decode(bytes(out.finish(sender_id=0, seq=1, policy_version=0)))
    np.testing.assert_array_equal(got.arrays["r"], [1.5, 2.5])


def test_arrays_are_views_over_the_frame_not_copies():
    data = bytearray(frame())
    msg = wire.decode(data)
    x = msg.arrays["x"]
    assert not x.flags.owndata
    assert np.shares_memory(x, np.frombuffer(data, np.uint8))


def test_arrays_are_aligned_to_64_bytes():
    msg = wire.decode(frame(arrays={"a": np.zeros(3, np.uint8), "b": np.zeros(5, np.float64)}, meta="xyz"))
    assert all(info.offset % 64 == 0 for info in msg.infos)


def test_layout_fills_in_place_and_cuts_variable_rows():
    layout = wire.Layout(Kind.TRAJECTORY, [("obs", np.float32, (3, 2)), ("idx", np.int32, (4,)), ("tail", np.float32, (4, 2))])
    out = layout.allocate()
    out.arrays["obs"][:] = 1.5
    out.arrays["idx"][:2] = [5, 6]
    out.arrays["tail"][:2] = [[1, 2], [3, 4]]
    data = bytes(out.finish(sender_id=1, seq=2, policy_version=3, rows={"idx": 2, "tail": 2}))
    assert len(data) < layout.capacity  # the unused tail rows are not sent
    msg = wire.decode(data)
    np.testing.assert_array_equal(msg.arrays["idx"], [5, 6])
    np.testing.assert_array_equal(msg.arrays["tail"], [[1, 2], [3, 4]])
    np.testing.assert_array_equal(msg.arrays["obs"], np.full((3, 2), 1.5))
    with pytest.raises(ValueError, match="capacity"):
        layout.allocate().finish(sender_id=0, seq=0, policy_version=0, rows={"tail": 5})
    with pytest.raises(ValueError, match="not an array"):
        layout.allocate().finish(sender_id=0, seq=0, policy_version=0, rows={"tial": 1})


def test_a_cut_sends_what_its_rows_send_and_is_kept():
    layout = wire.Layout(Kind.TRAJECTORY, [("obs", np.float32, (3, 2)), ("idx", np.int32, (4,)), ("tail", np.float32, (4, 2))])
    cut = layout.cut({"idx": 2, "tail": 1})
    assert layout.cut({"idx": 2, "tail": 1}) is cut  # cached: a sender keeps a few and reuses them
    assert layout.cut() is layout.cut({})  # nothing cut: every array whole
    frames = []
    for rows in (cut, {"idx": 2, "tail": 1}):
        out = layout.allocate()
        out.arrays["idx"][:2] = [7, 8]
        out.arrays["tail"][:1] = [[1, 2]]
        frames.append(bytes(out.finish(sender_id=3, seq=5, policy_version=2, rows=rows)))
        assert out.seal(3, rows) == cut.total == len(frames[-1])
    assert frames[0] == frames[1]
    msg = wire.decode(frames[0])
    assert msg.arrays["idx"].tolist() == [7, 8] and msg.arrays["tail"].shape == (1, 2)
    other = wire.Layout(Kind.TRAJECTORY, [("obs", np.float32, (3, 2)), ("idx", np.int32, (4,)), ("tail", np.float32, (4, 2))])
    with pytest.raises(ValueError, match="another Layout"):
        other.allocate().seal(0, cut)
    with pytest.raises(ValueError, match="capacity"):
        layout.cut({"idx": 5})
    with pytest.raises(ValueError, match="capacity"):
        layout.cut({"idx": -1})
    with pytest.raises(ValueError, match="not an array"):
        layout.cut({"nope": 0})


def test_a_reused_frame_cut_to_other_rows_gets_their_descriptors():
    layout = wire.Layout(Kind.TRAJECTORY, [("obs", np.float32, (3, 2)), ("idx", np.int32, (4,))])
    for seq, rows in enumerate([2, 0, 4, 2, 2], 1):
        out = layout.allocate()  # the same buffer each time: nothing holds the last frame
        out.arrays["idx"][:rows] = np.arange(rows) + seq
        msg = wire.decode(bytes(out.finish(sender_id=4, seq=seq, policy_version=seq, rows={"idx": rows})))
        assert (msg.sender_id, msg.seq, msg.policy_version) == (4, seq, seq)
        np.testing.assert_array_equal(msg.arrays["idx"], np.arange(rows) + seq)
    assert len(layout._finished) == 1


def test_layout_reuses_a_finished_frame_only_once_nothing_holds_it():
    layout = wire.Layout(Kind.TRAJECTORY, [("obs", np.float32, (3, 2)), ("idx", np.int32, (4,))])
    first = layout.allocate()
    first.arrays["obs"][:] = 1
    frame = first.finish(sender_id=0, seq=1, policy_version=0, rows={"idx": 0})
    assert layout.allocate() is not first  # its frame is still held (as ZeroMQ holds one it sends)
    obs = wire.decode(frame).arrays["obs"]
    del frame
    assert layout.allocate() is not first  # a view of the frame still holds it
    del obs
    again = layout.allocate()
    assert again is first and (again.arrays["obs"] == 1).all()
    assert layout.allocate() is not again  # handed out once: not finished, not reused


def test_layout_reuses_the_newest_free_frame():
    layout = wire.Layout(Kind.TRAJECTORY, [("obs", np.float32, (3, 2))])
    msgs = [layout.allocate() for _ in range(5)]
    frames = [m.finish(sender_id=0, seq=i, policy_version=0) for i, m in enumerate(msgs)]
    # As ZeroMQ releases frames: oldest first. 0, 1 and 2 are free, 3 and 4 still held.
    del frames[:3]
    assert layout.allocate() is msgs[2]  # the newest free one: its bytes are the likeliest in cache
    assert layout.allocate() is msgs[1]
    frames.clear()
    assert layout.allocate() is msgs[4]  # all free: the one finished last
    assert layout.allocate() is msgs[3]
    assert layout.allocate() is msgs[0]
    assert all(layout.allocate() is not m for m in msgs)  # every finished frame handed out once


def test_frames_in_flight_in_zeromq_are_never_reused(ctx, endpoint):
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(endpoint)
    push.connect(endpoint)
    layout = wire.Layout(Kind.TRAJECTORY, [("obs", np.uint8, (1 << 17,))])  # above pyzmq's copy threshold: zero-copy, pyzmq holding the frame
    sent = []
    for seq in range(1, 6):
        m = layout.allocate()
        assert all(m is not s for s in sent)  # each still queued in ZeroMQ
        m.arrays["obs"][:] = seq
        push.send(m.finish(sender_id=0, seq=seq, policy_version=0), copy=False)
        sent.append(m)
    del m
    for seq in range(1, 6):
        msg = wire.decode(pull.recv(copy=False))
        assert msg.seq == seq and (msg.arrays["obs"] == seq).all()
    del msg
    push.close(0)
    pull.close(0)


def test_encode_refuses_what_cannot_cross():
    with pytest.raises(ValueError, match="dtype"):
        wire.encode(Kind.STATS, {"o": np.array([object()])})
    with pytest.raises(ValueError, match="name"):
        wire.encode(Kind.STATS, {"x" * 40: np.zeros(1)})
    with pytest.raises(ValueError, match="dims"):
        wire.encode(Kind.STATS, {"x": np.zeros((1,) * 7)})


# --- every rejection reason -------------------------------------------------


def patch_header(data: bytes, field: str, value) -> bytes:
    names = ["magic", "version", "kind", "sender_id", "n_arrays", "seq", "policy_version", "meta_len", "flags", "total_len"]
    vals = list(wire.HEADER.unpack_from(data, 0))
    vals[names.index(field)] = value
    return wire.HEADER.pack(*vals) + data[wire.HEADER_SIZE :]


def patch_descriptor(data: bytes, index: int, field: str, value) -> bytes:
    names = ["name", "dtype", "ndim", "r16", "r32", "d0", "d1", "d2", "d3", "d4", "d5", "offset", "nbytes"]
    off = wire.HEADER_SIZE + index * wire.DESCRIPTOR_SIZE
    vals = list(wire.DESCRIPTOR.unpack_from(data, off))
    vals[names.index(field)] = value
    return data[:off] + wire.DESCRIPTOR.pack(*vals) + data[off + wire.DESCRIPTOR_SIZE :]


def test_rejects_too_short():
    assert reason_of(b"") == Reason.TOO_SHORT
    assert reason_of(frame()[:47]) == Reason.TOO_SHORT


def test_rejects_too_large():
    assert reason_of(frame(), max_bytes=100) == Reason.TOO_LARGE


def test_rejects_bad_magic_version_kind():
    assert reason_of(patch_header(frame(), "magic", b"ZRLX")) == Reason.BAD_MAGIC
    assert reason_of(patch_header(frame(), "version", 2)) == Reason.BAD_VERSION
    assert reason_of(patch_header(frame(), "kind", 250)) == Reason.BAD_KIND


def test_rejects_unexpected_kind():
    assert reason_of(frame(Kind.WEIGHTS), allowed_kinds=frozenset({int(Kind.TRAJECTORY)})) == Reason.UNEXPECTED_KIND


def test_rejects_truncated_frames_at_every_length():
    data = frame(meta={"k": 1})
    reasons = {reason_of(data[:n]) for n in range(len(data))}
    assert reasons <= {Reason.TOO_SHORT, Reason.BAD_LENGTH}
    assert Reason.BAD_LENGTH in reasons


def test_rejects_bad_header_fields():
    assert reason_of(patch_header(frame(), "flags", 1)) == Reason.BAD_HEADER
    assert reason_of(patch_header(frame(), "n_arrays", 65)) == Reason.BAD_HEADER
    assert reason_of(patch_header(frame(), "meta_len", 10**6)) == Reason.BAD_LENGTH
    assert reason_of(patch_header(frame(), "total_len", 5)) == Reason.BAD_LENGTH
    # Readers keep seq and policy_version as int64 (a learner's lag of 2^64 - 1 used to crash it).
    assert reason_of(patch_header(frame(), "policy_version", 2**64 - 1)) == Reason.BAD_HEADER
    assert reason_of(patch_header(frame(), "seq", 2**63)) == Reason.BAD_HEADER
    assert wire.decode(patch_header(frame(), "policy_version", 2**63 - 1)).policy_version == 2**63 - 1


def test_rejects_bad_descriptors():
    f = frame()
    assert reason_of(patch_descriptor(f, 0, "dtype", 99)) == Reason.BAD_DTYPE
    assert reason_of(patch_descriptor(f, 0, "ndim", 7)) == Reason.BAD_DESCRIPTOR
    assert reason_of(patch_descriptor(f, 0, "d3", 2)) == Reason.BAD_DESCRIPTOR  # dims past ndim must be 0
    assert reason_of(patch_descriptor(f, 0, "r32", 1)) == Reason.BAD_DESCRIPTOR
    assert reason_of(patch_descriptor(f, 0, "name", b"")) == Reason.BAD_DESCRIPTOR
    assert reason_of(patch_descriptor(f, 0, "name", b"\xff\xfe")) == Reason.BAD_DESCRIPTOR
    assert reason_of(patch_descriptor(f, 0, "offset", 66)) == Reason.BAD_DESCRIPTOR  # misaligned for float32


def test_rejects_bad_lengths():
    f = frame()
    assert reason_of(patch_descriptor(f, 0, "nbytes", 20)) == Reason.BAD_LENGTH  # 2x3 float32 is 24 bytes
    assert reason_of(patch_descriptor(f, 0, "d1", 1000)) == Reason.BAD_LENGTH
    assert reason_of(patch_descriptor(f, 0, "offset", 8)) == Reason.BAD_LENGTH  # points into the header
    big = patch_descriptor(f, 0, "offset", 1 << 40)
    assert reason_of(big) == Reason.BAD_LENGTH


def test_rejects_an_empty_shape_no_array_can_have():
    # nbytes is 0 (one dim is 0), but numpy would refuse a view of this shape: a
    # plain ValueError from msg.arrays would have escaped the receivers' WireError handling.
    empty = frame(arrays={"x": np.zeros((0, 1, 1, 1), np.float32)})
    huge = empty
    for d in ("d1", "d2", "d3"):
        huge = patch_descriptor(huge, 0, d, 0xFFFFFFFF)
    assert reason_of(huge) == Reason.BAD_SHAPE
    # At the limit: 4 * (2^32 - 1) * (2^29 - 1) bytes < 2^63 is a view; 4 * (2^32 - 1) * 2^31 is not.
    edge = patch_descriptor(patch_descriptor(empty, 0, "d1", 0xFFFFFFFF), 0, "d2", 0x1FFFFFFF)
    assert wire.decode(edge).arrays["x"].shape == (0, 0xFFFFFFFF, 0x1FFFFFFF, 1)
    assert reason_of(patch_descriptor(edge, 0, "d2", 0x80000000)) == Reason.BAD_SHAPE


def test_rejects_duplicate_names():
    two = frame(arrays={"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)})
    assert reason_of(patch_descriptor(two, 1, "name", b"a")) == Reason.BAD_DESCRIPTOR


def test_bad_meta_is_reported_when_read():
    msg = wire.decode(frame(Kind.HELLO, {}, b"\xff not json"))
    with pytest.raises(WireError) as e:
        msg.json()
    assert e.value.reason == Reason.BAD_META
    with pytest.raises(WireError):
        wire.decode(frame(Kind.HELLO, {}, "[1, 2]")).json()  # JSON, but not an object


def test_schema_checks_fields_dtypes_and_symbolic_shapes():
    F = wire.Field
    schema = wire.Schema(
        [F("obs", np.float32, ("T+1", "K", 4)), F("reward", np.float32, ("T", "K")), F("idx", np.int32, ("M",))],
        fixed={"T": 3},
        bounds={"K": (1, 8), "M": (0, 24)},
    )
    good = {"obs": np.zeros((4, 2, 4), np.float32), "reward": np.zeros((3, 2), np.float32), "idx": np.zeros(1, np.int32)}
    assert schema.check(wire.decode(frame(arrays=good))) == {"T": 3, "K": 2, "M": 1}

    def bad(**change):
        arrays = {**good, **change}
        arrays = {k: v for k, v in arrays.items() if v is not None}
        with pytest.raises(WireError) as e:
            schema.check(wire.decode(frame(arrays=arrays)))
        return e.value.reason

    assert bad(idx=None) == Reason.MISSING_FIELD
    assert bad(extra=np.zeros(1, np.float32)) == Reason.UNKNOWN_FIELD
    assert bad(reward=np.zeros((3, 2), np.float64)) == Reason.BAD_DTYPE
    assert bad(obs=np.zeros((5, 2, 4), np.float32)) == Reason.BAD_SHAPE  # T+1 != 4
    assert bad(reward=np.zeros((3, 3), np.float32)) == Reason.BAD_SHAPE  # K disagrees with obs
    assert bad(obs=np.zeros((4, 2, 5), np.float32)) == Reason.BAD_SHAPE
    assert bad(obs=np.zeros((4, 9, 4), np.float32), reward=np.zeros((3, 9), np.float32)) == Reason.BAD_SHAPE  # K > 8
    assert bad(reward=np.zeros((3,), np.float32)) == Reason.BAD_SHAPE


def test_fuzzed_bytes_never_raise_anything_but_wire_error():
    rng = np.random.default_rng(0)
    base = bytearray(frame(meta={"a": 1}))
    for _ in range(3000):
        data = bytearray(base)
        for _ in range(rng.integers(1, 8)):
            data[rng.integers(0, len(data))] = rng.integers(0, 256)
        try:
            msg = wire.decode(bytes(data))
            _ = msg.arrays
        except WireError:
            pass


# --- golden frames ----------------------------------------------------------


def golden_cases():
    manifest = json.loads((GOLDEN / "manifest.json").read_text())
    return sorted(manifest.items())


@pytest.mark.parametrize("name,case", golden_cases())
def test_golden_frames_decode_to_their_values(name, case):
    data = (GOLDEN / case["file"]).read_bytes()
    assert len(data) == case["length"]
    msg = wire.decode(data)
    assert (int(msg.kind), msg.sender_id, msg.seq, msg.policy_version) == (case["kind"], case["sender_id"], case["seq"], case["policy_version"])
    assert [i.name for i in msg.infos] == [a["name"] for a in case["arrays"]]
    for a in case["arrays"]:
        got = msg.arrays[a["name"]]
        assert str(got.dtype) == a["dtype"] and list(got.shape) == a["shape"]
        np.testing.assert_array_equal(got.reshape(-1), np.array(a["values"], dtype=a["dtype"]))
    if case["meta"] is not None:
        assert msg.text() == case["meta"]


@pytest.mark.parametrize("name,case", golden_cases())
def test_encoding_the_golden_values_gives_the_golden_bytes(name, case):
    arrays = {a["name"]: np.array(a["values"], dtype=a["dtype"]).reshape(a["shape"]) for a in case["arrays"]}
    meta = case["meta"]
    data = bytes(wire.encode(Kind(case["kind"]), arrays, meta, sender_id=case["sender_id"], seq=case["seq"], policy_version=case["policy_version"]))
    assert data == (GOLDEN / case["file"]).read_bytes()


def test_header_layout_is_frozen():
    # docs/PROTOCOL.md documents these offsets; the C++ client relies on them.
    data = (GOLDEN / "weights.bin").read_bytes()
    assert data[:4] == b"ZRLW"
    assert struct.unpack_from("<H", data, 4)[0] == 1  # version
    assert struct.unpack_from("<H", data, 6)[0] == int(Kind.WEIGHTS)
    assert struct.unpack_from("<Q", data, 24)[0] == 42  # policy version
    assert struct.unpack_from("<Q", data, 40)[0] == len(data)
    assert data[48:54] == b"params"
