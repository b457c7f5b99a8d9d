"""The per-message hot paths through pyzmq's own libzmq (csrc/wire/zmq_native.h):
transport.Pusher on the actor's side and wire.Gate.drain on the learner's.

Each must deliver exactly what pyzmq's send and recv deliver: the same frames,
the same checks, the same rejections. Sockets are inproc pairs in one context.
"""
from __future__ import annotations

import errno
import gc
import threading
import time
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import zmq

from zrl import _core, spaces, transport, wire
from zrl.protocol import native as native_module
from zrl.algorithms.base import Step
from zrl.actors.sender import Sender
from zrl.algorithms.impala.algorithm import Impala
from helpers import chunk, impala_gate, outcome, small_config


@pytest.fixture
def pair():
    """(push, pull) over inproc, with room for everything a test sends."""
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    for s in (push, pull):
        s.setsockopt(zmq.LINGER, 0)
    push.setsockopt(zmq.SNDHWM, 0)
    pull.setsockopt(zmq.RCVHWM, 0)
    pull.bind("inproc://native-test")
    push.connect("inproc://native-test")
    yield push, pull
    push.close(0)
    pull.close(0)
    ctx.term()


@pytest.fixture
def native_off(monkeypatch):
    """transport.native() as ZRL_NATIVE_ZMQ=0 makes it: None."""
    monkeypatch.setenv(transport.NATIVE_ENV, "0")
    monkeypatch.setattr(native_module, "_native", [])
    assert transport.native() is None and transport.native_note() == f"{transport.NATIVE_ENV}=0"
    yield
    monkeypatch.setattr(native_module, "_native", [])


def native_pusher(sock) -> transport.Pusher:
    """A Pusher on `sock` that sends through C++ (the path these tests are about)."""
    pusher = transport.Pusher(sock)
    assert pusher.api is not None, transport.native_note()
    return pusher


def drain_all(gate: wire.Gate, pull, n: int) -> list:
    out: list = []
    while len(out) < n:
        burst = gate.drain(pull, 64, 5000)  # waits for a burst's first message, as the learner does
        assert burst, f"only {len(out)} of {n} messages arrived"
        out += burst
    return out


def summary(checked):
    if isinstance(checked, wire.WireError):
        return ("rejected", checked.reason)
    msg, bindings = checked
    return ("ok", msg.kind, msg.sender_id, msg.seq, msg.policy_version, bytes(msg.meta), bindings,
            {k: v.tobytes() for k, v in msg.arrays.items()})


def test_pyzmqs_libzmq_is_found_here():
    # The project installs pyzmq's wheel, whose libzmq the C++ paths must find: if this
    # fails, every actor and learner silently runs the slower pyzmq path.
    api = transport.native()
    assert api is not None, transport.native_note()
    assert "libzmq" in api.library and api.library in transport.native_note()


def test_attaching_names_what_does_not_match():
    module = transport.native() and zmq.backend.Socket.__module__
    import sys

    path = sys.modules[module].__file__
    with pytest.raises(RuntimeError, match=r"is libzmq \d+\.\d+\.\d+, but pyzmq reports 9\.9\.9"):
        _core.ZmqNative(path, 9, 9, 9)
    with pytest.raises(RuntimeError, match="is not loaded"):
        _core.ZmqNative("/nonexistent/libzmq-free.so", *zmq.zmq_version_info())


def recorder_frames(cfg, n: int, push_link=None):
    """n chunks of an IMPALA recorder (CartPole-shaped, K envs), as an actor cuts them,
    with a truncation or two. With `push_link` (a Sender's link), the sender sends them;
    what it hands back (a chunk with more truncations than K, framed apart) is sent
    there at once, as the actor does, and counted in the result."""
    algo = Impala(cfg, spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2))
    sender = Sender(5, link=push_link)
    rec = algo.make_recorder(None, num_envs=cfg.actor.num_envs, sender=sender)
    rng = np.random.default_rng(0)
    K, T = cfg.actor.num_envs, cfg.actor.unroll_length
    rec.begin(rng.standard_normal((K, 4)).astype(np.float32))
    out = []
    for t in range(n * T):
        rec.policy_version = t // 3
        rec.record(rng.integers(0, 2, K), {"behaviour_logp": rng.standard_normal(K).astype(np.float32)})
        trunc = rng.random(K) < 0.05
        final = {int(k): rng.standard_normal(4).astype(np.float32) for k in np.flatnonzero(trunc)}
        frames = rec.observe(Step(rng.standard_normal((K, 4)).astype(np.float32), rng.standard_normal(K).astype(np.float32),
                                  np.zeros(K, bool), trunc, final))
        if push_link is None:
            out += [bytes(f) for f in frames]
        for f in frames if push_link is not None else ():
            push_link.pusher.sock.send(f)
            out.append(len(f))
    return out


# A 1 KB chunk and a ~20 KB one (C++ sends copies), a 120 KB one (a SendBuffer, sent uncopied;
# pyzmq's zero-copy send without native()).
@pytest.mark.parametrize("K", [2, 200, 1200])
@pytest.mark.parametrize("native", [True, False])
def test_pusher_and_drain_deliver_what_pyzmq_does(pair, request, K, native):
    if not native:
        request.getfixturevalue("native_off")
    push, pull = pair
    cfg = small_config(f"actor.num_envs={K}", "learner.batch_size=2400")
    expected = recorder_frames(cfg, 12)  # the same chunks, finished in Python
    link = SimpleNamespace(pusher=transport.Pusher(push), sender_id=5)  # (recorder_frames sends as id 5)
    assert (link.pusher.api is not None) == native
    handed_back = recorder_frames(cfg, 12, push_link=link)
    assert len(handed_back) <= 2  # only chunks with more truncations than envs
    gate = impala_gate(True, cfg, cap=1 << 24)  # room for the large chunks
    got = drain_all(gate, pull, len(expected))
    reference = impala_gate(False, cfg, cap=1 << 24)
    assert [summary(c) for c in got] == [outcome(reference, f) for f in expected]
    assert all(c[0] == "ok" for c in map(summary, got)) and len({c[0].seq for c in got}) == len(expected)
    # The 120 KB chunk is of the size that lives in a SendBuffer (the native path sends it uncopied).
    assert all((len(f) >= wire.SEND_ZERO_COPY_FROM) == (K == 1200) for f in expected)
    if native:  # messages from wire.RECV_COPY_BELOW up come out of ZeroMQ uncopied, and stay valid
        large = K > 2
        assert all(isinstance(c[0]._buf, memoryview if large else bytes) for c in got)
        assert all((c[0].nbytes >= wire.RECV_COPY_BELOW) == large for c in got)
        if large:  # views of zrl's own read-only owner of the libzmq message
            assert all(type(c[0]._buf.obj) is _core.ZmqFrame and c[0]._buf.readonly for c in got)
            with pytest.raises(TypeError):  # only drain makes them: an empty one would crash
                type(got[0][0]._buf.obj)()
        last, want = got[-1][0]._buf, summary(got[-1])
        del got
        assert pull.poll(0) == 0
        pull.close(linger=0)  # a message outlives the socket it came from, as long as a view holds it
        assert summary(reference.check(bytes(last))) == want


def test_drain_rejects_what_check_rejects(pair):
    push, pull = pair
    cfg = small_config()
    fast, slow = impala_gate(True, cfg), impala_gate(False, cfg)
    rng = np.random.default_rng(3)
    good = [bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg, s, M), sender_id=s)) for s, M in [(0, 0), (1, 2), (2, 3)]]
    frames = list(good)  # first the good ones: their layouts go to the C++ gate
    for i in range(600):
        b = bytearray(good[i % len(good)])
        if i % 3 == 0:
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        elif i % 3 == 1:
            b[int(rng.integers(0, wire.HEADER_SIZE + 4 * wire.DESCRIPTOR_SIZE))] ^= 1 << int(rng.integers(0, 8))
        else:
            b = b[: int(rng.integers(0, len(b)))]
        frames.append(bytes(b))
    frames.append(bytes(wire.encode(wire.Kind.STATS, {"episode_return": np.ones(2)})))
    for f in frames:
        push.send(f)
    got = [summary(c) for c in drain_all(fast, pull, len(frames))]
    assert got == [outcome(slow, f) for f in frames]
    assert sum(g[0] == "rejected" for g in got) > 200 and sum(g[0] == "ok" for g in got) > 100


@pytest.mark.parametrize("native", [True, False])
def test_drain_waits_for_the_first_message_only(pair, request, native):
    """wait_ms: the first message is waited for (with the C++ path, a blocking receive under
    ZMQ_RCVTIMEO, which is put back after), the rest of the burst is not."""
    if not native:
        request.getfixturevalue("native_off")
    push, pull = pair
    cfg = small_config()
    gate = impala_gate(True, cfg)
    assert (gate._native_drain is not None) == native
    pull.setsockopt(zmq.RCVTIMEO, 1234)
    t0 = time.monotonic()
    assert gate.drain(pull, 64, 30) == []  # nothing comes: back after the wait, empty
    assert time.monotonic() - t0 >= 0.025
    assert pull.getsockopt(zmq.RCVTIMEO) == 1234
    assert gate.drain(pull, 0, 30) == [] and gate.drain(pull, 64) == []

    frames = [bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg, s, 1), sender_id=s, seq=s)) for s in range(3)]
    got: list = []

    def send_later():
        for f in frames:
            push.send(f)

    sender = threading.Thread(target=send_later)
    sender.start()  # whether the frames come before the drain starts or while it waits, it gets them
    while len(got) < len(frames):
        burst = gate.drain(pull, 64, 10_000)
        assert burst, f"nothing within 10 s after {len(got)} of {len(frames)}"
        got += burst
    sender.join()
    assert [(c[0].sender_id, c[0].seq) for c in got] == [(s, s) for s in range(3)]
    assert pull.getsockopt(zmq.RCVTIMEO) == 1234
    pull.setsockopt(zmq.RCVTIMEO, -1)
    push.send(frames[0])
    assert len(gate.drain(pull, 64, -1)) == 1  # -1: for ever, and a message is there
    assert pull.getsockopt(zmq.RCVTIMEO) == -1


def test_drained_messages_are_whole_messages(pair):
    """Messages the C++ drain makes (wire.Message over its C base) read as the Python
    path's do, keep their frame alive on their own, and are freed, cycles included."""
    push, pull = pair
    cfg = small_config()
    gate = impala_gate(True, cfg)
    frames = [bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg, s, 1), sender_id=s, seq=s + 10, policy_version=7))
              for s in range(3)]
    for f in frames:
        push.send(f)
    got = drain_all(gate, pull, 3)  # the first registers the layout; the rest are vouched for in C++
    assert [summary(c) for c in got] == [summary(gate.check(f)) for f in frames]
    msg, bindings = got[-1]
    assert type(msg) is wire.Message and isinstance(msg, _core.MessageBase)
    assert (msg.kind, msg.sender_id, msg.seq, msg.policy_version, msg.nbytes) == (wire.Kind.TRAJECTORY, 2, 12, 7, len(frames[2]))
    assert bytes(msg.meta) == b"" and msg.infos == gate.check(frames[2])[0].infos
    obs = msg.arrays["obs"]
    del got, msg  # the views hold the frame
    assert obs.tobytes() == gate.check(frames[2])[0].arrays["obs"].tobytes()

    freed: list = []

    class Flag:
        def __del__(self):
            freed.append(True)

    m = wire.Message(wire.Kind.STATS, 1, 2, 3, b"", (), b"", 0)  # made in Python, as decode makes them
    m._arrays = {"cycle": m, "flag": Flag()}
    del m
    gc.collect()
    assert freed == [True]  # the C type takes part in the cycle collector


def test_the_drain_function_names_a_bad_argument(pair):
    _, pull = pair
    gate = impala_gate(True, small_config())
    drain = transport.native().drain
    ok = (pull.underlying, gate._fast, 4, wire.RECV_COPY_BELOW, 0, [], wire.Message, wire.Kind.TRAJECTORY)
    assert drain(*ok) == ([], 0)
    for at, bad, error, match in [
        (0, 0, ValueError, "socket 0"),
        (2, -1, ValueError, "max -1"),
        (4, -2, ValueError, "wait_ms -2"),
        (1, object(), TypeError, "gate must be a zrl._core.FrameGate"),
        (5, (), TypeError, "layouts must be a list"),
        (6, dict, TypeError, "message_type must be a subclass"),
    ]:
        args = list(ok)
        args[at] = bad
        with pytest.raises(error, match=match):
            drain(*args)
    with pytest.raises(TypeError, match=r"drain\(socket, gate"):
        drain(*ok[:7])


def test_a_layout_that_takes_over_a_slot_mid_burst(pair):
    """The table is full; a burst holds a new layout, then a frame the C++ gate vouched
    for with the slot that new layout takes over: it must still decode as itself."""
    push, pull = pair
    cfg = small_config("actor.num_envs=10", "learner.batch_size=10")
    fast, slow = impala_gate(True, cfg), impala_gate(False, cfg)

    def frame(K, M, seed):
        shape = SimpleNamespace(actor=SimpleNamespace(unroll_length=cfg.actor.unroll_length, num_envs=K))
        return bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(shape, seed=seed, M=M), seq=seed))

    shapes = [(K, M) for K in range(1, 11) for M in range(0, 7) if M <= 5 * K][:64]
    for K, M in shapes:
        fast.check(frame(K, M, K * 10 + M))
    assert len(fast._layouts) == 64 and shapes[:2] == [(1, 0), (1, 1)]
    burst = [frame(10, 20, 1), frame(1, 0, 2), frame(1, 1, 3)]  # new; then slot 0's and slot 1's layouts
    for f in burst:
        push.send(f)
    got = [summary(c) for c in drain_all(fast, pull, len(burst))]
    assert got == [outcome(slow, f) for f in burst] and all(g[0] == "ok" for g in got)
    assert len(fast._layouts) == 64 == len(fast._blocks) == len(fast._fast)  # the table stays whole


def test_a_full_queue_hands_back_the_finished_frame():
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)  # with no peer at all, a PUSH socket queues nothing
    push.setsockopt(zmq.LINGER, 0)
    try:
        pusher = native_pusher(push)
        layout = wire.Layout(wire.Kind.TRAJECTORY, [("x", np.float32, (3,)), ("idx", np.int32, (4,))])
        msg = layout.allocate()
        msg.arrays["x"][:] = [1, 2, 3]
        msg.arrays["idx"][:2] = [7, 8]
        frame = pusher.send(msg, 4, 11, 6, {"idx": 2})
        assert frame is not None
        m = wire.decode(bytes(frame))
        assert (m.sender_id, m.seq, m.policy_version) == (4, 11, 6)
        np.testing.assert_array_equal(m.arrays["idx"], [7, 8])
        np.testing.assert_array_equal(m.arrays["x"], [1, 2, 3])
        assert bytes(frame) == bytes(msg.finish(sender_id=4, seq=11, policy_version=6, rows={"idx": 2}))
        push.close(0)
        with pytest.raises(zmq.ZMQError) as e:  # a closed socket: an error, not a dangling pointer
            pusher.send(layout.allocate(), 4, 12, 6, {"idx": 0})
        assert e.value.errno == errno.ENOTSOCK
    finally:
        push.close(0)
        ctx.term()


def chunk_steps(rec, rng, K: int, T: int) -> np.ndarray:
    """Records one chunk of T steps (no truncations); returns the observations it saw, [T, K, 4]."""
    seen = []
    for _ in range(T):
        rec.record(rng.integers(0, 2, K), {"behaviour_logp": np.zeros(K, np.float32)})
        obs = rng.standard_normal((K, 4)).astype(np.float32)
        seen.append(obs)
        rec.observe(Step(obs, np.zeros(K, np.float32), np.zeros(K, bool), np.zeros(K, bool), {}))
    return np.stack(seen)


@pytest.mark.parametrize("native", [True, False])
def test_a_small_sent_chunk_frame_takes_the_next_chunk_in_place(pair, request, native):
    """A small frame goes out copied, so the recorder writes the next chunk into the same
    frame, its bootstrap row copied from the last: every chunk still arrives whole."""
    if not native:
        request.getfixturevalue("native_off")
    push, pull = pair
    K, T = 2, 5
    cfg = small_config(f"actor.num_envs={K}", f"actor.unroll_length={T}", "learner.batch_size=2")
    rec = Impala(cfg, spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2)).make_recorder(
        None, num_envs=K, sender=Sender(1, link=SimpleNamespace(pusher=transport.Pusher(push), sender_id=1)))
    rng = np.random.default_rng(0)
    first = rng.standard_normal((K, 4)).astype(np.float32)
    rec.begin(first)
    msg, bootstrap = rec.msg, first
    for i in range(4):
        rec.policy_version = 10 + i  # (a chunk carries the version it began with)
        seen = chunk_steps(rec, rng, K, T)
        assert rec.msg is msg and msg.reusable()  # the same frame, free: written in place
        # From the second chunk on, the C++ path sends it and copies the bootstrap row in one call.
        assert (rec.chunks.direct is not None) == native and (i == 0 or not native or rec.chunks.direct[0] is msg)
        got = wire.decode(pull.recv())
        assert (got.seq, got.policy_version) == (i + 1, 9 + i if i else 0)
        np.testing.assert_array_equal(got.arrays["obs"][0], bootstrap)
        np.testing.assert_array_equal(got.arrays["obs"][1:], seen)
        bootstrap = seen[-1]
        np.testing.assert_array_equal(msg.arrays["obs"][0], bootstrap)  # the next chunk's first row


def test_the_one_call_chunk_path_gives_way_to_truncations_a_full_queue_and_a_new_socket():
    """ChunkSender's one-call path (send + bootstrap row in C++) holds only while its frame,
    cut and pusher stay the ones it was made for: a chunk with final rows, a new pusher
    whose queue is full, and a reconnected link each take the general path, and every
    chunk still arrives whole, in order."""
    K, T = 2, 3
    ctx = zmq.Context()
    socks = []

    def socket(kind):
        s = ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        socks.append(s)
        return s

    def connected():
        push, pull = socket(zmq.PUSH), socket(zmq.PULL)
        name = f"inproc://one-call-{len(socks)}"
        pull.bind(name)
        push.connect(name)
        return push, pull

    try:
        push, pull = connected()
        link = SimpleNamespace(pusher=native_pusher(push), sender_id=1)
        cfg = small_config(f"actor.num_envs={K}", f"actor.unroll_length={T}", "learner.batch_size=2")
        rec = Impala(cfg, spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2)).make_recorder(
            None, num_envs=K, sender=Sender(1, link=link))
        rng = np.random.default_rng(2)
        rec.begin(rng.standard_normal((K, 4)).astype(np.float32))
        sent = []  # (seq, obs [T + 1, K, 4], final_obs) of each chunk not checked yet, in order
        seqs = iter(range(1, 100))

        def one_chunk(final_at=None):
            rows, finals = [rec.msg.arrays["obs"][0].copy()], []
            for t in range(T):
                rec.record(rng.integers(0, 2, K), {"behaviour_logp": np.zeros(K, np.float32)})
                rows.append(rng.standard_normal((K, 4)).astype(np.float32))
                final = {1: rng.standard_normal(4).astype(np.float32)} if t == final_at else {}
                finals += final.values()
                out = rec.observe(Step(rows[-1], np.zeros(K, np.float32), np.zeros(K, bool), np.array([False, t == final_at]), final))
            sent.append((next(seqs), np.stack(rows), np.array(finals, np.float32).reshape(-1, 4)))
            return out

        def check(frame):
            m = wire.decode(frame)
            seq, obs, finals = sent.pop(0)
            assert m.seq == seq
            np.testing.assert_array_equal(m.arrays["obs"], obs)
            np.testing.assert_array_equal(m.arrays["final_obs"], finals)

        assert one_chunk() == [] and rec.chunks.direct[1] is rec.cut0
        check(pull.recv())
        assert one_chunk(final_at=1) == [] and rec.chunks.direct[1] is not rec.cut0  # a cut with a final row: the general path
        check(pull.recv())
        assert one_chunk() == [] and rec.chunks.direct[1] is rec.cut0  # back on the one-call path
        check(pull.recv())
        msg = rec.msg
        # The link's pusher changes (the old socket still open) to one whose queue is full.
        link.pusher = native_pusher(socket(zmq.PUSH))  # no peer: it queues nothing
        (held,) = one_chunk()
        assert rec.msg is not msg and rec.chunks.direct is None  # handed back: the next chunk in a new frame
        assert pull.poll(0) == 0  # nothing went to the old socket
        check(bytes(held))
        del held
        # The link reconnects: a new socket, a new pusher; the old one closed.
        push.close(0)
        push, pull = connected()
        link.pusher = native_pusher(push)
        for _ in range(3):
            assert one_chunk() == []
            check(pull.recv())
        assert rec.chunks.direct is not None and rec.chunks.direct[2] is link.pusher and not sent
    finally:
        for s in socks:
            s.close(0)
        ctx.term()


def test_a_chunk_frame_still_held_is_never_written_again():
    """A frame handed back (the queue was full) belongs to the caller until it lets go:
    the next chunk goes into another frame, and the one held keeps its bytes."""
    K, T = 2, 4
    cfg = small_config(f"actor.num_envs={K}", f"actor.unroll_length={T}", "learner.batch_size=2")
    rec = Impala(cfg, spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2)).make_recorder(None, num_envs=K, sender=Sender(1))
    rng = np.random.default_rng(1)
    rec.begin(rng.standard_normal((K, 4)).astype(np.float32))
    msg = rec.msg
    seen = chunk_steps(rec, rng, K, T - 1)
    rec.record(rng.integers(0, 2, K), {"behaviour_logp": np.zeros(K, np.float32)})
    last = rng.standard_normal((K, 4)).astype(np.float32)
    (held,) = rec.observe(Step(last, np.zeros(K, np.float32), np.zeros(K, bool), np.zeros(K, bool), {}))
    before = bytes(held)
    assert rec.msg is not msg and not msg.reusable()
    np.testing.assert_array_equal(rec.msg.arrays["obs"][0], last)
    chunk_steps(rec, rng, K, T)  # the next chunk, written and finished meanwhile
    assert bytes(held) == before
    np.testing.assert_array_equal(wire.decode(before).arrays["obs"][1:T], seen)
    del held
    assert msg.reusable()


def test_a_frame_sent_again_with_its_cut_keeps_its_header_and_is_sealed_again_once_handed_out(pair):
    push, pull = pair
    pusher = native_pusher(push)
    layout = wire.Layout(wire.Kind.TRAJECTORY, [("x", np.float32, (3,)), ("idx", np.int32, (4,))])
    two, one = layout.cut({"idx": 2}), layout.cut({"idx": 1})
    msg = layout.allocate()
    msg.arrays["idx"][:] = [5, 6, 7, 8]
    sent = [(3, 1, two), (3, 2, two), (4, 3, two), (4, 4, one)]  # same cut; another sender; another cut
    for sender_id, seq, cut in sent:
        assert pusher.send(msg, sender_id, seq, 0, cut) is None
    again = layout.allocate()
    assert again is msg and not again._done
    assert pusher.send(again, 4, 5, 0, one) is None  # the same cut, but handed out anew: sealed again
    assert layout._finished[-1] is again and again._done
    got = [wire.decode(pull.recv()) for _ in range(5)]
    assert [(m.sender_id, m.seq, m.arrays["idx"].tolist()) for m in got] == [
        (3, 1, [5, 6]), (3, 2, [5, 6]), (4, 3, [5, 6]), (4, 4, [5]), (4, 5, [5])]


def test_a_row_copier_copies_rows_and_leaves_the_message_free():
    layout = wire.Layout(wire.Kind.TRAJECTORY, [("obs", np.float32, (5, 2, 3)), ("x", np.int64, (4,))])
    msg = layout.allocate()
    msg.arrays["obs"][:] = np.arange(30, dtype=np.float32).reshape(5, 2, 3)
    to, src = msg.row_copier("obs", 0, 4)
    assert msg.row_copier("obs", 0, 4) == (to, src) and msg.reusable()
    to[:] = src
    np.testing.assert_array_equal(msg.arrays["obs"][0], msg.arrays["obs"][4])
    np.testing.assert_array_equal(msg.arrays["obs"][1:4], np.arange(6, 24, dtype=np.float32).reshape(3, 2, 3))
    assert msg.arrays["x"].tolist() == [0, 0, 0, 0]
    with pytest.raises(IndexError, match="0..4"):
        msg.row_copier("obs", 5, 0)
    view = msg.arrays["obs"][2]
    assert not msg.reusable()  # a caller's view still counts
    del view
    assert msg.reusable()


def large_layout():
    """A layout whose frames live in SendBuffers (wire.SEND_ZERO_COPY_FROM), large enough that
    glibc maps each from the kernel: a freed one is unmapped, and reading it would crash."""
    layout = wire.Layout(wire.Kind.TRAJECTORY, [("obs", np.uint8, (4 * wire.SEND_ZERO_COPY_FROM,)), ("idx", np.int32, (4,))])
    assert layout.capacity >= wire.SEND_ZERO_COPY_FROM
    return layout


def test_a_large_frame_goes_out_uncopied_and_is_reused_only_once_zeromq_lets_go(pair):
    push, pull = pair
    pusher = native_pusher(push)
    layout = large_layout()
    first = layout.allocate()
    assert type(first.send_buffer) is _core.SendBuffer and first.send_buffer.in_flight == 0
    first.arrays["obs"][:] = 7
    assert pusher.send(first, 1, 10, 2, {"idx": 1}) is None
    # Over inproc the receiver gets the very bytes sent: ZeroMQ holds the buffer until the
    # received message is closed, and allocate does not hand it out meanwhile.
    assert first.send_buffer.in_flight == 1
    second = layout.allocate()
    assert second is not first
    got = pull.recv(copy=False)
    assert first.send_buffer.in_flight == 1
    with pytest.raises(ValueError, match="in flight"):  # stamping it would change the message in flight
        pusher.api.send_frame(push.underlying, first.send_buffer, 64, 1, 0, False)
    m = wire.decode(got)
    assert (m.sender_id, m.seq, m.policy_version, m.arrays["idx"].shape) == (1, 10, 2, (1,))
    assert (m.arrays["obs"] == 7).all()
    del m, got
    assert first.send_buffer.in_flight == 0
    assert layout.allocate() is first  # free again: reused


def test_a_send_buffer_outlives_its_owner_while_zeromq_holds_it(pair):
    push, pull = pair
    pusher = native_pusher(push)
    layout = large_layout()
    msg = layout.allocate()
    msg.arrays["obs"][:] = np.arange(4 * wire.SEND_ZERO_COPY_FROM) % 251
    assert pusher.send(msg, 3, 4, 5) is None
    owner = weakref.ref(msg)
    del msg, layout  # Python's last references to the buffer (a cycle: the layout keeps its frames)
    gc.collect()
    assert owner() is None  # the OutMessage and its SendBuffer are gone; libzmq's count keeps the bytes
    m = wire.decode(pull.recv(copy=False))
    np.testing.assert_array_equal(m.arrays["obs"], np.arange(4 * wire.SEND_ZERO_COPY_FROM) % 251)


def wait_until(cond, what: str, timeout: float = 10.0) -> None:
    """libzmq lets go of a sent frame on its I/O thread, with no event to wait on."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def test_over_tcp_libzmq_lets_go_from_its_own_thread(tmp_path):
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    try:
        pull.bind("tcp://127.0.0.1:*")
        push.connect(pull.getsockopt_string(zmq.LAST_ENDPOINT))
        pusher = native_pusher(push)
        layout = large_layout()
        sent = []
        for seq in range(6):
            msg = layout.allocate()
            assert all(msg is not s for s in sent if s.send_buffer.in_flight)
            msg.arrays["obs"][:] = seq
            assert pusher.send(msg, 1, seq, 0, {"idx": 0}, wait=True) is None
            sent.append(msg)
        for seq in range(6):
            m = wire.decode(pull.recv())  # a copy: nothing on this side holds the sender's bytes
            assert m.seq == seq and (m.arrays["obs"] == seq).all()
        wait_until(lambda: not any(s.send_buffer.in_flight for s in sent), "libzmq kept a sent frame")
        assert layout.allocate() in sent
    finally:
        push.close(0)
        pull.close(0)
        ctx.term()


def test_frames_never_sent_are_let_go_when_the_socket_closes():
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect("inproc://nobody-yet")  # queues until a peer binds, which none does
    pusher = native_pusher(push)
    msg = large_layout().allocate()
    assert pusher.send(msg, 1, 1, 0) is None
    assert msg.send_buffer.in_flight == 1
    push.close(0)  # linger 0: the queued message is dropped
    ctx.term()
    assert msg.send_buffer.in_flight == 0


def test_a_large_frame_the_queue_refuses_is_handed_back_and_free():
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)  # no peer: nothing is queued
    push.setsockopt(zmq.LINGER, 0)
    try:
        pusher = native_pusher(push)
        msg = large_layout().allocate()
        frame = pusher.send(msg, 4, 11, 6, {"idx": 0})
        assert frame is not None and wire.decode(bytes(frame)).seq == 11
        assert msg.send_buffer.in_flight == 0  # ZeroMQ let go of the message it did not queue
    finally:
        push.close(0)
        ctx.term()


def test_send_buffers_are_zeroed_writable_and_checked():
    b = _core.SendBuffer(1000)
    view = memoryview(b)
    assert (view.nbytes, view.readonly, b.in_flight) == (1000, False, 0)
    assert bytes(view) == bytes(1000)
    view[:3] = b"abc"
    assert bytes(memoryview(b)[:3]) == b"abc"
    assert memoryview(_core.SendBuffer(0)).nbytes == 0
    with pytest.raises(ValueError, match=">= 0"):
        _core.SendBuffer(-1)
    with pytest.raises(AttributeError):
        b.in_flight = 1


def test_send_frame_refuses_a_bad_length(pair):
    push, _ = pair
    api = transport.native()
    assert api is not None, transport.native_note()
    buf = np.zeros(256, np.uint8)
    for total in (0, 47, 257):
        with pytest.raises(ValueError, match="outside"):
            api.send_frame(push.underlying, buf, total, 1, 0, False)
    with pytest.raises(BufferError):
        api.send_frame(push.underlying, bytes(256), 64, 1, 0, False)  # read-only: it stamps the header
    with pytest.raises(ValueError, match="outside"):
        api.send_frame(push.underlying, _core.SendBuffer(256), 257, 1, 0, False)
    with pytest.raises(TypeError):
        api.send_frame(push.underlying, buf, 64)
    for to, frm, n in ((0, 200, 57), (250, 0, 7), (0, 0, 257), (-1, 0, 4)):
        with pytest.raises((ValueError, OverflowError)):
            api.send_frame(push.underlying, buf, 64, 1, 0, False, to, frm, n)
    with pytest.raises(ValueError, match="SendBuffer"):  # libzmq reads it after the call: no writes into it
        api.send_frame(push.underlying, _core.SendBuffer(256), 64, 1, 0, False, 0, 64, 8)


def test_send_frame_copies_a_row_once_the_frame_went_out_copied(pair):
    push, pull = pair
    api = transport.native()
    assert api is not None, transport.native_note()
    layout = wire.Layout(wire.Kind.TRAJECTORY, [("obs", np.float32, (4, 3))])
    msg = layout.allocate()
    msg.arrays["obs"][:] = np.arange(12, dtype=np.float32).reshape(4, 3)
    total = msg.seal(2)
    to, frm, n = layout.row_span("obs", 0, 3)
    assert n == 12 and api.send_frame(push.underlying, msg.buffer, total, 7, 1, False, to, frm, n) == 0
    got = wire.decode(pull.recv())
    assert got.seq == 7 and got.arrays["obs"].tolist() == np.arange(12, dtype=np.float32).reshape(4, 3).tolist()
    assert msg.arrays["obs"].tolist() == [[9, 10, 11], [3, 4, 5], [6, 7, 8], [9, 10, 11]]  # after the send
    with pytest.raises(IndexError, match="0..3"):
        layout.row_span("obs", 4, 0)
    ctx = zmq.Context()
    lone = ctx.socket(zmq.PUSH)  # no peer: EAGAIN, and the frame stays as it was
    try:
        msg.arrays["obs"][0] = -1
        assert api.send_frame(lone.underlying, msg.buffer, total, 8, 1, False, to, frm, n) == errno.EAGAIN
        assert msg.arrays["obs"][0].tolist() == [-1, -1, -1]
    finally:
        lone.close(0)
        ctx.term()


@pytest.mark.parametrize("native", [True, False])
def test_a_timed_out_wait_hands_back_the_frame_on_both_paths(request, native):
    if not native:
        request.getfixturevalue("native_off")
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)  # no peer: a blocking send waits out SNDTIMEO
    push.setsockopt(zmq.LINGER, 0)
    push.setsockopt(zmq.SNDTIMEO, 20)
    try:
        pusher = transport.Pusher(push)
        assert (pusher.api is not None) == native
        layout = wire.Layout(wire.Kind.TRAJECTORY, [("x", np.float32, (3,))])
        frame = pusher.send(layout.allocate(), 1, 2, 3, wait=True)
        assert frame is not None and wire.decode(bytes(frame)).seq == 2
        with pytest.raises(zmq.Again):  # pyzmq's class for EAGAIN, from either path
            raise transport.zmq_error(errno.EAGAIN)
        assert isinstance(transport.zmq_error(zmq.ETERM), zmq.ContextTerminated)
    finally:
        push.close(0)
        ctx.term()


def test_numpy_integers_are_taken_as_pyzmqs_path_takes_them(pair):
    push, pull = pair
    pusher = native_pusher(push)
    layout = wire.Layout(wire.Kind.TRAJECTORY, [("x", np.float32, (3,)), ("idx", np.int32, (4,))])
    assert pusher.send(layout.allocate(), np.int32(4), np.int64(11), np.uint64(6), {"idx": np.int64(2)}) is None
    assert pull.poll(5000)
    m = wire.decode(pull.recv())
    assert (m.sender_id, m.seq, m.policy_version, m.arrays["idx"].shape) == (4, 11, 6, (2,))


def test_two_threads_draining_at_once_each_get_their_own(pair):
    """One ZmqNative serves every gate in the process: concurrent drains must not mix."""
    import threading

    ctx = zmq.Context()
    cfg = small_config()
    n = 3000
    socks, results, errors = [], {}, []
    try:
        for who in (1, 2):
            push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
            for s in (push, pull):
                s.setsockopt(zmq.LINGER, 0)
            push.setsockopt(zmq.SNDHWM, 0)
            pull.setsockopt(zmq.RCVHWM, 0)
            pull.bind(f"inproc://drain-{who}")
            push.connect(f"inproc://drain-{who}")
            socks += [push, pull]
            frame = bytes(wire.encode(wire.Kind.TRAJECTORY, chunk(cfg, who), sender_id=who))
            for _ in range(n):
                push.send(frame)

        def drain(who, pull):
            try:
                gate = impala_gate(True, cfg)
                got = drain_all(gate, pull, n)
                results[who] = [summary(c)[:3] for c in got]
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=drain, args=(who, socks[2 * who - 1])) for who in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors and not any(t.is_alive() for t in threads), errors
        for who in (1, 2):
            assert results[who] == [("ok", wire.Kind.TRAJECTORY, who)] * n
    finally:
        for s in socks:
            s.close(0)
        ctx.term()


def test_recorders_sharing_a_sender_each_keep_their_one_call_path():
    """An actor's env groups share one Sender, each recorder with its own frame: each keeps
    its own one-call path, so groups sent in turn all take it, and every chunk arrives whole."""
    K, T, G = 2, 3, 3
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    try:
        for s in (pull, push):
            s.setsockopt(zmq.LINGER, 0)
        pull.bind("inproc://shared-sender")
        push.connect("inproc://shared-sender")
        cfg = small_config(f"actor.num_envs={K}", f"actor.unroll_length={T}", "learner.batch_size=2")
        sender = Sender(1, link=SimpleNamespace(pusher=native_pusher(push), sender_id=1))
        algo = Impala(cfg, spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2))
        recs = [algo.make_recorder(None, num_envs=K, sender=sender) for _ in range(G)]
        rng = np.random.default_rng(3)
        for rec in recs:
            rec.begin(rng.standard_normal((K, 4)).astype(np.float32))
        for round_ in range(3):
            for g, rec in enumerate(recs):
                seen = chunk_steps(rec, rng, K, T)
                got = wire.decode(pull.recv())
                assert got.seq == round_ * G + g + 1
                np.testing.assert_array_equal(got.arrays["obs"][1:], seen)
                assert rec.chunks.direct is not None and rec.chunks.direct[0] is rec.msg
    finally:
        pull.close(0)
        push.close(0)
        ctx.term()
