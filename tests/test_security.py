"""CURVE: authorised peers train; anyone else gets nothing in and nothing out."""
from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
import zmq
import zmq.auth

from zrl import transport, wire
from zrl.actors.actor import hello_meta, say_hello
from zrl.client import Client, ClientTimeout
from zrl.keys import generate_keys
from zrl.server import AgentServer
from zrl import spaces
from helpers import ROOT, Running, small_config, wait_for

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq was built without CURVE")


@pytest.fixture
def keys(tmp_path):
    d = tmp_path / "keys"
    generate_keys(d, clients=1)
    zmq.auth.create_certificates(str(tmp_path), "stranger")  # a key pair nobody authorised
    return d, tmp_path / "stranger.key_secret"


def curve_config(keys_dir, *overrides):
    return small_config(
        "security.curve=true",
        f"security.server_secret_key={keys_dir / 'server.key_secret'}",
        f"security.authorized_keys={keys_dir / 'authorized'}",
        f"security.server_public_key={keys_dir / 'server.key'}",
        f"security.client_secret_key={keys_dir / 'client.key_secret'}",
        *overrides,
    )


def test_curve_requires_every_key():
    from zrl.config import ConfigError

    with pytest.raises(ConfigError, match="security.server_secret_key"):
        small_config("security.curve=true")


def test_authorised_actor_trains_and_a_stranger_gets_nothing(ctx, keys, make_learner, make_actor):
    keys_dir, stranger_secret = keys
    cfg = curve_config(keys_dir)
    learner, _ = make_learner(cfg, bind="tcp://127.0.0.1:*")
    make_actor(cfg, learner=learner.control_endpoint)
    wait_for(lambda: learner.updates >= 3, 60, "the authorised actor's data to train the learner")

    stranger = transport.Curve(server_public_key=str(keys_dir / "server.key"), client_secret_key=str(stranger_secret))
    meta = hello_meta(cfg, "actor", 7, spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2), cfg.actor.num_envs)
    # Nothing in: no hello reply, and pushed trajectories never arrive.
    assert say_hello(ctx, learner.control_endpoint, meta, timeout_s=1.0, curve=stranger) is None
    steps_before, rejected_before = learner.env_steps, dict(learner.rejected)
    socks = []

    def stranger_socket(kind, curve):
        s = ctx.socket(kind)
        socks.append(s)
        s.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            curve.client(s)
        return s

    try:
        push = stranger_socket(zmq.PUSH, stranger)
        push.connect(learner.trajectory_endpoint)
        for _ in range(5):
            try:
                push.send(b"from a stranger", zmq.NOBLOCK)
            except zmq.Again:
                pass  # the handshake was refused: nowhere to queue it
        # Nothing out: a stranger's SUB hears no weights while the learner keeps publishing.
        sub = stranger_socket(zmq.SUB, stranger)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(learner.weights_endpoint)
        # ... and a peer without any keys is refused as well.
        plain = stranger_socket(zmq.DEALER, None)
        plain.connect(learner.control_endpoint)
        try:
            plain.send(wire.encode(wire.Kind.HELLO, meta=meta), zmq.NOBLOCK)
        except zmq.Again:
            pass  # refused before it could even queue
        updates = learner.updates
        wait_for(lambda: learner.updates >= updates + 10, 60, "more publishes")
        assert not sub.poll(500)
        assert not plain.poll(200)
        assert learner.rejected == rejected_before  # the garbage never reached the receiver
        assert 7 not in learner.senders
    finally:
        for sock in socks:
            sock.close()
    assert learner.env_steps >= steps_before


def test_agent_server_admits_only_authorised_clients(ctx, keys):
    keys_dir, stranger_secret = keys
    cfg = curve_config(
        keys_dir, "actor.num_envs=1", "learner.batch_size=4",
        "server.observation_space={type: box, shape: [4], dtype: float32}", "server.action_space={type: discrete, n: 2}",
    )
    stop = threading.Event()
    server = AgentServer(cfg, "tcp://127.0.0.1:*", None, ctx=ctx, stop=stop, console=False)
    runner = Running(server.run, "server")
    obs = {"type": "box", "shape": [4], "dtype": "float32"}
    act = {"type": "discrete", "n": 2}
    try:
        good = Client(server.endpoint, obs, act, ctx=ctx, timeout=10, server_public_key=str(keys_dir / "server.key"), client_secret_key=str(keys_dir / "client.key_secret"))
        assert good.init(np.zeros(4, np.float32)) in (0, 1)
        good.disconnect()
        bad = Client(server.endpoint, obs, act, ctx=ctx, timeout=0.5, server_public_key=str(keys_dir / "server.key"), client_secret_key=str(stranger_secret))
        with pytest.raises(ClientTimeout):
            bad.init(np.zeros(4, np.float32))
        bad.disconnect()
        plain = Client(server.endpoint, obs, act, ctx=ctx, timeout=0.5)
        with pytest.raises(ClientTimeout):
            plain.init(np.zeros(4, np.float32))
        plain.disconnect()
        assert server.stats.sessions_opened == 1
    finally:
        stop.set()
        runner.join(30)


@pytest.mark.timeout(60)
def test_learner_warns_when_exposed_without_curve(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "zrl", "learner", "--bind", "tcp://0.0.0.0:*", "--logdir", str(tmp_path), "--max-seconds", "0.5"],
        cwd=ROOT, capture_output=True, text=True, timeout=50,
    )
    assert p.returncode == 0, p.stderr
    assert "without CURVE" in p.stderr


def test_keys_generate_writes_pairs_and_authorises_clients(tmp_path):
    lines = generate_keys(tmp_path / "k", clients=2)
    for name in ("server", "client", "client2"):
        pub, sec = zmq.auth.load_certificate(str(tmp_path / "k" / f"{name}.key_secret"))
        assert len(pub) == 40 and len(sec) == 40
    assert sorted(p.name for p in (tmp_path / "k" / "authorized").iterdir()) == ["client.key", "client2.key"]
    assert "security:" in lines[-1]


def test_keys_generate_never_reauthorises_a_revoked_key(tmp_path):
    d = tmp_path / "k"
    generate_keys(d, clients=2)
    (d / "authorized" / "client2.key").unlink()  # revoked, as docs/DEPLOY.md says
    lines = generate_keys(d, clients=3)
    # Only the pair this call made is authorised; the kept pairs are left as they were.
    assert sorted(p.name for p in (d / "authorized").iterdir()) == ["client.key", "client3.key"]
    assert (d / "client2.key_secret").exists()
    assert any("authorised 1 new client key(s)" in line for line in lines)
    assert any("left the authorisation of 2 existing client key(s) as it is" in line for line in lines)
    assert "security:" in lines[-1]
