"""Host copies without a blocking round trip: HostWeights (the learner's weights, for
publishing), Ape-X's HostPriorities (new priorities, for the replay), and IMPALA's batches
(joined in pinned memory for a GPU)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from zrl.algorithms.apex_dqn.algorithm import HostPriorities
from zrl.learner.publisher import HostWeights

pytestmark = pytest.mark.timeout(60)


def test_cpu_weights_are_ready_at_once_and_are_the_buffer():
    flat = torch.arange(6, dtype=torch.float32)
    hw = HostWeights(flat)
    assert hw.ready() is None  # nothing started
    hw.start(3)
    version, params = hw.ready()
    assert version == 3 and params.dtype == np.float32
    np.testing.assert_array_equal(params, np.arange(6, dtype=np.float32))
    assert np.shares_memory(params, flat.numpy())  # no copy on CPU
    assert hw.ready() is None  # handed over once
    flat.add_(1.0)
    hw.start(4)
    version, params = hw.ready()
    assert version == 4 and params[0] == 1.0


def test_cpu_bf16_weights_are_published_as_float32():
    flat = torch.tensor([0.5, -2.0, 3.0], dtype=torch.bfloat16)
    hw = HostWeights(flat)
    hw.start(1)
    _, params = hw.ready()
    assert params.dtype == np.float32
    np.testing.assert_array_equal(params, [0.5, -2.0, 3.0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_copy_lands_in_stream_order_and_skips_while_in_flight():
    flat = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    hw = HostWeights(flat)
    hw.start(1)
    flat.add_(1.0)  # queued after the copy: the copy must not see it
    hw.start(2)  # a copy is in flight: skipped, version 1 stays the one pending
    torch.cuda.synchronize()
    version, params = hw.ready()
    assert version == 1
    np.testing.assert_array_equal(params[:4], [0.0, 1.0, 2.0, 3.0])
    assert hw.ready() is None
    hw.start(3)
    torch.cuda.synchronize()
    version, params = hw.ready()
    assert version == 3 and params[0] == 1.0


class RecordingReplay:
    def __init__(self):
        self.updates = []

    def update_priorities(self, keys, priorities):
        self.updates.append((np.asarray(keys).copy(), np.asarray(priorities).copy()))


def test_cpu_priorities_reach_the_replay_at_once():
    replay, hp = RecordingReplay(), HostPriorities()
    hp.put(replay, np.array([4, 7]), torch.tensor([0.5, 2.0]))
    assert len(replay.updates) == 1
    keys, prio = replay.updates[0]
    np.testing.assert_array_equal(keys, [4, 7])
    np.testing.assert_array_equal(prio, [0.5, 2.0])
    hp.flush()  # nothing in flight
    assert len(replay.updates) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_priorities_reach_the_replay_one_update_late_and_on_flush():
    replay, hp = RecordingReplay(), HostPriorities()
    td = torch.full((1 << 16,), 3.0, device="cuda")
    hp.put(replay, np.arange(4), td[:4] + 1.0)
    assert replay.updates == []  # in flight
    td.add_(10.0)
    hp.put(replay, np.arange(4, 8), td[:4] * 1.0)  # writes the first before reusing the pinned buffer
    assert len(replay.updates) == 1
    np.testing.assert_array_equal(replay.updates[0][0], [0, 1, 2, 3])
    np.testing.assert_array_equal(replay.updates[0][1], [4.0] * 4)
    hp.flush()
    np.testing.assert_array_equal(replay.updates[1][0], [4, 5, 6, 7])
    np.testing.assert_array_equal(replay.updates[1][1], [13.0] * 4)


def _frames_parts():
    """Read-only arrays, as a batch's chunks arrive (views of received frames)."""
    rng = np.random.default_rng(0)
    parts = []
    for k in (3, 5, 2):
        for a in (rng.integers(0, 256, (4, k, 2, 3), dtype=np.uint8), rng.random((4, k)) < 0.5, rng.normal(size=(4, k)).astype(np.float32)):
            a.flags.writeable = False
            parts.append(a)
    return [parts[i::3] for i in range(3)]  # per field: the chunks' arrays


def test_a_batch_is_joined_as_numpy_joins_it():
    from zrl.algorithms.impala.algorithm import _join

    cores = [np.arange(k * 4, dtype=np.float32).reshape(k, 4) for k in (3, 5, 2)]  # LSTM states: joined on axis 0
    for parts, axis in [*((p, 1) for p in _frames_parts()), (cores, 0)]:
        want = np.concatenate(parts, axis=axis)
        t, bad = _join(parts, axis, torch.device("cpu"), 2 if want.dtype == np.bool_ else None)
        assert bad == []
        np.testing.assert_array_equal(t.numpy(), want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_batch_for_the_gpu_is_joined_in_pinned_memory_and_lands_there():
    from zrl.algorithms.impala.algorithm import _join

    for parts in _frames_parts():
        t, bad = _join(parts, 1, torch.device("cuda"))
        assert t.device.type == "cuda" and bad == []
        np.testing.assert_array_equal(t.cpu().numpy(), np.concatenate(parts, axis=1))


@pytest.mark.parametrize("n", [100, 40_000])  # a frame pyzmq copies, and one sent zero-copy
def test_published_frames_are_reused_but_never_one_still_held(ctx, make_learner, n):
    import zmq

    from zrl import wire
    from helpers import small_config, wait_for

    learner, _ = make_learner(small_config(), start=False)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(learner.weights_endpoint)
    try:
        def received(version: int) -> bool:
            learner.publisher.publish(version, np.full(n, version, np.float32))
            return sub.poll(50) and wire.decode(sub.recv()).policy_version == version

        from zmq.utils.garbage import gc as pyzmq_gc

        def publish_and_check(v: int) -> None:
            # pyzmq drops its hold on a frame sent with copy=False in its garbage-collector
            # thread, after libzmq has sent it: a moment after the subscriber has it, and
            # later still on a loaded machine. Wait for that, so that what is counted below
            # is reuse, not that thread's timing.
            wait_for(lambda: not pyzmq_gc.refs, 30, "pyzmq to let go of the frames it sent")
            learner.publisher.publish(v, np.full(n, v, np.float32))
            msg = wire.decode(sub.recv())
            assert msg.policy_version == v and (msg.arrays["params"] == v).all()

        wait_for(lambda: received(0), 30, "the subscription")  # (PUB drops what goes out before it)
        made = len(learner.publisher.frames.layout._finished)
        # A hello reply built from version 0 meanwhile: its frame stays intact while held.
        held_version, held_frame = learner.publisher.latest_frame
        held = wire.decode(held_frame).arrays["params"]
        del held_frame
        for v in range(1, 6):
            publish_and_check(v)
            assert (held == held_version).all() and not held.flags.writeable
        del held
        for v in range(6, 40):
            publish_and_check(v)
        version, frame = learner.publisher.latest_frame
        latest = wire.decode(frame).arrays["params"]
        assert version == 39 and (latest == 39).all() and not latest.flags.writeable
        # One new frame per version while the oldest was held, none after: frames are reused.
        assert len(learner.publisher.frames.layout._finished) <= made + 5
    finally:
        sub.close(0)
