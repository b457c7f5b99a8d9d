"""The agent server and the Python client: handshake, stepping, batching, sessions, training."""
from __future__ import annotations

import contextlib
import struct
import threading

import gymnasium as gym
import numpy as np
import pytest
import zmq

from zrl import wire
from zrl.client import Client, ClientTimeout, ServerError, UsageError
from zrl.server import AgentServer
from helpers import Running, small_config, wait_for

OBS = {"type": "box", "shape": [4], "dtype": "float32"}
ACT = {"type": "discrete", "n": 2}


def serve_config(*overrides):
    return small_config(
        "actor.num_envs=1",
        "learner.batch_size=4",
        "server.observation_space={type: box, shape: [4], dtype: float32}",
        "server.action_space={type: discrete, n: 2}",
        *overrides,
    )


@pytest.fixture
def make_server(ctx, endpoint):
    made = []

    def make(cfg, *, learner=None, run=True, bind=None):
        stop = threading.Event()
        server = AgentServer(cfg, bind or endpoint + "-server", learner, ctx=ctx, stop=stop, console=False)
        runner = Running(server.run, "server") if run else None
        made.append((server, stop, runner))
        return server

    yield make
    for server, stop, runner in made:
        stop.set()
        if runner is not None:
            runner.join(30)
        else:
            server.close()


def client(ctx, server, **kw):
    return Client(server.endpoint, OBS, ACT, ctx=ctx, timeout=kw.pop("timeout", 10), **kw)


def test_round_trip_and_total_reward(ctx, make_server):
    server = make_server(serve_config())
    c = client(ctx, server)
    obs = np.zeros(4, np.float32)
    a = c.init(obs)
    assert a in (0, 1)
    for _ in range(5):
        assert c.send(1.5, obs) in (0, 1)
    assert c.reset(2.0) == pytest.approx(5 * 1.5 + 2.0)
    assert c.client_id == 1
    c.disconnect()
    wait_for(lambda: not server.sessions, 10, "BYE to end the session")


def test_hello_with_other_specs_is_refused_with_the_reason(ctx, make_server):
    server = make_server(serve_config())
    c = Client(server.endpoint, {"type": "box", "shape": [5], "dtype": "float32"}, ACT, ctx=ctx, timeout=10)
    with pytest.raises(ServerError, match=r"observation spec.*differs"):
        c.init(np.zeros(5, np.float32))
    c.disconnect()
    c = Client(server.endpoint, OBS, {"type": "discrete", "n": 3}, ctx=ctx, timeout=10)
    with pytest.raises(ServerError, match="action spec"):
        c.init(np.zeros(4, np.float32))
    c.disconnect()


def test_calls_out_of_order_and_bad_observations(ctx, make_server):
    server = make_server(serve_config())
    c = client(ctx, server)
    with pytest.raises(UsageError, match="init"):
        c.send(1.0, np.zeros(4, np.float32))
    with pytest.raises(UsageError, match="shape"):
        c.init(np.zeros(3, np.float32))
    c.init(np.zeros(4, np.float32))
    with pytest.raises(UsageError, match="final_obs"):
        c.reset(1.0, truncated=True)
    c.disconnect()
    # A raw ACT without FIRST gets the server's reason.
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(server.endpoint)
    try:
        meta = {"role": "client", "protocol": 1, "name": "raw", "obs_space": {**OBS, "low": None, "high": None}, "action_space": ACT}
        s.send(wire.encode(wire.Kind.HELLO, meta=meta, seq=1))
        assert s.poll(10_000)
        assert wire.decode(s.recv()).kind == wire.Kind.HELLO_REPLY
        s.send(wire.encode(wire.Kind.ACT, {"obs": np.zeros(4, np.float32), "reward": np.float32(0), "flags": np.uint8(0)}, seq=2))
        assert s.poll(10_000)
        reply = wire.decode(s.recv())
        assert reply.kind == wire.Kind.ERROR and "init" in reply.text() and reply.seq == 2
        s.send(wire.encode(wire.Kind.ACT, {"obs": np.zeros(4, np.float64), "reward": np.float32(0), "flags": np.uint8(1)}, seq=3))
        assert s.poll(10_000)
        reply = wire.decode(s.recv())
        assert reply.kind == wire.Kind.ERROR and "obs" in reply.text()
        s.send(b"garbage")
        assert s.poll(10_000)
        assert wire.decode(s.recv()).kind == wire.Kind.ERROR
        # An empty obs with dims no array can have (0 bytes, so its length checks out):
        # refused as bad_shape, and the server goes on serving.
        huge = bytearray(wire.encode(wire.Kind.ACT, {"obs": np.zeros((0, 1, 1, 1), np.float32), "reward": np.float32(0), "flags": np.uint8(1)}, seq=4))
        struct.pack_into("<3I", huge, wire.HEADER_SIZE + 44, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)  # dims 1-3 of array 0
        s.send(bytes(huge))
        assert s.poll(10_000)
        reply = wire.decode(s.recv())
        assert reply.kind == wire.Kind.ERROR and "bad_shape" in reply.text()
        s.send(wire.encode(wire.Kind.ACT, {"obs": np.zeros(4, np.float32), "reward": np.float32(0), "flags": np.uint8(1)}, seq=5))
        assert s.poll(10_000)
        assert wire.decode(s.recv()).kind == wire.Kind.ACTION
    finally:
        s.close()
    assert server.stats.rejected["refused"] >= 1 and server.stats.rejected["bad_shape"] >= 1


def test_queued_requests_are_answered_by_one_forward_pass(ctx, make_server):
    server = make_server(serve_config(), run=False)
    n = 6
    socks = []
    try:
        for i in range(n):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(server.endpoint)
            meta = {"role": "client", "protocol": 1, "name": f"c{i}", "obs_space": {**OBS, "low": None, "high": None}, "action_space": ACT}
            s.send(wire.encode(wire.Kind.HELLO, meta=meta, seq=1))
            socks.append(s)
        wait_for(lambda: server.serve_once(10) or len(server.sessions) == n, 10, "hellos")
        wait_for(lambda: len(server.sessions) == n, 10, "all sessions")
        for s in socks:
            assert s.poll(10_000)
            s.recv()
        for s in socks:
            s.send(wire.encode(wire.Kind.ACT, {"obs": np.zeros(4, np.float32), "reward": np.float32(0), "flags": np.uint8(1)}, seq=2))
        handled = server.serve_once(1000)
        assert handled == n
        assert server.stats.batches == 1 and server.stats.batch_sizes == n  # one forward pass for all six
        for s in socks:
            assert s.poll(10_000)
            reply = wire.decode(s.recv())
            assert reply.kind == wire.Kind.ACTION and reply.seq == 2 and int(reply.arrays["action"]) in (0, 1)
        # A lone request is answered on its own, without waiting for company.
        socks[0].send(wire.encode(wire.Kind.ACT, {"obs": np.zeros(4, np.float32), "reward": np.float32(1), "flags": np.uint8(0)}, seq=3))
        assert server.serve_once(1000) == 1
        assert server.stats.batches == 2 and server.stats.batch_sizes == n + 1
    finally:
        for s in socks:
            s.close()


def test_silent_and_departed_clients_do_not_accumulate(ctx, make_server):
    server = make_server(serve_config("server.client_timeout_s=0.3"))
    for i in range(30):
        c = client(ctx, server)
        c.init(np.zeros(4, np.float32))
        if i % 2:
            c.disconnect()  # says BYE
        else:
            c._close_socket()  # vanishes mid-episode
    wait_for(lambda: not server.sessions, 20, "every session to be dropped")
    assert server.stats.sessions_opened == 30 and server.stats.sessions_dropped == 30


def test_lost_server_times_out_then_the_client_reconnects(ctx, endpoint, make_server):
    bind = endpoint + "-flaky"
    c = Client(bind, OBS, ACT, ctx=ctx, timeout=0.3)
    with pytest.raises(ClientTimeout, match="no reply"):
        c.init(np.zeros(4, np.float32))
    server = make_server(serve_config(), bind=bind)
    c.timeout = 10
    assert c.init(np.zeros(4, np.float32)) in (0, 1)  # a fresh socket and hello
    assert server.sessions
    c.disconnect()


def play(ctx, server, seconds_or_done, seed):
    env = gym.make("CartPole-v1", max_episode_steps=30)
    c = client(ctx, server)
    obs, _ = env.reset(seed=seed)
    a = c.init(obs)
    returns = []
    while not seconds_or_done():
        obs, r, te, tr, _ = env.step(a)
        if te or tr:
            truncated = tr and not te
            returns.append(c.reset(r, truncated=truncated, final_obs=obs if truncated else None))
            obs, _ = env.reset()
            a = c.init(obs)
        else:
            a = c.send(r, obs)
    c.metrics().scalar("score", 42.0)
    c.disconnect()
    env.close()
    return returns


def learner_and_server(cfg, endpoint, make_learner, make_server):
    """An in-process learner, and a server that has joined it: (learner, its runner, server)."""
    learner, runner = make_learner(cfg)
    server = make_server(cfg, learner=endpoint)
    wait_for(lambda: server.link is not None and server.link.push is not None, 30, "server to join the learner")
    return learner, runner, server


@contextlib.contextmanager
def clients_playing(ctx, server, n):
    """n clients playing CartPole through the server while the block runs; the list it yields
    holds their episode returns once the block has ended."""
    done = threading.Event()
    runners = [Running(lambda i=i: play(ctx, server, done.is_set, i), f"client-{i}") for i in range(n)]
    results: list = []
    try:
        yield results
    finally:
        done.set()
        results.extend(r.join(30) for r in runners)


def test_clients_train_the_learner_through_the_server(ctx, endpoint, make_learner, make_server):
    learner, _, server = learner_and_server(serve_config(), endpoint, make_learner, make_server)
    with clients_playing(ctx, server, 3) as results:
        wait_for(lambda: learner.updates >= 5 and learner.episodes >= 10, 60, "learner to train on client data")
        wait_for(lambda: server.policy_version >= 1, 30, "server to apply new weights")
    assert all(len(r) > 0 for r in results)
    # Truncated episodes (time limit 30) were sent with their final observation.
    assert learner.rejected == {}, dict(learner.rejected)
    wait_for(lambda: learner.custom.get("score") == 42.0, 30, "a client scalar to reach the learner")


def test_the_server_follows_a_learner_restarted_on_new_endpoints(ctx, endpoint, make_learner, make_server):
    # As with tcp ports "*": the restarted learner binds other trajectory and weights endpoints.
    first, runner, server = learner_and_server(serve_config("actor.learner_timeout_s=0.5"), endpoint, make_learner, make_server)
    with clients_playing(ctx, server, 2):
        wait_for(lambda: first.updates >= 2, 60, "the first learner to train")
        old_endpoints = server.link.endpoints
        first.request_stop()
        runner.join(30)
        # It dies as a killed process would: no SHUTDOWN on its weights socket (close() sends one,
        # and a server that gets it exits, as actors do).
        first._stop.set()
        first.receiver.join(5)
        first.sockets.close()
        moved = serve_config("actor.learner_timeout_s=0.5", f"learner.trajectory_bind={endpoint}-traj2", f"learner.weights_bind={endpoint}-weights2")
        restarted = []

        def restart():  # the same control endpoint, as a restart on the same --bind; ZeroMQ frees
            try:        # a closed socket's inproc name asynchronously, as the OS does a port
                restarted.append(make_learner(moved, bind=endpoint)[0])
            except OSError as e:
                assert "Address already in use" in str(e), e
            return restarted

        wait_for(restart, 30, "the control endpoint to be free again")
        second = restarted[0]
        wait_for(lambda: server.link.endpoints != old_endpoints, 60, "the server to follow the learner to its new endpoints")
        wait_for(lambda: second.env_steps > 0 and second.updates >= 2, 60, "the restarted learner to train on client data")


def test_the_server_serves_a_checkpoints_weights_and_says_which(tmp_path, ctx, endpoint, make_server, caplog):
    import logging

    import torch

    from zrl import checkpoint

    cfg = serve_config()
    plain = make_server(cfg, run=False)
    weights = {k: v + 1.0 for k, v in plain.model.state_dict().items()}
    obs, act = plain.obs_spec.to_json(), plain.action_spec.to_json()
    checkpoint.save(tmp_path / "checkpoints", 7, {
        "model_hash": cfg.model_hash(obs, act), "model_shaping": cfg.model_shaping(obs, act), "model": weights, "optimizer": {},
        "counters": {"updates": 7, "env_steps": 70, "episodes": 1}, "config": cfg.to_dict()}, keep=1)
    with caplog.at_level(logging.INFO, logger="zrl.server"):
        served = AgentServer(cfg, endpoint + "-checkpoint", None, ctx=ctx, console=False, checkpoint_path=str(tmp_path))
    try:
        for k, v in served.model.state_dict().items():
            assert torch.equal(v, weights[k]), k
        assert "ckpt-000000000007.pt (update 7, env step 70)" in caplog.text
    finally:
        served.close()


def raw_client(ctx, server):
    """A DEALER socket to the server, without the Python client's own checks."""
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(server.endpoint)
    return s


def raw_hello(obs_space=None, action_space=None, name="raw"):
    meta = {"role": "client", "protocol": 1, "name": name, "obs_space": obs_space or {**OBS, "low": None, "high": None},
            "action_space": action_space or ACT}
    return wire.encode(wire.Kind.HELLO, meta=meta, seq=1)


def raw_act(seq, flags, obs=None, reward=0.0):
    arrays = {} if obs is None else {"obs": np.asarray(obs, np.float32)}
    return wire.encode(wire.Kind.ACT, {**arrays, "reward": np.float32(reward), "flags": np.uint8(flags)}, seq=seq)


def ask(s, frame, serve=None):
    """Sends a request and returns the reply (serve(): one server iteration, when it does not run on a thread)."""
    s.send(frame)
    wait_for(lambda: (serve and serve(), s.poll(0))[1], 10, "a reply")
    return wire.decode(s.recv())


@pytest.mark.timeout(60)
def test_hellos_with_numbers_out_of_range_are_refused_and_the_server_goes_on(ctx, make_server):
    server = make_server(serve_config())
    big = "1" + "0" * 400  # JSON allows numbers no float holds; 1e400 too; NaN and Infinity too
    box = '{"type":"box","shape":[4],"dtype":"float32","low":null,"high":null}'
    metas = [
        '{"type":"box","shape":[4],"dtype":"float32","low":' + big + ',"high":null}',
        '{"type":"box","shape":[4],"dtype":"float32","low":null,"high":-1e400}',  # (+1e400 reads as no bound)
        '{"type":"box","shape":[4],"dtype":"float32","low":NaN,"high":null}',
        '{"type":"box","shape":[' + big + '],"dtype":"float32","low":null,"high":null}',
    ]
    hellos = ['{"role":"client","protocol":1,"name":"x","obs_space":' + m + ',"action_space":{"type":"discrete","n":2}}' for m in metas]
    hellos += ['{"role":"client","protocol":1,"name":"x","obs_space":' + box + ',"action_space":{"type":"discrete","n":' + n + "}}"
               for n in ("1e400", big)]
    s = raw_client(ctx, server)
    try:
        for i, meta in enumerate(hellos):
            reply = ask(s, wire.encode(wire.Kind.HELLO, meta=meta, seq=i + 1))
            assert reply.kind == wire.Kind.ERROR and "bad space spec" in reply.text(), reply.text()
    finally:
        s.close()
    assert server.stats.rejected["refused"] == len(hellos)
    c = client(ctx, server)
    assert c.init(np.zeros(4, np.float32)) in (0, 1)  # the server still serves
    c.disconnect()


@pytest.mark.timeout(60)
def test_non_finite_observations_are_refused_and_other_clients_go_on(ctx, make_server):
    server = make_server(serve_config())
    good = client(ctx, server, name="good")
    zeros = np.zeros(4, np.float32)
    assert good.init(zeros) in (0, 1)
    s = raw_client(ctx, server)
    try:
        assert ask(s, raw_hello()).kind == wire.Kind.HELLO_REPLY
        reply = ask(s, raw_act(2, 1, [np.nan, 0, 0, 0]))  # FIRST with a NaN: its logits would be NaN
        assert reply.kind == wire.Kind.ERROR and reply.seq == 2 and "bad_value" in reply.text(), reply.text()
        assert ask(s, raw_act(3, 1, zeros)).kind == wire.Kind.ACTION
        reply = ask(s, raw_act(4, 0, [0, -np.inf, 0, 0], reward=1.0))
        assert reply.kind == wire.Kind.ERROR and "bad_value" in reply.text(), reply.text()
        reply = ask(s, raw_act(5, 2 | 4, [0, 0, np.inf, 0], reward=1.0))  # a truncated episode's final obs
        assert reply.kind == wire.Kind.ERROR and "bad_value" in reply.text(), reply.text()
    finally:
        s.close()
    assert server.stats.rejected["bad_value"] == 3
    assert good.send(1.0, zeros) in (0, 1)
    # The Python client refuses them itself, as the C++ client does a non-finite reward or metric.
    with pytest.raises(UsageError, match="NaN or infinite"):
        good.send(1.0, np.array([0, np.nan, 0, 0], np.float32))
    with pytest.raises(UsageError, match="NaN or infinite"):
        good.send(1.0, np.array([1e300, 0, 0, 0]))  # float64, infinite once cast to the spec's float32
    with pytest.raises(UsageError, match="NaN or infinite"):
        good.reset(1.0, truncated=True, final_obs=np.array([0, 0, 0, np.inf], np.float32))
    with pytest.raises(UsageError, match="reward must be finite"):
        good.send(float("nan"), zeros)
    with pytest.raises(UsageError, match="reward must be finite"):
        good.send(1e300, zeros)  # finite as a Python float, infinite as the float32 sent
    with pytest.raises(UsageError, match="finite"):
        good.metrics().scalar("score", float("inf"))
    assert good.reset(1.0) == pytest.approx(2.0)  # none of those reached the server
    assert server.stats.rejected["bad_value"] == 3
    good.disconnect()


@pytest.mark.timeout(60)
def test_a_request_that_raises_unexpectedly_is_refused_alone(ctx, make_server, monkeypatch, caplog):
    import logging

    server = make_server(serve_config(), run=False)
    act = server.policy.act

    def policy_act(obs, state=None):  # as the sampler does on NaN logits (huge but finite observations)
        if (obs == 7).any():
            raise ValueError("logits: row 0 has a NaN")
        return act(obs, state)

    monkeypatch.setattr(server.policy, "act", policy_act)
    socks = [raw_client(ctx, server) for _ in range(2)]
    serve = lambda: server.serve_once(10)  # noqa: E731
    try:
        for s in socks:
            assert ask(s, raw_hello(), serve).kind == wire.Kind.HELLO_REPLY
        good, bad = socks
        good.send(raw_act(2, 1, np.zeros(4)))
        bad.send(raw_act(2, 1, np.full(4, 7.0)))  # in one batch with good's, or alone: the same answers
        wait_for(lambda: (serve(), good.poll(0) and bad.poll(0))[1], 10, "both replies")
        assert wire.decode(good.recv()).kind == wire.Kind.ACTION
        reply = wire.decode(bad.recv())
        assert reply.kind == wire.Kind.ERROR and "cannot act" in reply.text(), reply.text()
        assert server.stats.rejected["bad_value"] == 1 and len(server.sessions) == 1  # its half-done session is dropped
        # Any other exception out of a request: counted, logged with its traceback, answered.
        monkeypatch.setattr(server, "_forward_stats", lambda msg: {}["boom"])
        with caplog.at_level(logging.ERROR, logger="zrl.server"):
            reply = ask(good, wire.encode(wire.Kind.STATS, {"x": np.zeros(1)}, seq=3), serve)
        assert reply.kind == wire.Kind.ERROR and "KeyError" in reply.text(), reply.text()
        assert server.stats.rejected["internal_error"] == 1 and "Traceback" in caplog.text
    finally:
        for s in socks:
            s.close()


@pytest.mark.timeout(60)
def test_scalar_times_out_when_the_server_is_gone(ctx, make_server, tmp_path):
    server = make_server(serve_config(), bind=f"ipc://{tmp_path}/server")
    c = Client(server.endpoint, OBS, ACT, timeout=10)  # its own context: a stuck send must not hold the test's
    c.init(np.zeros(4, np.float32))
    c.timeout = 0.2
    server.stop.set()
    wait_for(lambda: server.router.closed, 10, "the server to stop")

    def spam():  # STATS await no reply: they queue until the queue toward the server is full
        with pytest.raises(ClientTimeout, match="could not queue"):
            for i in range(100_000):
                c.metrics().scalar("x", float(i))
        return i

    Running(spam, "spam").join(20)  # before: blocked in send() for good
    assert c._sock is None  # closed: the next call says hello again
    with pytest.raises(ClientTimeout):
        c.metrics().scalar("x", 1.0)
    c.disconnect()
