"""The agent server's limits (issue 43, items 5-7 and 13c): a flood of hellos, a client that
never reads its replies, rejections made visible, and the version of a checkpoint's weights.

Each flood test shows that real clients keep getting actions (and the learner keeps
training), that memory stays bounded, and that the event is counted by reason, logged
and exported to TensorBoard."""
from __future__ import annotations

import contextlib
import logging
import threading

import gymnasium as gym
import numpy as np
import psutil
import pytest

from zrl import checkpoint, wire
from zrl.client import Client, ServerError
from zrl.server import AgentServer
from zrl.server.stats import Tally
from helpers import CapturedChunks, Running, live_rss, wait_for
from test_server import ACT, OBS, raw_client, raw_hello, serve_config

FIRST = 1
ZEROS = np.zeros(4, np.float32)
MB = 2**20


class Servers:
    """Agent servers on inproc endpoints, each run on a thread unless run=False; all stopped at the end."""

    def __init__(self, ctx, endpoint):
        self.ctx = ctx
        self.endpoint = endpoint
        self.made: list[tuple[AgentServer, threading.Event, Running | None]] = []

    def start(self, cfg, *, run=True, learner=None, **kw) -> AgentServer:
        stop = threading.Event()
        server = AgentServer(cfg, f"{self.endpoint}-server{len(self.made)}", learner, ctx=self.ctx, stop=stop, console=False, **kw)
        self.made.append((server, stop, Running(server.run, "server") if run else None))
        return server

    def stop(self, server: AgentServer) -> None:
        for s, stop, runner in self.made:
            if s is server:
                stop.set()
                if runner is not None:
                    runner.join(30)
                else:
                    s.close()

    def stop_all(self) -> None:
        for server, _, _ in self.made:
            self.stop(server)


@pytest.fixture
def servers(ctx, endpoint):
    made = Servers(ctx, endpoint)
    yield made
    made.stop_all()


class Player:
    """A Python client playing CartPole through the server on a thread until stop();
    any error it meets (a refusal, a timeout) fails the test at stop()."""

    def __init__(self, ctx, endpoint: str, seed: int):
        self.steps = 0
        self._done = threading.Event()
        self._runner = Running(lambda: self._play(ctx, endpoint, seed), f"player-{seed}")

    def _play(self, ctx, endpoint: str, seed: int) -> None:
        env = gym.make("CartPole-v1", max_episode_steps=30)
        client = Client(endpoint, OBS, ACT, ctx=ctx, timeout=10)
        try:
            obs, _ = env.reset(seed=seed)
            action = client.init(obs)
            while not self._done.is_set():
                obs, reward, terminated, truncated, _ = env.step(action)
                if terminated or truncated:
                    cut = truncated and not terminated
                    client.reset(reward, truncated=cut, final_obs=obs if cut else None)
                    obs, _ = env.reset()
                    action = client.init(obs)
                else:
                    action = client.send(reward, obs)
                self.steps += 1
        finally:
            client.disconnect()
            env.close()

    def stop(self) -> None:
        self._done.set()
        self._runner.join(30)


@contextlib.contextmanager
def playing(ctx, server, n: int):
    """n Players through the server while the block runs; stopped (their errors raised) after it."""
    players = [Player(ctx, server.endpoint, seed) for seed in range(n)]
    try:
        yield players
    finally:
        for p in players:
            p._done.set()
        for p in players:
            p.stop()


def raw_act(seq, flags, reward=0.0):
    return wire.encode(wire.Kind.ACT, {"obs": ZEROS, "reward": np.float32(reward), "flags": np.uint8(flags)}, seq=seq)


def ask(s, frame, serve=None):
    """Sends a request and returns the reply (serve(): one server iteration, when it does not run on a thread)."""
    s.send(frame)
    wait_for(lambda: (serve and serve(), s.poll(0))[1], 10, "a reply")
    return wire.decode(s.recv())


def exported(logdir) -> dict[str, float]:
    """The last value of each TensorBoard scalar under logdir."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    ea.Reload()
    return {tag: ea.Scalars(tag)[-1].value for tag in ea.Tags()["scalars"]}


def logged(caplog, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records)


def admitted(client: Client) -> bool:
    """True once the client's hello opens a session (a refusal for the rate is retried)."""
    try:
        client.init(ZEROS)
    except ServerError as e:
        assert "too many new sessions" in str(e), e
        return False
    return True


def flood_hellos(ctx, server, n: int, per_round: int = 100) -> None:
    """n valid hellos, each from a socket of its own (a routing identity of its own);
    none of them acts or reads its reply."""
    stats = server.stats

    def answered():
        return stats.sessions_opened + stats.rejected["hello_rate"] + stats.rejected["server_full"]

    base = answered()
    for start in range(0, n, per_round):
        socks = [raw_client(ctx, server) for _ in range(per_round)]
        try:
            for s in socks:
                s.send(raw_hello(name="flood"))
            wait_for(lambda: answered() >= base + start + per_round, 20, "the server to answer the flood's hellos")
        finally:
            for s in socks:
                s.close()


# ---------------------------------------------------------------- 5: session exhaustion


@pytest.mark.timeout(60)
def test_a_flood_of_hellos_leaves_room_for_clients_that_act(ctx, servers, tmp_path, caplog):
    cfg = serve_config("server.max_clients=8", "server.new_sessions_burst=16", "server.new_sessions_per_s=50",
                       "server.first_act_timeout_s=0.5")
    server = servers.start(cfg, logdir=tmp_path / "server")
    proc = psutil.Process()
    newcomer = Client(server.endpoint, OBS, ACT, ctx=ctx, timeout=10)
    with caplog.at_level(logging.INFO, logger="zrl.server"), newcomer:
        with playing(ctx, server, 1) as (player,):
            wait_for(lambda: player.steps >= 20, 20, "the client to act")
            rss_before = live_rss(proc)
            flood_hellos(ctx, server, 2000)
            steps = player.steps
            wait_for(lambda: player.steps >= steps + 20, 10, "the acting client to go on")
            # A newcomer gets in once the bucket refills: a session that never acted makes room for it.
            wait_for(lambda: admitted(newcomer), 10, "a newcomer to get a session")
            wait_for(lambda: len(server.sessions) == 2, 10, "the flood's sessions to be dropped")
            growth = live_rss(proc) - rss_before
        servers.stop(server)
    rejected, drops = server.stats.rejected, server.stats.session_drops
    assert rejected["hello_rate"] > 1000 and rejected["server_full"] == 0, dict(rejected)
    assert drops["evicted"] >= 8 and drops["first_act_timeout"] >= 1, dict(drops)
    assert growth < 50 * MB, f"resident memory grew {growth / MB:.1f} MiB"
    # Logged as the learner logs rejections (the first 5, the 10th, 100th, 1000th), and totalled on the status line.
    assert logged(caplog, "rejected request (hello_rate, ") == 5 + 3
    assert logged(caplog, "dropped session (evicted, 1 so far)") == 1
    assert logged(caplog, f"rejected {sum(rejected.values()):,} (hello_rate {rejected['hello_rate']:,})") >= 1
    scalars = exported(tmp_path / "server")
    assert scalars["rejected/hello_rate"] == rejected["hello_rate"]
    assert scalars["clients/dropped/evicted"] == drops["evicted"]
    assert scalars["clients/dropped/first_act_timeout"] == drops["first_act_timeout"]


@pytest.mark.timeout(60)
def test_a_server_full_of_acting_clients_refuses_a_newcomer_and_evicts_none(ctx, servers):
    server = servers.start(serve_config("server.max_clients=2"))
    a, b, c = (Client(server.endpoint, OBS, ACT, ctx=ctx, timeout=10) for _ in range(3))
    raw = raw_client(ctx, server)
    try:
        a.init(ZEROS)
        b.init(ZEROS)
        with pytest.raises(ServerError, match="server is full"):
            c.init(ZEROS)
        assert a.send(1.0, ZEROS) in (0, 1) and b.send(1.0, ZEROS) in (0, 1)  # neither was evicted
        assert server.stats.rejected["server_full"] == 1 and server.stats.session_drops["evicted"] == 0
        # A slot held by a session that has not acted yet is the one a newcomer takes.
        a.disconnect()
        wait_for(lambda: len(server.sessions) == 1, 10, "the BYE to free a slot")
        assert ask(raw, raw_hello()).kind == wire.Kind.HELLO_REPLY
        assert c.init(ZEROS) in (0, 1)
        assert server.stats.session_drops["evicted"] == 1
        reply = ask(raw, raw_act(2, FIRST))
        assert reply.kind == wire.Kind.ERROR and "no session" in reply.text(), reply.text()
        assert b.send(1.0, ZEROS) in (0, 1)
    finally:
        raw.close()
        for client in (a, b, c):
            client.disconnect()


# ---------------------------------------------------------------- 6: pipelined requests


@pytest.mark.timeout(60)
def test_an_act_sent_before_the_previous_reply_is_dropped_and_nothing_of_its_session_is_recorded(ctx, servers):
    server = servers.start(serve_config(), run=False)
    captured = server.sender.link = CapturedChunks()  # what would go to the learner
    serve = lambda: server.serve_once(10)  # noqa: E731
    good, pipe = raw_client(ctx, server), raw_client(ctx, server)
    try:
        for s in (good, pipe):
            assert ask(s, raw_hello(), serve).kind == wire.Kind.HELLO_REPLY
        assert ask(good, raw_act(2, FIRST), serve).kind == wire.Kind.ACTION
        # 40 steps sent at once, none waiting for its action: 8 chunks of unroll_length 5 if they were taken.
        frames = [raw_act(2, FIRST)] + [raw_act(3 + i, 0, reward=100.0) for i in range(40)]
        for f in frames:
            pipe.send(f)
        good.send(raw_act(3, 0, reward=1.0))
        wait_for(lambda: (serve(), good.poll(0))[1], 10, "the good client's reply")
        assert wire.decode(good.recv()).kind == wire.Kind.ACTION
        replies = []
        while len(replies) < len(frames) - 1:  # every request but the dropped one is answered
            wait_for(lambda: (serve(), pipe.poll(0))[1], 10, lambda: f"reply {len(replies) + 1}")
            replies.append(wire.decode(pipe.recv()))
        texts = [r.text() for r in replies if r.kind == wire.Kind.ERROR]
        assert sum(t.startswith("pipelined") for t in texts) == 1, texts
        assert server.stats.rejected["pipelined"] == 1 and server.stats.session_drops["pipelined"] == 1
        assert len(server.sessions) == 1 and server.stats.steps <= 2  # the good step, and at most one before the catch
        assert captured.frames == []
        assert ask(good, raw_act(4, 0, reward=1.0), serve).kind == wire.Kind.ACTION  # the other client goes on
    finally:
        good.close()
        pipe.close()


@pytest.mark.timeout(90)
def test_a_client_that_never_reads_trains_nothing_and_the_learner_goes_on(ctx, endpoint, make_learner, servers, tmp_path, caplog):
    cfg = serve_config()
    learner, _ = make_learner(cfg)
    server = servers.start(cfg, learner=endpoint, logdir=tmp_path / "server")
    wait_for(lambda: server.link is not None and server.link.push is not None, 30, "the server to join the learner")
    proc = psutil.Process()
    rounds, acts = 50, 200
    with caplog.at_level(logging.WARNING, logger="zrl.server"):
        with playing(ctx, server, 2) as players:
            wait_for(lambda: learner.updates >= 3, 60, "training to start")
            rss_before, updates_before = live_rss(proc), learner.updates
            for i in range(rounds):  # each round a new session that sends an episode's worth without reading
                with contextlib.closing(raw_client(ctx, server)) as s:
                    for f in [raw_hello(name="pipe"), raw_act(2, FIRST)] + [raw_act(3 + k, 0, reward=100.0) for k in range(acts)]:
                        s.send(f)
                    wait_for(lambda: server.stats.rejected["pipelined"] >= i + 1, 20, "the pipelined ACTs to be dropped")
            wait_for(lambda: learner.updates >= updates_before + 5, 30, "training to go on")
            growth = live_rss(proc) - rss_before
        servers.stop(server)
    honest_steps = sum(p.steps for p in players)
    assert 0 < learner.env_steps <= honest_steps, (learner.env_steps, honest_steps)  # none of the pipelined steps
    assert learner.rejected == {}, dict(learner.rejected)
    assert server.stats.rejected["pipelined"] == rounds and server.stats.session_drops["pipelined"] == rounds
    assert growth < 50 * MB, f"resident memory grew {growth / MB:.1f} MiB"
    assert logged(caplog, "rejected request (pipelined, ") == 5 + 1  # the first 5 and the 10th
    assert exported(tmp_path / "server")["rejected/pipelined"] == rounds


# ---------------------------------------------------------------- 7: rejections, visible


def test_a_tally_logs_the_first_five_then_each_power_of_ten_then_every_ten_thousandth(caplog):
    tally = Tally("rejected request")
    with caplog.at_level(logging.WARNING, logger="zrl.server"):
        for _ in range(20_000):
            tally.note("too_short", "x")
        tally.note("bye", "y")
    counts = [int(r.getMessage().split(", ")[1].split()[0]) for r in caplog.records]
    assert counts == [1, 2, 3, 4, 5, 10, 100, 1000, 10_000, 20_000, 1]
    assert tally == {"too_short": 20_000, "bye": 1}


@pytest.mark.timeout(60)
def test_rejections_are_logged_exported_and_totalled_on_the_status_line(ctx, servers, tmp_path, caplog):
    server = servers.start(serve_config(), logdir=tmp_path / "server")
    s = raw_client(ctx, server)
    with caplog.at_level(logging.INFO, logger="zrl.server"):
        try:
            for _ in range(12):
                assert ask(s, b"garbage").kind == wire.Kind.ERROR
        finally:
            s.close()
        servers.stop(server)  # the status line and scalars written as the server stops
    assert dict(server.stats.rejected) == {"too_short": 12}
    assert logged(caplog, "rejected request (too_short, ") == 6
    assert logged(caplog, "rejected 12 (too_short 12)") >= 1
    assert exported(tmp_path / "server")["rejected/too_short"] == 12


# ---------------------------------------------------------------- 13c: a checkpoint's version


@pytest.mark.timeout(60)
def test_the_policy_version_served_is_the_checkpoints_update_count(tmp_path, ctx, servers, caplog):
    cfg = serve_config()
    plain = servers.start(cfg, run=False)
    obs, act = plain.obs_spec.to_json(), plain.action_spec.to_json()
    checkpoint.save(tmp_path / "checkpoints", 393, {
        "model_hash": cfg.model_hash(obs, act), "model_shaping": cfg.model_shaping(obs, act), "model": plain.model.state_dict(),
        "optimizer": {}, "counters": {"updates": 393, "env_steps": 3930, "episodes": 1}, "config": cfg.to_dict()}, keep=1)
    with caplog.at_level(logging.INFO, logger="zrl.server"):
        served = servers.start(cfg, checkpoint_path=str(tmp_path))
        s = raw_client(ctx, served)
        try:
            hello = ask(s, raw_hello())
            assert hello.policy_version == 393 and hello.json()["policy_version"] == 393
            assert ask(s, raw_act(2, FIRST)).policy_version == 393
        finally:
            s.close()
        servers.stop(served)
    assert served.policy_version == 393
    assert logged(caplog, "(update 393, env step 3,930): policy version 393") == 1
    assert logged(caplog, "policy version 393 (no learner") == 1  # the serving line
    assert logged(caplog, "clients, 0 steps/s, mean batch 1.0, policy version 393") >= 1  # the status line
