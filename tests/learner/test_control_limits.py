"""Hostile peers at the learner: each class of abuse is bounded, counted, and training goes on.

Each test runs a real actor against an in-process learner, abuses one surface with
bounded loops, and checks that (1) the actor's training keeps advancing, (2) the
process's resident memory grows by less than 50 MB, and (3) the event is counted by
reason, in the log and in TensorBoard's `rejected/<reason>` scalars.
"""
from __future__ import annotations

import logging
import socket
import threading
import struct

import numpy as np
import psutil
import pytest
import zmq

from zrl import spaces, wire
from zrl.actors.actor import HelloError, hello_meta, say_hello
from helpers import good_trajectory, live_rss, sender_id_from_hello, small_config, wait_for

MB = 2**20
BOUND = 50 * MB
TCP = "tcp://127.0.0.1:*"
OBS = spaces.BoxSpec(shape=(4,), dtype="float32")
ACT = spaces.DiscreteSpec(n=2)


class Watched:
    """A learner with a real actor training against it, and the process's memory before the abuse."""

    def __init__(self, make_learner, make_actor, cfg, tmp_path, bind=None):
        self.cfg = cfg
        self.logdir = tmp_path / "run"
        self.learner, self.runner = make_learner(cfg, logdir=self.logdir, bind=bind)
        self.actor, _ = make_actor(cfg, learner=self.learner.control_endpoint)
        wait_for(lambda: self.learner.updates >= 3, 60, "training to start")
        self.proc = psutil.Process()
        self.rss0 = live_rss(self.proc)

    def still_training(self) -> None:
        before = self.learner.updates
        wait_for(lambda: self.learner.updates >= before + 5, 60, "the actor's training to go on")
        assert self.runner.thread.is_alive() and self.learner.progress.connected(__import__("time").monotonic()) == 1

    def memory_bounded(self) -> None:
        growth = live_rss(self.proc) - self.rss0
        assert growth < BOUND, f"resident memory grew {growth / MB:.0f} MB"

    def counted(self, reason: str, caplog, at_least: int = 1) -> None:
        """Counted, logged, and (once the learner stops and writes its last line) in TensorBoard."""
        assert self.learner.rejected[reason] >= at_least, dict(self.learner.rejected)
        assert any(f"rejected message ({reason}" in r.getMessage() for r in caplog.records), reason
        self.learner.request_stop()
        self.runner.join(30)
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(self.logdir), size_guidance={"scalars": 0})
        events.Reload()
        assert events.Scalars(f"rejected/{reason}")[-1].value >= at_least


def cfg_for_limits(*overrides):
    return small_config("learner.log_interval_s=0.2", *overrides)


@pytest.mark.timeout(120)
def test_a_hello_declaring_a_huge_frame_is_cut_off_before_it_is_read(make_learner, make_actor, tmp_path, caplog):
    """A peer that declares a 2 GiB message and streams 128 MB of it: ZeroMQ drops the
    connection at the size (learner.max_hello_bytes), before allocating."""
    caplog.set_level(logging.WARNING, "zrl.learner")
    w = Watched(make_learner, make_actor, cfg_for_limits(), tmp_path, bind=TCP)
    host, port = w.learner.control_endpoint.removeprefix("tcp://").rsplit(":", 1)
    for _ in range(2):
        streamed = stream_oversized_message(host, int(port), declared=2**31, stream=128 * MB)
        assert streamed < 128 * MB  # the learner hung up long before
    wait_for(lambda: w.learner.rejected["control_dropped"] >= 2, 30, "the cut-off connections counted")
    w.memory_bounded()
    w.still_training()
    w.counted("control_dropped", caplog, at_least=2)


def stream_oversized_message(host: str, port: int, declared: int, stream: int) -> int:
    """Speaks ZMTP 3.0 as a DEALER, declares one message of `declared` bytes and streams up to
    `stream` of them; returns how many went out before the peer closed the connection."""
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31
    ready_body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    ready = b"\x04" + bytes([len(ready_body)]) + ready_body
    header = b"\x02" + struct.pack(">Q", declared)  # a long frame, the last of its message
    sent = 0
    with socket.create_connection((host, port), timeout=10) as s:
        try:
            s.sendall(greeting + ready + header)
            block = b"\0" * MB
            while sent < stream:
                s.sendall(block)
                sent += len(block)
        except OSError:  # (reset or broken pipe: the learner dropped us)
            pass
    return sent


@pytest.mark.timeout(120)
def test_peers_that_never_read_their_replies_hold_no_copies_of_the_weights(ctx, make_learner, make_actor, tmp_path, caplog):
    """10 peers send 300 hellos each and never read: replies beyond learner.control_hwm are
    dropped and counted; those queued share one frame of the weights (4 MB here)."""
    caplog.set_level(logging.WARNING, "zrl.learner")
    w = Watched(make_learner, make_actor, cfg_for_limits("model.hidden_sizes=[1024, 1024]"), tmp_path, bind=TCP)
    hello = wire.encode(wire.Kind.HELLO, meta=hello_meta(w.cfg, "actor", 0, OBS, ACT, w.cfg.actor.num_envs))
    peers = [ctx.socket(zmq.DEALER) for _ in range(10)]
    try:
        for p in peers:
            p.setsockopt(zmq.LINGER, 0)
            p.setsockopt(zmq.RCVHWM, 1)
            p.setsockopt(zmq.RCVBUF, 4096)  # (a small kernel buffer: the learner's queue fills sooner)
            p.connect(w.learner.control_endpoint)
        for _ in range(300):
            for p in peers:
                p.send(hello, copy=False)
        wait_for(lambda: w.learner.rejected["reply_unread"] >= 100, 60, lambda: f"unread replies counted ({dict(w.learner.rejected)})")
        w.memory_bounded()
        w.still_training()
    finally:
        for p in peers:
            p.close(0)
    w.counted("reply_unread", caplog, at_least=100)


@pytest.mark.timeout(120)
def test_hellos_with_other_specs_are_refused_small_and_build_nothing(ctx, make_learner, make_actor, tmp_path, caplog):
    """1,000 hellos declaring an observation of [250000] floats (or another action count):
    each gets a short refusal, and the learner's model stays the one its config gives."""
    caplog.set_level(logging.WARNING, "zrl.learner")
    w = Watched(make_learner, make_actor, cfg_for_limits(), tmp_path)
    model = w.learner.model
    wide = hello_meta(w.cfg, "actor", 0, spaces.BoxSpec(shape=(250_000,), dtype="float32"), ACT, w.cfg.actor.num_envs)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(w.learner.control_endpoint)
    try:
        for i in range(1000):
            dealer.send(wire.encode(wire.Kind.HELLO, meta=wide))
            assert dealer.poll(30_000)
            reply = dealer.recv()
            assert len(reply) < 1200 and wire.decode(reply).kind == wire.Kind.ERROR
    finally:
        dealer.close(0)
    with pytest.raises(HelloError, match="specs differ"):
        say_hello(ctx, w.learner.control_endpoint, hello_meta(w.cfg, "actor", 0, OBS, spaces.DiscreteSpec(n=9), 4), timeout_s=30)
    assert w.learner.model is model and w.learner.rejected["hello_refused"] == 1001
    w.memory_bounded()
    w.still_training()
    w.counted("hello_refused", caplog, at_least=1001)


@pytest.mark.timeout(120)
def test_stats_from_made_up_sender_ids_are_refused_and_remembered_nowhere(ctx, make_learner, make_actor, tmp_path, caplog):
    caplog.set_level(logging.WARNING, "zrl.learner")
    w = Watched(make_learner, make_actor, cfg_for_limits("learner.pull_hwm=1000"), tmp_path)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.setsockopt(zmq.SNDHWM, 1000)
    push.connect(w.learner.trajectory_endpoint)
    stats = {"episode_return": np.array([500.0]), "episode_length": np.array([500.0])}
    frame = bytearray(wire.encode(wire.Kind.STATS, stats))
    # (The receiver reads at the pace the learner trains: its queue holds actors back.)
    ids = np.random.default_rng(0).integers(1, 2**32, 20_000, dtype=np.uint64)
    try:
        for sender_id in ids:
            struct.pack_into("<I", frame, 8, int(sender_id))  # the header's sender id
            push.send(frame)
        wait_for(lambda: w.learner.rejected["unknown_sender"] >= len(ids) - 10, 120, "the made-up senders refused")
    finally:
        push.close(0)
    assert len(w.learner.senders) == 1 and 500.0 not in w.learner.returns  # the real actor, its returns alone
    w.memory_bounded()
    w.still_training()
    w.counted("unknown_sender", caplog, at_least=len(ids) - 10)


@pytest.mark.timeout(120)
def test_a_known_sender_cannot_claim_a_future_version_or_implausible_returns(ctx, make_learner, make_actor, tmp_path, caplog):
    caplog.set_level(logging.WARNING, "zrl.learner")
    w = Watched(make_learner, make_actor, cfg_for_limits(), tmp_path)
    sid = sender_id_from_hello(ctx, w.learner, w.cfg)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(w.learner.trajectory_endpoint)
    try:
        push.send(wire.encode(wire.Kind.TRAJECTORY, good_trajectory(w.cfg), sender_id=sid, policy_version=10**12))
        wait_for(lambda: w.learner.rejected["future_version"] == 1, 30, "the chunk from the future refused")
        fake = [{"episode_return": np.array([1e12]), "episode_length": np.array([10.0])},  # beyond learner.max_abs_return
                {"episode_return": np.array([9.0]), "episode_length": np.array([0.5])},  # not a whole step
                {"episode_return": np.array([500.0] * 100), "episode_length": np.array([500.0] * 100)}]  # more steps than it sent
        for arrays in fake:
            push.send(wire.encode(wire.Kind.STATS, arrays, sender_id=sid))
        wait_for(lambda: w.learner.rejected["bad_value"] == len(fake), 30, "the implausible stats refused")
    finally:
        push.close(0)
    assert 500.0 not in w.learner.returns and 1e12 not in w.learner.returns
    assert w.learner.progress.run_lag.max < 10**6  # (the lag was never computed from the future version)
    w.memory_bounded()
    w.still_training()
    w.counted("future_version", caplog)


@pytest.mark.timeout(120)
def test_a_flood_of_hellos_cannot_push_a_live_actor_out(ctx, make_learner, make_actor, tmp_path, caplog):
    """The sender table is bounded and new ids are rate-limited: hellos from 300 strangers
    get ids up to learner.max_senders, then a "busy" refusal; one connection saying hello
    500 times keeps one id; the training actor keeps its id throughout."""
    caplog.set_level(logging.WARNING, "zrl.learner")
    w = Watched(make_learner, make_actor, cfg_for_limits("learner.max_senders=64", "learner.new_senders_burst=200"), tmp_path)
    actor_id = w.actor.link.sender_id
    hello = wire.encode(wire.Kind.HELLO, meta=hello_meta(w.cfg, "actor", 0, OBS, ACT, w.cfg.actor.num_envs))

    def ask(dealer) -> list:
        dealer.send(hello)
        assert dealer.poll(30_000)
        return [wire.decode(f) for f in dealer.recv_multipart()]

    repeated = ctx.socket(zmq.DEALER)
    repeated.setsockopt(zmq.LINGER, 0)
    repeated.connect(w.learner.control_endpoint)
    try:
        ids = {ask(repeated)[0].json()["sender_id"] for _ in range(500)}
    finally:
        repeated.close(0)
    assert len(ids) == 1 and len(w.learner.senders) == 2
    refusals = []
    for _ in range(300):
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(w.learner.control_endpoint)
        try:
            reply = ask(dealer)[0]
        finally:
            dealer.close(0)
        if reply.kind == wire.Kind.ERROR:
            refusals.append(reply.text())
    assert len(w.learner.senders) == 64 and actor_id in w.learner.senders and len(refusals) == 300 - 62
    assert all(text.startswith("busy: ") for text in refusals) and w.learner.rejected["too_many_senders"] == len(refusals)
    w.memory_bounded()
    w.still_training()
    assert w.actor.link.sender_id == actor_id
    w.counted("too_many_senders", caplog)


def test_an_idle_id_is_reused_only_when_the_table_is_full(monkeypatch):
    from zrl.learner import senders as senders_mod
    from zrl.learner.senders import SenderRefused, SenderTable

    now = [100.0]
    monkeypatch.setattr(senders_mod.time, "monotonic", lambda: now[0])
    table = SenderTable(max_senders=2, idle_s=30, new_per_s=1000, burst=1000)
    a, _ = table.admit(0, "actor", 0)
    b, _ = table.admit(0, "actor", 0)
    with pytest.raises(SenderRefused, match="live senders"):
        table.admit(0, "actor", 0)
    now[0] += 20
    assert table.heard(b)  # b spoke: a is now the one silent longest
    now[0] += 15  # a silent for 35 s, b for 15 s
    c, new = table.admit(0, "actor", 0)
    assert new and a not in table and b in table and c in table
    assert table.admit(b, "actor", 0) == (b, False)  # a live id claimed back is kept
    with pytest.raises(SenderRefused):  # ... by the role it was handed to: another role needs a new id
        table.admit(b, "server", 0)


def test_a_learner_without_actors_says_where_it_waits_for_them(make_learner):
    from types import SimpleNamespace

    from zrl.learner.report import Report

    learner, _ = make_learner(small_config(), start=False)
    lines, scalars = [], {}
    metrics = SimpleNamespace(line=lines.append, scalars=lambda values, step: scalars.update(values), progress=lambda record: None)
    Report(learner.progress, metrics, learner.source.fill, learner.control_endpoint).waiting(3.0, learner.algo.waiting_for())
    assert f"waiting for actors to connect to {learner.control_endpoint}" in lines[0] and scalars["actors/connected"] == 0


@pytest.mark.timeout(120)
def test_messages_built_to_make_a_check_raise_are_counted_and_training_goes_on(ctx, make_learner, make_actor, tmp_path, caplog):
    """A hello whose JSON nests 30,000 deep (json.loads recurses), stats whose lengths sum past
    int64, returns without lengths, and eval returns from an actor: each refused by reason."""
    caplog.set_level(logging.WARNING, "zrl.learner")
    w = Watched(make_learner, make_actor, cfg_for_limits(), tmp_path)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(w.learner.control_endpoint)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(w.learner.trajectory_endpoint)
    try:
        dealer.send(wire.encode(wire.Kind.HELLO, meta=b'{"protocol": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"))
        assert dealer.poll(30_000) and "nested too deeply" in wire.decode(dealer.recv()).text()
        sid = sender_id_from_hello(ctx, w.learner, w.cfg)
        bad = [{"episode_return": np.array([1.0, 2.0]), "episode_length": np.array([1e308, 1e308])},
               {"episode_return": np.array([9e6] * 100)},
               {"episode_return": np.array([1.0] * 4), "episode_length": np.array([1.0])},
               {"eval_return": np.array([500.0]), "eval_length": np.array([500.0])}]
        for arrays in bad:
            push.send(wire.encode(wire.Kind.STATS, arrays, sender_id=sid))
        wait_for(lambda: w.learner.rejected["bad_value"] == len(bad), 30, lambda: f"the stats refused ({dict(w.learner.rejected)})")
    finally:
        dealer.close(0)
        push.close(0)
    assert w.learner.rejected["hello_refused"] == 1 and "internal_error" not in w.learner.rejected
    assert 9e6 not in w.learner.returns and not w.learner.eval_returns
    w.memory_bounded()
    w.still_training()
    w.counted("bad_value", caplog, at_least=len(bad))


@pytest.mark.timeout(120)
def test_an_actor_told_the_learner_is_busy_says_hello_again_until_it_gets_in(ctx, make_learner, make_actor, tmp_path):
    """A stranger holds the only sender id: the actor's hello is refused as busy, and the
    actor, rather than exiting, asks again until the stranger's id has gone silent."""
    cfg = cfg_for_limits("learner.max_senders=1", "learner.actor_timeout_s=1")
    learner, runner = make_learner(cfg, logdir=tmp_path / "run")
    sender_id_from_hello(ctx, learner, cfg)  # the stranger, silent from now on
    actor, actor_runner = make_actor(cfg, learner=learner.control_endpoint)
    wait_for(lambda: learner.rejected["too_many_senders"] >= 1, 30, "the actor's first hello refused")
    wait_for(lambda: learner.updates >= 3, 60, "the actor training once the stranger's id went silent")
    assert actor_runner.thread.is_alive() and runner.thread.is_alive()


def test_a_link_adopts_the_new_id_a_liveness_check_brings_back(ctx, endpoint):
    import torch

    from zrl.actors.link import HelloReply, LearnerLink

    said = []
    link = LearnerLink(ctx, endpoint, {}, torch.nn.Linear(2, 2), timeout_s=1.0, send_hwm=10, stop=threading.Event(), say=said.append)
    link.endpoints, link.instance, link.sender_id = ("tcp://a:1", "tcp://a:2"), "i1", 7
    info = {"trajectory_endpoint": "tcp://a:1", "weights_endpoint": "tcp://a:2", "learner_instance": "i1", "sender_id": 9}
    assert link.follow(HelloReply(info, None)) is False  # the same learner: nothing reopened
    assert link.sender_id == 9 and "new sender id" in said[-1]
