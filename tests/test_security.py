"""CURVE: each server admits only its own role's keys (docs/DEPLOY.md, the trust model).

The learner's sockets admit actors and agent servers (security.authorized_keys); the
agent server's client socket admits simulator clients (security.client_keys). Anyone
else, a stranger or a peer of the other role, gets nothing in and nothing out.
"""
from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from zrl import transport, wire
from zrl.actors.actor import hello_meta, say_hello
from zrl.actors.sender import Sender
from zrl.client import Client, ClientTimeout
from zrl.config import ConfigError
from zrl.keys import generate_keys
from zrl.launch.roles import warn_if_exposed
from zrl.server import AgentServer
from zrl import spaces
from helpers import ROOT, Running, good_trajectory, small_config, wait_for

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq was built without CURVE")

OBS = {"type": "box", "shape": [4], "dtype": "float32"}
ACT = {"type": "discrete", "n": 2}
SERVE = ("actor.num_envs=1", "learner.batch_size=4",
         "server.observation_space={type: box, shape: [4], dtype: float32}", "server.action_space={type: discrete, n: 2}")


@pytest.fixture
def keys(tmp_path):
    d = tmp_path / "keys"
    generate_keys(d, clients=1)
    zmq.auth.create_certificates(str(tmp_path), "stranger")  # a key pair nobody authorised
    return d, tmp_path / "stranger.key_secret"


def curve_config(keys_dir, *overrides, client_keys=True):
    """A CURVE config from `zrl keys generate`'s layout; client_keys=False: one written before
    the agent server had its own allow-list (authorized_keys only)."""
    return small_config(
        "security.curve=true",
        f"security.server_secret_key={keys_dir / 'server.key_secret'}",
        f"security.authorized_keys={keys_dir / 'actors'}",
        *([f"security.client_keys={keys_dir / 'clients'}"] if client_keys else []),
        f"security.server_public_key={keys_dir / 'server.key'}",
        f"security.client_secret_key={keys_dir / 'actor.key_secret'}",
        *overrides,
    )


def key_of(keys_dir, secret_file) -> transport.Curve:
    """A CURVE client holding the key pair in `secret_file`, trusting keys_dir's server."""
    return transport.Curve(server_public_key=str(keys_dir / "server.key"), client_secret_key=str(secret_file))


class Intruder:
    """Sockets that one key pair opens to a CURVE server, each watched by a monitor that
    reports how its handshake ended: a refusal is seen, not inferred from a silence."""

    def __init__(self, ctx: zmq.Context, curve: transport.Curve):
        self.ctx, self.curve = ctx, curve
        self.opened: list[tuple[zmq.Socket, zmq.Socket]] = []

    def connect(self, kind: int, endpoint: str) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        self.curve.client(sock)
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.opened.append((sock, monitor))
        sock.connect(endpoint)
        return sock

    def handshake(self, sock: zmq.Socket, timeout: float = 30) -> int:
        """The first handshake outcome of `sock`: zmq.EVENT_HANDSHAKE_FAILED_AUTH or _SUCCEEDED."""
        monitor = next(m for s, m in self.opened if s is sock)
        if not monitor.poll(int(timeout * 1000)):
            raise AssertionError(f"no CURVE handshake outcome within {timeout}s")
        return recv_monitor_message(monitor)["event"]

    def close(self) -> None:
        for sock, monitor in self.opened:
            sock.disable_monitor()
            monitor.close()
            sock.close()


# A refused handshake is counted (curve_refused, and on the control socket also as a connection
# dropped before its first message); that is the refusal itself, not a message from the peer
# reaching the receiver.
CONNECTION_REASONS = frozenset({"control_dropped", "curve_refused"})


def messages_rejected_since(learner, before: dict) -> dict:
    """The message-level rejections counted since `before` (a copy of learner.rejected)."""
    return {r: n - before.get(r, 0) for r, n in learner.rejected.items() if n > before.get(r, 0) and r not in CONNECTION_REASONS}


def test_curve_requires_every_key():
    with pytest.raises(ConfigError, match="security.server_secret_key"):
        small_config("security.curve=true")


def test_authorised_actor_trains_and_a_stranger_gets_nothing(ctx, keys, make_learner, make_actor):
    keys_dir, stranger_secret = keys
    cfg = curve_config(keys_dir, client_keys=False)  # a learner needs only authorized_keys, as before
    learner, _ = make_learner(cfg, bind="tcp://127.0.0.1:*")
    make_actor(cfg, learner=learner.control_endpoint)
    wait_for(lambda: learner.updates >= 3, 60, "the authorised actor's data to train the learner")

    stranger = key_of(keys_dir, stranger_secret)
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
        assert not messages_rejected_since(learner, rejected_before)  # the garbage never reached the receiver
        assert 7 not in learner.senders
    finally:
        for sock in socks:
            sock.close()
    assert learner.env_steps >= steps_before


@pytest.mark.timeout(90)
def test_learner_refuses_a_simulator_clients_key(ctx, keys, make_learner, make_actor):
    """A client key that the agent server admits reaches none of the learner's sockets:
    no hello, no chunk, no stats (the fake return the red team pushed), no weights."""
    keys_dir, _ = keys
    cfg = curve_config(keys_dir)
    learner, _ = make_learner(cfg, bind="tcp://127.0.0.1:*")
    make_actor(cfg, learner=learner.control_endpoint)
    wait_for(lambda: learner.updates >= 3, 60, "the real actor's data to train the learner")
    rejected_before, fake_id, fake_return = dict(learner.rejected), 77, 34059.0

    client = Intruder(ctx, key_of(keys_dir, keys_dir / "client.key_secret"))
    try:
        meta = hello_meta(cfg, "actor", fake_id, spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2), cfg.actor.num_envs)
        control = client.connect(zmq.DEALER, learner.control_endpoint)
        control.send(wire.encode(wire.Kind.HELLO, meta=meta), zmq.NOBLOCK)  # queued until the handshake
        trajectory = client.connect(zmq.PUSH, learner.trajectory_endpoint)
        sender = Sender(fake_id)
        trajectory.send(sender.encode(wire.Kind.TRAJECTORY, good_trajectory(cfg), learner.updates), zmq.NOBLOCK)
        stats = {"episode_return": np.array([fake_return]), "episode_length": np.array([1.0])}
        trajectory.send(sender.encode(wire.Kind.STATS, stats, learner.updates), zmq.NOBLOCK)
        weights = client.connect(zmq.SUB, learner.weights_endpoint)
        weights.setsockopt(zmq.SUBSCRIBE, b"")
        for sock in (control, trajectory, weights):
            assert client.handshake(sock) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        wait_for(lambda: learner.rejected["curve_refused"] >= rejected_before.get("curve_refused", 0) + 3, 30,
                 "each socket's refusal counted")
        updates = learner.updates
        wait_for(lambda: learner.updates >= updates + 5, 60, "the real actor to keep training")
        assert not control.poll(0) and not weights.poll(0)  # nothing out
        assert not messages_rejected_since(learner, rejected_before)  # nothing in: not even as garbage
        assert fake_id not in learner.senders and fake_return not in learner.returns
    finally:
        client.close()


@pytest.mark.timeout(90)
def test_agent_server_admits_clients_and_refuses_actors(ctx, keys, make_learner):
    """The learner and an agent server on one context (one ZAP handler, two allow-lists):
    the server's learner link gets in with the actor key, a simulator client with the client
    key; the actor key, a stranger's and no key at all are refused by the agent server."""
    keys_dir, stranger_secret = keys
    cfg = curve_config(keys_dir, *SERVE)
    learner, _ = make_learner(cfg, bind="tcp://127.0.0.1:*")
    stop = threading.Event()
    server = AgentServer(cfg, "tcp://127.0.0.1:*", learner.control_endpoint, ctx=ctx, stop=stop, console=False)
    runner = Running(server.run, "server")
    obs = np.zeros(4, np.float32)

    def client_with(secret, timeout):
        curve = {} if secret is None else {"server_public_key": str(keys_dir / "server.key"), "client_secret_key": str(secret)}
        return Client(server.endpoint, OBS, ACT, ctx=ctx, timeout=timeout, **curve)

    try:
        good = client_with(keys_dir / "client.key_secret", 10)
        good.init(obs)
        wait_for(lambda: good.send(1.0, obs) is not None and learner.env_steps > 0, 60, "the client's steps to reach the learner")
        good.disconnect()
        for secret in (keys_dir / "actor.key_secret", stranger_secret, None):
            refused = client_with(secret, 0.5)
            with pytest.raises(ClientTimeout):
                refused.init(obs)
            refused.disconnect()
        assert server.stats.sessions_opened == 1
    finally:
        stop.set()
        runner.join(30)


def test_agent_server_with_curve_needs_client_keys(ctx, keys):
    keys_dir, _ = keys
    cfg = curve_config(keys_dir, *SERVE, client_keys=False)
    with pytest.raises(ConfigError, match=r"security\.client_keys"):
        AgentServer(cfg, "tcp://127.0.0.1:*", None, ctx=ctx, console=False)


@pytest.mark.timeout(60)
def test_learner_warns_when_exposed_without_curve(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "zrl", "learner", "--bind", "tcp://0.0.0.0:*", "--logdir", str(tmp_path), "--max-seconds", "0.5"],
        cwd=ROOT, capture_output=True, text=True, timeout=50,
    )
    assert p.returncode == 0, p.stderr
    assert "without CURVE" in p.stderr


@pytest.mark.timeout(60)
def test_learner_warns_of_an_exposed_trajectory_bind_behind_a_loopback_control(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "zrl", "learner", "--bind", "tcp://127.0.0.1:*", "-o", "learner.trajectory_bind=tcp://0.0.0.0:*",
         "--logdir", str(tmp_path), "--max-seconds", "0.5"],
        cwd=ROOT, capture_output=True, text=True, timeout=50,
    )
    assert p.returncode == 0, p.stderr
    warnings = [line for line in p.stderr.splitlines() if "without CURVE" in line]
    assert len(warnings) == 1 and "trajectory socket bound to tcp://0.0.0.0:" in warnings[0], p.stderr


def test_every_exposed_bind_warns_and_curve_silences_them(capsys):
    # (endpoint texts only: warn_if_exposed binds nothing)
    binds = {"control": "tcp://127.0.0.1:*", "trajectory": "ipc:///tmp/t", "weights": "tcp://10.0.0.1:*"}
    warn_if_exposed("learner", binds, small_config())
    warn_if_exposed("server", {"client": "tcp://0.0.0.0:*"}, small_config())
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "weights socket bound to tcp://10.0.0.1:*" in err[0] and "client socket" in err[1], err
    keys_config = small_config("security.curve=true", "security.server_secret_key=s", "security.authorized_keys=a",
                               "security.server_public_key=p", "security.client_secret_key=c")
    warn_if_exposed("learner", binds, keys_config)
    assert capsys.readouterr().err == ""


def test_keys_generate_writes_a_pair_and_an_allow_list_per_role(tmp_path):
    d = tmp_path / "k"
    lines = generate_keys(d, clients=2, actors=3)
    for name in ("server", "actor", "actor2", "actor3", "client", "client2"):
        pub, sec = zmq.auth.load_certificate(str(d / f"{name}.key_secret"))
        assert len(pub) == 40 and len(sec) == 40
    assert sorted(p.name for p in (d / "actors").iterdir()) == ["actor.key", "actor2.key", "actor3.key"]
    assert sorted(p.name for p in (d / "clients").iterdir()) == ["client.key", "client2.key"]
    # Each config key is named with the file it points at.
    for key, path in (("authorized_keys", d / "actors"), ("client_keys", d / "clients"), ("client_secret_key", d / "actor.key_secret")):
        assert any(line.startswith(f"security.{key}: {path} ") for line in lines), lines
    assert "security:" in lines[-1]
    assert len(generate_keys(tmp_path / "one", clients=1)) and (tmp_path / "one" / "actors" / "actor.key").exists()


def test_keys_generate_never_reauthorises_a_revoked_key(tmp_path):
    d = tmp_path / "k"
    generate_keys(d, clients=2)
    (d / "actors" / "actor2.key").unlink()  # revoked, as docs/DEPLOY.md says
    (d / "clients" / "client.key").unlink()
    lines = generate_keys(d, clients=3)
    # Only the pairs this call made are authorised; the kept pairs are left as they were.
    assert sorted(p.name for p in (d / "actors").iterdir()) == ["actor.key", "actor3.key"]
    assert sorted(p.name for p in (d / "clients").iterdir()) == ["client2.key", "client3.key"]
    assert (d / "actor2.key_secret").exists()
    assert any("authorised 1 new actor / agent-server key(s)" in line for line in lines)
    assert any("left the authorisation of 2 existing simulator-client key(s) as it is" in line for line in lines)
    assert "security:" in lines[-1]
