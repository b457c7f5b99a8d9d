"""A learner fed garbage, truncated, oversized and mis-shaped messages keeps training."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import zmq

from zrl import spaces, transport, wire
from zrl.protocol import native as native_module
from helpers import good_trajectory, sender_id_from_hello, small_config, wait_for


# With ZRL_NATIVE_ZMQ=0 the actor sends and the learner receives through pyzmq alone.
@pytest.mark.parametrize("native", [True, False], ids=["native", "pyzmq"])
def test_learner_survives_bad_messages_and_keeps_training(ctx, make_learner, make_actor, monkeypatch, native):
    if not native:
        monkeypatch.setenv(transport.NATIVE_ENV, "0")
    monkeypatch.setattr(native_module, "_native", [])  # decided afresh, and forgotten after the test
    cfg = small_config("learner.max_message_bytes=65536")
    learner, runner = make_learner(cfg)
    make_actor(cfg)
    wait_for(lambda: learner.updates >= 2, 60, "training to start")
    assert (learner.gate._native_drain is not None) == native, transport.native_note()

    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(learner.trajectory_endpoint)
    T, K = cfg.actor.unroll_length, cfg.actor.num_envs
    good = good_trajectory(cfg)
    sid = sender_id_from_hello(ctx, learner, cfg)
    encode = functools.partial(wire.encode, sender_id=sid)
    valid = bytes(encode(wire.Kind.TRAJECTORY, good))
    bad = {
        "too_short": [b"", b"x", valid[:20]],
        "bad_length": [valid[:-1], valid[:200]],
        "too_large": [b"\0" * 70000],
        "bad_magic": [b"JUNK" + valid[4:]],
        "bad_version": [valid[:4] + b"\x09\x00" + valid[6:]],
        "bad_kind": [valid[:6] + b"\xee\x00" + valid[8:]],
        "unexpected_kind": [bytes(wire.encode(wire.Kind.WEIGHTS, {"params": np.zeros(3, np.float32)}))],
        "bad_shape": [bytes(encode(wire.Kind.TRAJECTORY, {**good, "obs": np.zeros((T + 1, K, 5), np.float32)}))],
        "bad_dtype": [bytes(encode(wire.Kind.TRAJECTORY, {**good, "reward": np.zeros((T, K), np.float64)}))],
        "missing_field": [bytes(encode(wire.Kind.TRAJECTORY, {k: v for k, v in good.items() if k != "reward"}))],
        "bad_value": [
            bytes(encode(wire.Kind.TRAJECTORY, {**good, "action": np.full((T, K), 7, np.int64)})),
            bytes(encode(wire.Kind.TRAJECTORY, {**good, "action": np.full((T, K), -1, np.int64)})),
            bytes(encode(wire.Kind.TRAJECTORY, {**good, "final_index": np.array([-3], np.int32), "final_obs": np.zeros((1, 4), np.float32)})),
            bytes(encode(wire.Kind.TRAJECTORY, {**good, "reward": np.full((T, K), np.nan, np.float32)})),
            bytes(encode(wire.Kind.TRAJECTORY, {**good, "obs": np.full((T + 1, K, 4), np.inf, np.float32)})),
        ],
        "bad_header": [bytes(encode(wire.Kind.TRAJECTORY, good, policy_version=2**64 - 1))],
    }
    rng = np.random.default_rng(0)
    bad["random"] = [rng.integers(0, 256, rng.integers(1, 3000), dtype=np.uint8).tobytes() for _ in range(200)]
    sent = 0
    for frames in bad.values():
        for f in frames:
            push.send(f)
            sent += 1
    push.close()
    before = learner.updates
    wait_for(lambda: sum(learner.rejected.values()) >= sent, 60, "every bad message counted")
    for reason in bad:
        if reason != "random":
            assert learner.rejected[reason] >= len(bad[reason]), (reason, dict(learner.rejected))
    wait_for(lambda: learner.updates >= before + 5, 60, "training to continue after the garbage")
    assert runner.thread.is_alive()
    assert all(np.isfinite(p.detach().cpu().numpy()).all() for p in learner.model.parameters())


def test_an_update_whose_gradients_overflow_leaves_the_weights_finite(ctx, make_learner):
    # Finite but huge observations (the gate lets them through) overflow a ReLU network's
    # loss to inf/NaN: the update zeroes its gradients instead of writing NaN into every weight.
    cfg = small_config("model.activation=relu")
    learner, runner = make_learner(cfg)
    sid = sender_id_from_hello(ctx, learner, cfg)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(learner.trajectory_endpoint)
    huge = good_trajectory(cfg)
    huge["obs"] = np.full_like(huge["obs"], 3e38)
    for _ in range(6):  # batch_size 8 / K 4: 3 updates
        push.send(wire.encode(wire.Kind.TRAJECTORY, huge, sender_id=sid))
    wait_for(lambda: learner.updates >= 3, 60, "updates on the huge chunks")
    push.close()
    assert runner.thread.is_alive()
    assert all(np.isfinite(p.detach().cpu().numpy()).all() for p in learner.model.parameters())


@pytest.mark.timeout(90)
def test_the_learner_logs_its_last_stretch_when_it_stops(make_learner, make_actor, tmp_path):
    """TensorBoard's curves end where training did: with a log interval longer than the run,
    the only scalars are those the learner writes as it stops."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = small_config("learner.log_interval_s=600")
    learner, runner = make_learner(cfg, logdir=tmp_path / "run")
    make_actor(cfg)
    wait_for(lambda: learner.updates >= 5 and learner.episodes >= 1, 60, "5 updates and an episode")
    learner.request_stop()
    result = runner.join(30)
    ea = EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0})
    ea.Reload()
    updates, returns = ea.Scalars("updates"), ea.Scalars("episode/return")
    assert [e.value for e in updates] == [result.updates] and len(returns) == 1
    assert 0 < updates[0].step <= result.env_steps and returns[0].value > 0


@pytest.mark.parametrize("prefetch", [0, 1], ids=["in-loop", "prefetched"])
def test_a_chunk_rejected_at_the_batch_join_is_dropped_and_its_batch_mates_train(ctx, make_learner, prefetch, caplog):
    """The learner's gate leaves the values of the arrays it joins to the join
    (Algorithm.checked_at_join): a chunk found bad there is counted and dropped, and the
    good chunks taken with it make the next batch."""
    cfg = small_config(f"learner.prefetch_batches={prefetch}")  # a batch is two chunks of 4 envs
    learner, runner = make_learner(cfg)
    obs, act = spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2)
    sid = sender_id_from_hello(ctx, learner, cfg, obs=obs, act=act)
    T, K = cfg.actor.unroll_length, cfg.actor.num_envs
    good = good_trajectory(cfg)
    bad = {**good, "obs": good["obs"].copy()}
    bad["obs"][2, 1, 3] = np.nan
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(learner.trajectory_endpoint)
    for seq, arrays in enumerate([bad, good, good]):
        push.send(bytes(wire.encode(wire.Kind.TRAJECTORY, arrays, seq=seq, sender_id=sid)))
    push.close()
    wait_for(lambda: learner.updates >= 1, 60, "an update from the two good chunks")
    assert dict(learner.rejected) == {"bad_value": 1}
    assert any("obs holds a NaN or an infinity (checked at the batch join)" in r.getMessage() for r in caplog.records)
    assert learner.env_steps == 2 * T * K  # counted on receipt, taken back when rejected
    assert learner.queue.empty() and not learner.source.leftover  # both good chunks went into the update
    assert all(np.isfinite(p.detach().cpu().numpy()).all() for p in learner.model.parameters())


def test_chunks_put_back_never_make_a_batch_wider_than_batch_size(make_learner):
    """After a rejection the learner puts the rejected chunk's batch mates back in front of
    the queue; the next batches take them in order, only while they fit."""
    cfg = small_config()  # batch_size 8
    learner, _ = make_learner(cfg, start=False)
    chunk = lambda k: (object(), {"T": 5, "K": k, "M": 0})  # columns() reads K alone
    back = [chunk(4), chunk(2), chunk(4)]
    learner.source.leftover = list(back)
    queued = [chunk(2), chunk(2)]
    for item in queued:
        learner.queue.put(item)
    never = lambda: False
    first = learner.source.take(never, lambda: None)
    assert first == back[:2] and learner.source.leftover == back[2:]  # 4 + 2; 4 more would make 10
    second = learner.source.take(never, lambda: None)
    assert second == [back[2], *queued] and learner.source.leftover == [] and learner.queue.empty()
