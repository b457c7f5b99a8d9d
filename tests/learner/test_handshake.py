"""The handshake on the learner's control endpoint, and its errors."""
from __future__ import annotations

import threading
import time

import numpy as np
import torch
import pytest
import zmq

from zrl import spaces, wire
from zrl.actors.actor import HelloError, hello_meta, say_hello
from helpers import good_trajectory, small_config, wait_for

OBS = spaces.BoxSpec(shape=(4,), dtype="float32")
ACT = spaces.DiscreteSpec(n=2)
# A bound on a hello's reply, not a wait. The first hello builds the model: on a GPU machine
# that starts CUDA in the test's process, which took over 10 s with 12 test processes starting
# it on one H100 at once.
HELLO_S = 60.0


def meta_for(cfg, **change):
    m = hello_meta(cfg, "actor", 0, OBS, ACT, cfg.actor.num_envs)
    m.update(change)
    return m


def test_hello_reply_names_endpoints_specs_and_carries_weights(ctx, endpoint, make_learner):
    cfg = small_config()
    learner, _ = make_learner(cfg)
    reply = say_hello(ctx, endpoint, meta_for(cfg), timeout_s=HELLO_S)
    info = reply.info
    assert info["trajectory_endpoint"] == learner.trajectory_endpoint
    assert info["weights_endpoint"] == learner.weights_endpoint
    assert info["obs_space"] == OBS.to_json() and info["action_space"] == ACT.to_json()
    n = sum(p.numel() for p in learner.model.parameters())
    params = reply.weights.arrays["params"]
    assert params.shape == (n,) and params.dtype == np.float32
    assert info["policy_version"] == 0 == reply.weights.policy_version
    assert reply.sender_id != 0 and reply.sender_id in learner.senders


def test_a_hello_that_claims_its_live_id_keeps_it_and_gets_no_second_copy_of_the_weights(ctx, endpoint, make_learner):
    cfg = small_config()
    learner, _ = make_learner(cfg)
    first = say_hello(ctx, endpoint, meta_for(cfg), timeout_s=HELLO_S)
    again = say_hello(ctx, endpoint, meta_for(cfg), timeout_s=HELLO_S, sender_id=first.sender_id)
    assert again.sender_id == first.sender_id and again.weights is None and not again.info["weights_included"]
    stranger = say_hello(ctx, endpoint, meta_for(cfg), timeout_s=HELLO_S, sender_id=12345)  # an id never handed out
    assert stranger.sender_id not in (12345, first.sender_id) and stranger.weights is not None
    assert len(learner.senders) == 2


@pytest.mark.parametrize(
    "change,match",
    [
        ({"protocol": 99}, "protocol"),
        ({"algo": "apex_dqn"}, "algorithm"),
        ({"role": "spy"}, "role"),
        ({"obs_space": {"type": "box", "shape": "four"}}, "spec"),
        ({"unroll_length": 7}, "unroll_length"),
        ({"num_envs": 3}, "num_envs"),
        ({"model_hash": "0000"}, "model"),
    ],
)
def test_bad_hello_gets_an_error_the_actor_raises(ctx, endpoint, make_learner, change, match):
    cfg = small_config()
    learner, _ = make_learner(cfg)
    with pytest.raises(HelloError, match=match):
        say_hello(ctx, endpoint, meta_for(cfg, **change), timeout_s=HELLO_S)
    assert learner.rejected["hello_refused"] == 1


@pytest.mark.parametrize("sink", [True, False])
def test_hellos_are_answered_while_trajectories_stream_in(ctx, endpoint, make_learner, sink):
    """The receiver waits for data inside its drain and looks at the control socket every
    CONTROL_EVERY_MS: a steady stream of trajectories must not keep a hello waiting, whether
    the learner discards them (sink) or its queue fills up (training)."""
    cfg = small_config()
    learner, _ = make_learner(cfg, sink=sink)
    first = say_hello(ctx, endpoint, meta_for(cfg), timeout_s=HELLO_S)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.setsockopt(zmq.SNDTIMEO, 50)
    push.connect(first.info["trajectory_endpoint"])
    frame = wire.encode(wire.Kind.TRAJECTORY, good_trajectory(cfg), sender_id=first.sender_id)
    stop = threading.Event()

    def flood():
        while not stop.is_set():
            try:
                push.send(frame, copy=False)
            except zmq.Again:  # the learner's queue is full: ZeroMQ's back-pressure
                pass

    sender = threading.Thread(target=flood)
    sender.start()
    try:
        wait_for(lambda: learner.env_steps > 0, 30, "trajectories to arrive")
        for i in range(3):
            steps = learner.env_steps
            reply = say_hello(ctx, endpoint, meta_for(cfg), timeout_s=HELLO_S)
            assert reply is not None and reply.sender_id != first.sender_id
            wait_for(lambda: learner.env_steps > steps, 30, "more trajectories after the hello")
    finally:
        stop.set()
        sender.join()
        push.close(0)
    assert not learner.rejected, dict(learner.rejected)


def test_an_actor_with_another_network_is_told_which_model_keys_differ(ctx, endpoint, make_learner):
    cfg = small_config()
    make_learner(cfg)
    wider = small_config("model.hidden_sizes=[32, 32]")
    with pytest.raises(HelloError, match=r"model.hidden_sizes: \[32, 32\] here, \[64, 64\] on the learner"):
        say_hello(ctx, endpoint, meta_for(wider), timeout_s=HELLO_S)


def test_the_specs_come_from_the_config_and_no_hello_decides_them(ctx, endpoint, make_learner):
    """A stranger's hello with another action count, sent before any actor, is refused with
    a short reply; the model stays CartPole's and the real actor's hello is answered."""
    cfg = small_config()
    learner, _ = make_learner(cfg)
    assert (learner.obs_spec, learner.action_spec) == (OBS, ACT)
    m = hello_meta(cfg, "actor", 1, OBS, spaces.DiscreteSpec(n=7), cfg.actor.num_envs)
    with pytest.raises(HelloError, match="specs differ from the learner's") as refused:
        say_hello(ctx, endpoint, m, timeout_s=HELLO_S)
    assert len(str(refused.value)) < 1000
    assert say_hello(ctx, endpoint, meta_for(cfg), timeout_s=HELLO_S).weights is not None


def test_garbage_on_the_control_socket_gets_an_error_reply(ctx, endpoint, make_learner):
    cfg = small_config()
    learner, _ = make_learner(cfg)
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        s.send(b"not a zrl frame")
        assert s.poll(10_000)
        reply = wire.decode(s.recv())
        assert reply.kind == wire.Kind.ERROR and "bad hello" in reply.text()
        s.send_multipart([b"two", b"frames"])
        wait_for(lambda: learner.rejected["bad_header"] >= 1, 10, "multi-frame control message counted")
    finally:
        s.close()
    # and the learner still answers real hellos
    assert say_hello(ctx, endpoint, meta_for(cfg), timeout_s=HELLO_S) is not None


def test_hello_times_out_without_a_learner(ctx, endpoint):
    assert say_hello(ctx, endpoint, {"role": "actor"}, timeout_s=0.2) is None


def test_an_actor_waiting_for_a_learner_stops_without_waiting_out_its_timeout(endpoint, make_actor):
    # Ctrl-C while the learner is away: the hello's wait (actor.learner_timeout_s) used to run out first.
    cfg = small_config("actor.learner_timeout_s=60")
    actor, runner = make_actor(cfg)
    wait_for(lambda: actor.link is not None, 30, "the actor to say hello")
    t0 = time.monotonic()
    actor.stop.set()
    runner.thread.join(30)
    assert not runner.thread.is_alive() and time.monotonic() - t0 < 5


def test_actor_connects_and_gets_current_weights(make_learner, make_actor):
    cfg = small_config()
    learner, _ = make_learner(cfg)
    actor, _ = make_actor(cfg, max_steps=10**9)
    wait_for(lambda: learner.updates >= 3, 60, "learner updates from the actor's data")
    wait_for(lambda: actor.policy_version >= 1, 60, "actor applies published weights")
    assert actor.weights_applied >= 2  # the hello reply, then at least one broadcast


def test_endpoints_of_the_wrong_form_are_named_before_libzmq_sees_them():
    from zrl.client import Client, UsageError
    from zrl.transport import endpoint_problem

    for ep in ("tcp://127.0.0.1:5555", "tcp://learner.example:7", "ipc:///tmp/x", "inproc://a", "tcp://[::1]:80"):
        assert endpoint_problem(ep, binding=False) is None, ep
    assert endpoint_problem("tcp://127.0.0.1:*", binding=True) is None
    for ep, why in (("127.0.0.1:5555", "expected tcp://HOST:PORT, ipc://PATH or inproc://NAME"), ("udp://h:1", "expected tcp://"),
                    ("tcp://h", "expected tcp://HOST:PORT"), ("tcp://:5", "expected tcp://HOST:PORT"), ("ipc://", "nothing after"),
                    ("tcp://h:99999", "the port must be 1-65535"), ("tcp://h:0", "the port must be"), ("tcp://h:*", "can only be bound")):
        problem = endpoint_problem(ep, binding=False)
        assert problem is not None and why in problem, (ep, problem)
    assert "0-65535 or *" in endpoint_problem("tcp://h:99999", binding=True)
    assert endpoint_problem("tcp://127.0.0.1:0", binding=True) is None  # libzmq picks a port, as for *
    with pytest.raises(UsageError, match="expected tcp://HOST:PORT"):
        Client("127.0.0.1:5555", {"type": "box", "shape": [4], "dtype": "float32"}, {"type": "discrete", "n": 2})


def test_a_hello_declaring_a_huge_observation_is_refused_before_anything_is_built(ctx, endpoint, make_learner):
    cfg = small_config()
    learner, runner = make_learner(cfg)
    model = learner.model
    huge = spaces.BoxSpec(shape=(2**16, 2**16), dtype="float32")  # first layers of 2^38 weights, were it built
    with pytest.raises(HelloError, match="specs differ") as refused:
        say_hello(ctx, endpoint, hello_meta(cfg, "actor", 0, huge, ACT, cfg.actor.num_envs), timeout_s=HELLO_S)
    assert len(str(refused.value)) < 1000
    assert learner.rejected["hello_refused"] == 1 and learner.model is model
    assert say_hello(ctx, endpoint, meta_for(cfg), timeout_s=HELLO_S) is not None and runner.thread.is_alive()


def test_an_actor_says_hello_again_to_a_learner_restarted_on_the_same_endpoints(endpoint, make_learner, make_actor, tmp_path):
    # A learner that died and was started again on the same endpoints (an ipc path, fixed
    # ports) is a new instance: it takes no trajectories before a hello agrees the specs,
    # and ZeroMQ reconnects the actor's sockets by itself, so nothing else would tell it.
    cfg = small_config()  # actor.learner_timeout_s=2: the actor asks after 2 s without weights
    first, runner = make_learner(cfg)
    actor, actor_runner = make_actor(cfg)
    wait_for(lambda: first.updates >= 2, 60, "training with the first learner")
    endpoints = (first.trajectory_endpoint, first.weights_endpoint)
    first.request_stop()
    runner.thread.join(30)
    first._stop.set()  # a crash, not close(): no SHUTDOWN reaches the actor
    first.receiver.join(5)
    first.sockets.close()
    started = []

    def rebind() -> bool:  # libzmq frees an inproc name asynchronously after the close
        try:
            started.append(make_learner(cfg, logdir=tmp_path / "second")[0])  # the same bind, nothing resumed
        except OSError as e:
            assert "in use" in str(e), e
            return False
        return True

    wait_for(rebind, 10, "the first learner's endpoints to be free again")
    second = started[0]
    assert (second.trajectory_endpoint, second.weights_endpoint) == endpoints
    assert second.instance != first.instance
    wait_for(lambda: second.updates >= 2, 60, lambda: f"training with the second learner (rejected {dict(second.rejected)})")
    assert actor_runner.thread.is_alive() and actor.link.instance == second.instance


def test_a_probes_reply_from_before_a_reconnect_is_not_followed(ctx, endpoint):
    import threading
    import types

    import torch

    from zrl.actors.actor import LearnerLink

    link = LearnerLink(ctx, endpoint, {}, torch.nn.Linear(2, 2), sender_id=0, timeout_s=1.0, send_hwm=10,
                       stop=threading.Event(), say=lambda text: None)
    followed = []
    link.follow = followed.append
    done = threading.Event()
    done.set()
    for reopened, want in ((False, ["reply"]), (True, [])):
        followed.clear()
        link._probe, link._probe_opened = types.SimpleNamespace(done=done, reply="reply"), link._opened
        if reopened:  # the link reconnected (check_alive, say) while the probe was out
            link._opened += 1
        link._watch()
        assert followed == want and link._probe is None


def test_a_learner_whose_resume_fails_unbinds_its_endpoints(ctx, endpoint, tmp_path, monkeypatch):
    from zrl import checkpoint
    from zrl.learner import learner as learner_mod

    cfg = small_config()
    from zrl.learner.resume import ResumeState

    monkeypatch.setattr(learner_mod, "find_resume", lambda config, ckdir, say: ResumeState(ckdir, {"obs_spec": OBS.to_json(), "action_spec": ACT.to_json()}))

    def bad_build(self, obs, act):
        raise checkpoint.CheckpointError("does not fit the model")

    monkeypatch.setattr(learner_mod.Learner, "_build", bad_build)
    with pytest.raises(checkpoint.CheckpointError):
        learner_mod.Learner(cfg, endpoint, tmp_path / "run", resume=True, ctx=ctx, console=False)
    monkeypatch.undo()
    started = []

    def rebind() -> bool:  # the endpoints are free again (libzmq frees an inproc name asynchronously)
        try:
            started.append(learner_mod.Learner(cfg, endpoint, tmp_path / "run2", ctx=ctx, console=False))
        except OSError as e:
            assert "in use" in str(e), e
            return False
        return True

    wait_for(rebind, 10, "the failed learner's endpoints to be free")
    started[0].close()


@pytest.mark.parametrize("config, overrides", [
    ("cartpole_impala.yaml", []), ("cartpole_impala.yaml", ["model.lstm_size=16"]), ("cartpole_apex.yaml", []),
    ("pong_impala.yaml", []), ("pong_impala.yaml", ["model.network=impala_deep", "model.lstm_size=32"]),
])
def test_the_learner_sizes_every_shipped_model_without_building_it(config, overrides):
    # The size check before a build must not be skipped for the models zrl ships: each one
    # builds on the meta device, to the count of the real build.
    from zrl.config import load_config
    from zrl.envs import probe_specs
    from zrl import algorithms
    from zrl.learner.device import check_training_fits, parameter_count

    from helpers import ROOT

    cfg = load_config(ROOT / "configs" / config, overrides)
    if cfg.env.id.startswith("ALE/"):
        pytest.importorskip("ale_py", reason="ale-py is not installed")
    algo = algorithms.get(cfg.algo.name)(cfg, *probe_specs(cfg.env))
    state = torch.random.get_rng_state()
    n = parameter_count(algo)
    assert torch.equal(torch.random.get_rng_state(), state)  # draws nothing: the real build's seed holds
    assert n == sum(p.numel() for p in algo.build_model().parameters()) > 0
    check_training_fits(algo, torch.device("cpu"))  # these fit
