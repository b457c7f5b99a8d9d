"""10,000 seeded bad messages at the learner's PULL and the agent server's ROUTER while training runs."""
from __future__ import annotations

import threading

import numpy as np
import psutil
import pytest
import zmq

from zrl import wire
from zrl.server import AgentServer
from helpers import Running, good_trajectory, live_rss, small_config, wait_for

N_LEARNER = 6000
N_SERVER = 4000


def bad_frames(rng: np.random.Generator, valid: bytes, good_arrays: dict, n: int):
    """n frames, each invalid by construction, cycling through the kinds of damage."""
    T, K = good_arrays["reward"].shape
    makers = [
        lambda: rng.integers(0, 256, rng.integers(0, 4000), dtype=np.uint8).tobytes(),  # random bytes
        lambda: valid[: rng.integers(0, len(valid))],  # truncated
        lambda: valid + b"\0" * rng.integers(1, 64),  # trailing bytes: total_len mismatch
        lambda: b"\0" * 70_000,  # oversized (the test config caps at 64 KiB)
        lambda: valid[:4] + int(rng.integers(2, 60000)).to_bytes(2, "little") + valid[6:],  # wrong version
        lambda: bytes(wire.encode(wire.Kind.TRAJECTORY, {**good_arrays, "reward": good_arrays["reward"].astype(np.float64)})),  # wrong dtype
        lambda: bytes(wire.encode(wire.Kind.TRAJECTORY, {**good_arrays, "obs": np.zeros((T + 1, K, int(rng.integers(5, 9))), np.float32)})),  # wrong shape
        lambda: _without_one_field(good_arrays, rng),  # missing field
        lambda: _flip_descriptor(valid, rng),  # damaged descriptor
    ]
    for i in range(n):
        yield makers[i % len(makers)]()


def _without_one_field(arrays: dict, rng) -> bytes:
    gone = list(arrays)[int(rng.integers(0, len(arrays)))]
    return bytes(wire.encode(wire.Kind.TRAJECTORY, {k: v for k, v in arrays.items() if k != gone}))


def _flip_descriptor(valid: bytes, rng) -> bytes:
    b = bytearray(valid)
    off = wire.HEADER_SIZE + 32  # the first descriptor's dtype code
    b[off] = int(rng.integers(12, 256))
    return bytes(b)


@pytest.mark.timeout(240)
def test_learner_and_server_survive_ten_thousand_bad_messages(ctx, endpoint, make_learner, make_actor):
    cfg = small_config("learner.max_message_bytes=65536", "learner.batch_size=4", "actor.num_envs=1",
                       "server.observation_space={type: box, shape: [4], dtype: float32}", "server.action_space={type: discrete, n: 2}")
    learner, learner_run = make_learner(cfg)
    make_actor(cfg)
    stop = threading.Event()
    server = AgentServer(cfg, endpoint + "-server", endpoint, ctx=ctx, stop=stop, console=False)
    server_run = Running(server.run, "server")
    proc = psutil.Process()
    rng = np.random.default_rng(1234)
    good = good_trajectory(cfg)
    valid = bytes(wire.encode(wire.Kind.TRAJECTORY, good))
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.setsockopt(zmq.SNDHWM, 100_000)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        wait_for(lambda: learner.updates >= 2, 60, "training to start")
        wait_for(lambda: server.link is not None, 30, "the server to join")
        push.connect(learner.trajectory_endpoint)
        dealer.connect(server.endpoint)
        # Every frame exists before the first reading, so the two readings differ only by what the
        # learner and the server kept, not by the test's own frames (or the heap they fragment).
        halves = [list(bad_frames(rng, valid, good, N_LEARNER // 2)) for _ in range(2)]
        server_frames = list(bad_frames(rng, valid, good, N_SERVER))
        rss = []
        sent = 0
        updates_before = learner.updates
        for frames in halves:
            for f in frames:
                push.send(f)
            sent += len(frames)
            wait_for(lambda: sum(learner.rejected.values()) >= sent, 120, lambda: f"{sent} rejections at the learner, got {dict(learner.rejected)}")
            rss.append(live_rss(proc))
        assert sum(learner.rejected.values()) == N_LEARNER  # every one counted, none accepted
        reasons = dict(learner.rejected)
        for reason in ("too_large", "bad_length", "bad_version", "bad_dtype", "bad_shape", "missing_field", "bad_magic"):
            assert reasons.get(reason, 0) > 0, reasons
        wait_for(lambda: learner.updates >= updates_before + 5, 60, "training to keep advancing")

        # The server: bad requests from a client that never said hello, and damaged ACTs after it did.
        replies = 0
        for start in range(0, N_SERVER, 200):  # a client that reads its replies (a ROUTER drops what a peer never reads)
            for f in server_frames[start : start + 200]:
                dealer.send(f)
            while replies < min(start + 200, N_SERVER):
                assert dealer.poll(30_000), f"the server stopped answering after {replies} replies"
                reply = wire.decode(dealer.recv())
                assert reply.kind == wire.Kind.ERROR
                replies += 1
        assert sum(server.stats.rejected.values()) == N_SERVER
        assert server_run.thread.is_alive() and learner_run.thread.is_alive()
        growth = rss[1] - rss[0]
        assert growth < 8 * 2**20, f"resident memory grew {growth / 2**20:.1f} MiB over the second {N_LEARNER // 2} bad messages"
    finally:
        push.close()
        dealer.close()
        stop.set()
        server_run.join(30)
