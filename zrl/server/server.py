"""The agent server: simulators that are not Gymnasium envs train through zrl.

A simulator embeds a client (zrl.client.Client, or libzrl_client in C++),
sends its observation and reward, and gets the next action back
(docs/PROTOCOL.md, "Agent server"). One ROUTER socket serves every client.
Each loop iteration drains the requests that are already queued (up to
`server.max_batch`) and answers all those that need an action with one
batched forward pass; when a single request is pending it is answered at
once, so one client pays no batching delay (SEED RL's central inference,
without its latency floor).

To the learner the server is an actor (role "server", one env per client):
it keeps a recorder per client session (the algorithm's, so the trajectories
are exactly what its actors would send), pushes chunks tagged with the policy
version and behaviour log-probabilities, and applies new weights from SUB
between batches. A client that vanishes costs only its partial trajectory;
sessions silent for `server.client_timeout_s` are dropped, so memory does
not grow with clients that come and go.

Strangers cannot crowd out clients that act (zrl.server.sessions: new
sessions are rate-limited, a session that never acts is dropped or evicted),
and a session has one request outstanding: an ACT that comes before the
reply to its previous one is dropped and ends the session, so a step the
client never waited for never becomes training data. Everything refused is
counted by reason, logged, and exported to TensorBoard (zrl.server.report).

Without a learner (`--learner` omitted) the server only serves a policy:
random initial weights, or a checkpoint's (`--checkpoint`).
"""
from __future__ import annotations

import collections
import gc
import logging
import threading
import time
from pathlib import Path

import numpy as np
import torch
import zmq

from zrl import algorithms, checkpoint, spaces, transport, wire
from zrl.actors.link import HelloError, HelloProbe, LearnerFinished, LearnerLink, hello_meta
from zrl.actors.sender import NoLearner, Sender
from zrl.algorithms.base import Recorder
from zrl.config import Config, ConfigError
from zrl.envs import Step
from zrl.envs.specs import config_specs
from zrl.server.fast_path import FastPath, TwinPolicy, Unsupported
from zrl.server.report import StatusReport
from zrl.server.sessions import Session, SessionRefused, Sessions
from zrl.server.stats import ServerStats

log = logging.getLogger("zrl.server")

FIRST, LAST, TRUNCATED = 1, 2, 4
# Learners the server can feed: its clients act at their own pace, so it cannot hold them
# to one policy version (PPO), and it computes no gradients (A3C).
SERVABLE_SOURCES = ("stream", "replay")
REQUEST_KINDS = frozenset({int(wire.Kind.HELLO), int(wire.Kind.ACT), int(wire.Kind.STATS), int(wire.Kind.BYE)})
NO_SESSION = ("no session: say hello first (the server may have restarted, or dropped this session: silent for "
              "server.client_timeout_s, no ACT within server.first_act_timeout_s of its hello, or evicted for a newcomer before its first ACT)")
# What a request in the batch is answered when its session was closed before the answer, by why.
CLOSED = {"pipelined": "pipelined: another ACT came before the reply to this one; one request at a time. "
                       "The session is closed: say hello again and start a new episode"}


class RequestError(Exception):
    """A request answered with an ERROR (the text goes back to the client)."""


def resolve_specs(config: Config) -> tuple[spaces.Spec, spaces.Spec]:
    """The specs clients must use: the run's (`zrl.envs.specs.config_specs`, the learner's too),
    with an observation dtype clients can send."""
    obs, act = config_specs(config)
    if isinstance(obs, spaces.BoxSpec) and obs.dtype not in spaces.CLIENT_OBS_DTYPES:
        raise ValueError(f"server.observation_space: clients send float32 or uint8 observations, not {obs.dtype}")
    return obs, act


def check_servable(config: Config) -> None:
    """ConfigError unless the agent server can feed the config's learner (SERVABLE_SOURCES)."""
    if config.algo.batch_source not in SERVABLE_SOURCES:
        raise ConfigError(f"algo.name: {config.algo.name} trains from actors of its own (its batch source is "
                          f"{config.algo.batch_source!r}); the agent server feeds {' or '.join(SERVABLE_SOURCES)} "
                          f"learners: impala, appo, apex_dqn or sac")


class AgentServer:
    """Serves clients on `bind` (default server.bind) and feeds the learner at `learner`
    (none: inference only); writes its counters as TensorBoard scalars under `logdir` (if given)."""

    def __init__(
        self,
        config: Config,
        bind: str | None = None,
        learner: str | None = None,
        *,
        ctx: zmq.Context | None = None,
        stop: threading.Event | None = None,
        console: bool = True,
        checkpoint_path: str | None = None,
        seed: int | None = None,
        logdir: str | Path | None = None,
    ):
        if learner is not None:
            check_servable(config)
        self.config = config
        self.sc = config.server
        self.learner_endpoint = learner
        self.console = console
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.stop = stop or threading.Event()
        self.obs_spec, self.action_spec = resolve_specs(config)
        self.algo = algorithms.get(config.algo.name)(config, self.obs_spec, self.action_spec)
        self.model = self.algo.build_model()
        self.model.eval()
        self.policy_version = 0  # a checkpoint's update count, then the learner's version
        if checkpoint_path is not None:
            self._load_checkpoint(checkpoint_path)
        seed = config.run.seed if seed is None else seed
        torch.manual_seed(seed)
        self.policy = self.algo.make_policy(self.model, actor_index=0, num_actors=1, seed=seed)
        # Chunks go straight to the learner's PUSH (the backlog holds those it refuses), or
        # nowhere without a learner.
        self.sender = Sender(self.sc.index, NoLearner(self.sc.index))
        self.stats = ServerStats()
        self.sessions = Sessions(self.sc, self.stats.session_drops, time.monotonic(), on_drop=self._on_drop)
        self.backlog: collections.deque = collections.deque()
        self._done_returns, self._done_lengths = [], []  # finished client episodes, sent to the learner as stats
        self.link = None
        self._stuck_since: float | None = None  # since when the backlog has not moved
        self._probe: HelloProbe | None = None  # a liveness check of the learner in flight
        self.curve = transport.Curve.from_config(config.security)
        self._auth = None
        self._bind_router(bind or self.sc.bind)
        self._obs_shape, self._obs_dtype = tuple(self.obs_spec.shape), np.dtype(self.obs_spec.dtype)
        self._act_discrete = isinstance(self.action_spec, spaces.DiscreteSpec)
        self.report = StatusReport(self.stats, logdir, self._say)
        self.fast, self.request_loop = self._make_fast_path(seed)

    def _make_fast_path(self, seed: int) -> tuple[FastPath | None, str]:
        """The C++ loop for routine ACTs (zrl.server.fast_path), and how requests are served."""
        if not self.sc.native_loop:
            return None, "Python (server.native_loop is false)"
        try:
            fast = FastPath.create(self.router, self.model, self._new_recorder(), self.obs_spec, self.action_spec,
                                   max_bytes=self.config.learner.max_message_bytes, seed=seed)
        except Unsupported as e:
            return None, f"Python ({e})"
        fast.set_weights(self.policy_version)
        self.policy = TwinPolicy(fast)  # (the Python path's forward passes too, without torch)
        return fast, "C++ for routine ACTs"

    def _on_drop(self, session: Session) -> None:
        if self.fast is not None:
            self.fast.forget(session)

    def _bind_router(self, bind: str) -> None:
        """The clients' ROUTER, bound at `bind` (a CURVE server for security.client_keys)."""
        # A client's queues stay short both ways; MANDATORY makes a reply to a client that
        # does not read raise, so it is counted.
        self.router = transport.socket(self.ctx, zmq.ROUTER, hwm=self.sc.client_hwm)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.MAXMSGSIZE, self.config.learner.max_message_bytes)
        try:
            if self.curve is not None:
                # Simulator clients only (security.client_keys): an actor's key is not enough here.
                self._auth = self.curve.start_authenticator(self.ctx, transport.CLIENT_PEERS)
                self.curve.server(self.router, transport.CLIENT_PEERS)
            self.endpoint = transport.bind(self.router, bind)
        except (OSError, ValueError):
            self.router.close(linger=0)
            if self._auth is not None:
                self._auth.release()
            raise

    def _say(self, text: str) -> None:
        if self.console:
            print(f"[server] {text}", flush=True)
        log.info(text)

    def _load_checkpoint(self, path: str) -> None:
        p, state = checkpoint.find(Path(path))  # (a file, or a logdir's newest)
        obs, act = self.obs_spec.to_json(), self.action_spec.to_json()
        checkpoint.check_compatible(p, state, self.config.model_hash(obs, act), self.config.model_shaping(obs, act))
        self.model.load_state_dict(state["model"])
        c = state["counters"]
        # The learner numbers its weights by updates: these are the weights of version `updates`.
        self.policy_version = int(c["updates"])
        self._say(f"weights from {p} (update {self.policy_version:,}, env step {int(c['env_steps']):,}): policy version {self.policy_version}"
                  + ("; a learner's weights replace them once it answers" if self.learner_endpoint else ""))

    # ------------------------------------------------------------------ learner side

    def _connect_learner(self) -> bool:
        meta = hello_meta(self.config, "server", self.sc.index, self.obs_spec, self.action_spec, 1)
        self.link = LearnerLink(
            # The server pushes chunks of many clients in bursts: a deeper high-water mark than an actor's.
            self.ctx, self.learner_endpoint, meta, self.model, timeout_s=self.config.actor.learner_timeout_s,
            send_hwm=max(self.config.actor.send_hwm, self.sc.backlog), stop=self.stop, say=self._say, on_weights=self._on_weights,
            curve=self.curve, keepalive_s=self.config.learner.actor_timeout_s / 2,
        )
        self.sender.link = self.sender.id_from = self.link  # (frames carry the id the learner hands out)
        return self.link.connect()

    def _on_weights(self, version: int) -> None:
        self.policy_version = version
        if self.fast is not None:
            self.fast.set_weights(version)
        for s in self.sessions.values():
            if s.recorder is not None:
                s.recorder.policy_version = version

    def _push(self, frames: list) -> None:
        """Queues trajectory messages for the learner; never blocks the request loop."""
        if self.link is None:
            return
        for f in frames:
            if len(self.backlog) >= self.sc.backlog:
                self.backlog.popleft()
                self.stats.dropped_messages += 1
            self.backlog.append(f)
        self._flush_backlog()

    def _flush_backlog(self) -> None:
        sent = False
        while self.backlog and self.link.try_send(self.backlog[0]):
            self.backlog.popleft()
            sent = True
        if sent or not self.backlog:
            self._stuck_since = None

    def _watch_learner(self, now: float) -> None:
        """When nothing has gone to the learner for actor.learner_timeout_s, asks it (on a
        thread: the request loop goes on) whether it is busy, restarted on new endpoints
        (then follows it there), or gone (then asks again a timeout later); meanwhile
        the backlog keeps dropping its oldest chunks."""
        if self._probe is not None:
            if not self._probe.done.is_set():
                return
            reply, self._probe = self._probe.reply, None
            self._stuck_since = now if self.backlog else None
            if reply is None:
                self._say(f"learner at {self.learner_endpoint} not answering; dropping the oldest chunks until it does")
            elif not self.link.follow(reply):
                self._say("learner is busy (back-pressure); dropping the oldest chunks")
            return
        if not self.backlog:
            return
        if self._stuck_since is None:
            self._stuck_since = now
        elif now - self._stuck_since >= self.link.timeout_s:
            self._probe = HelloProbe(self.link)

    # ------------------------------------------------------------------ requests

    def _reply(self, identity: bytes, frame) -> None:
        try:
            self.router.send_multipart([identity, frame], zmq.NOBLOCK)
        except zmq.Again:
            self.stats.rejected.note("reply_unread", "a client's queue is full (server.client_hwm): it does not read its replies")
        except zmq.ZMQError:
            pass  # the client is gone

    def _error(self, identity: bytes, seq: int, reason: str, text: str, **log_as) -> None:
        """Counts (and logs, rate-limited) a refused request and answers it with an ERROR."""
        self.stats.rejected.note(reason, f"request seq {seq}: {text}", **log_as)
        self._reply(identity, wire.encode(wire.Kind.ERROR, meta=text, seq=seq))

    def _hello(self, identity: bytes, msg: wire.Message, now: float) -> None:
        try:
            hello, obs, act = wire.read_hello(msg, "server")
        except wire.HelloInvalid as e:
            raise RequestError(str(e)) from None
        if hello.get("role") != "client":
            raise RequestError(f"role {wire.show(hello.get('role'))}: this is an agent server, expected role 'client'")
        if obs != self.obs_spec:
            raise RequestError(f"observation spec {wire.show(obs.to_json(), 300)} differs from the server's {self.obs_spec.to_json()}")
        if act != self.action_spec:
            raise RequestError(f"action spec {wire.show(act.to_json(), 300)} differs from the server's {self.action_spec.to_json()}")
        try:
            session = self.sessions.open(identity, now)
        except SessionRefused as e:
            self._error(identity, msg.seq, e.reason, str(e))
            return
        self.stats.sessions_opened += 1
        reply = {"ok": True, "client_id": session.client_id, "policy_version": self.policy_version}
        self._reply(identity, wire.encode(wire.Kind.HELLO_REPLY, meta=reply, seq=msg.seq, policy_version=self.policy_version))

    def _new_recorder(self) -> Recorder:
        rec = self.algo.make_recorder(self.model, num_envs=1, sender=self.sender)
        rec.policy_version = self.policy_version
        return rec

    def _check_act(self, msg: wire.Message) -> tuple[np.ndarray | None, float, int]:
        names = [i.name for i in msg.infos]
        infos = {i.name: i for i in msg.infos}
        if "flags" not in infos or "reward" not in infos:
            raise wire.WireError(wire.Reason.MISSING_FIELD, "ACT needs reward and flags")
        extra = set(names) - {"obs", "reward", "flags"}
        if extra:
            raise wire.WireError(wire.Reason.UNKNOWN_FIELD, f"unexpected arrays {sorted(extra)}")
        fi, ri = infos["flags"], infos["reward"]
        if fi.dtype != np.uint8 or fi.shape != () or ri.dtype != np.float32 or ri.shape != ():
            raise wire.WireError(wire.Reason.BAD_SHAPE, "reward must be float32 () and flags uint8 ()")
        a = msg.arrays
        flags = int(a["flags"])
        reward = float(a["reward"])
        if flags & ~(FIRST | LAST | TRUNCATED) or (flags & FIRST and flags & LAST) or (flags & TRUNCATED and not flags & LAST):
            raise wire.WireError(wire.Reason.BAD_VALUE, f"bad flags {flags}")
        needs_obs = not (flags & LAST) or bool(flags & TRUNCATED)
        obs = None
        if "obs" in infos:
            oi = infos["obs"]
            if oi.dtype != self._obs_dtype or oi.shape != self._obs_shape:
                raise wire.WireError(wire.Reason.BAD_SHAPE, f"obs is {oi.dtype}{list(oi.shape)}, expected {self._obs_dtype}{list(self._obs_shape)}")
            obs = a["obs"]
        elif needs_obs:
            raise wire.WireError(wire.Reason.MISSING_FIELD, "obs is required here")
        wire.check_finite(msg)  # (as the learner's gate: a NaN or inf would reach the policy's logits and the learner's batch)
        return obs, reward, flags

    def _act(self, session: Session, msg: wire.Message, batch: list) -> None:
        """Advances the session's episode; queues (session, seq, obs) when an action is needed."""
        obs, reward, flags = self._check_act(msg)
        if flags & FIRST:
            self._begin_episode(session, obs)
            self._await_action(session, msg.seq, obs, batch)
            return
        if not session.in_episode:
            raise RequestError("send()/reset() before init(): start an episode with init(obs) first")
        session.episode_return += reward
        session.episode_length += 1
        session.steps += 1
        self.stats.steps += 1
        if flags & LAST:
            self._end_episode(session, reward, obs, truncated=bool(flags & TRUNCATED))
            self._reply(session.identity, wire.encode(wire.Kind.ACTION, seq=msg.seq, policy_version=self.policy_version))
            return
        self._push(session.recorder.observe(Step(obs[None], np.array([reward], np.float32), np.array([False]), np.array([False]), {})))
        self._await_action(session, msg.seq, obs, batch)

    def _begin_episode(self, session: Session, obs: np.ndarray) -> None:
        if session.recorder is None:  # its first ACT: made now, so that sessions that never act cost no buffer
            session.recorder = self._new_recorder()
            self.sessions.acted(session)
        elif session.in_episode:
            # A new episode inside one: the unfinished chunk is dropped.
            session.recorder = self._new_recorder()
            session.begun = False
        elif session.pending_end is not None:
            r, term, trunc, final = session.pending_end
            self._push(session.recorder.observe(Step(obs[None], np.array([r], np.float32), np.array([term]), np.array([trunc]), {0: final} if trunc else {})))
            session.pending_end = None
        if not session.begun:
            session.recorder.begin(obs[None])
            session.begun = True
        session.in_episode = True
        session.episode_return = 0.0
        session.episode_length = 0
        session.state = self.policy.initial_state(1)  # a new episode starts from a fresh core state

    def _end_episode(self, session: Session, reward: float, obs: np.ndarray | None, truncated: bool) -> None:
        """Its last step is recorded when the next episode begins (the recorder's next observation)."""
        if abs(session.episode_return) <= self.config.learner.max_abs_return:
            self._done_returns.append(session.episode_return)
            self._done_lengths.append(float(session.episode_length))
        else:  # (the learner would refuse the whole stats message, every other client's returns with it)
            self.stats.rejected.note("implausible_return", f"client {session.client_id}: episode return {session.episode_return:g} "
                                     f"beyond +-{self.config.learner.max_abs_return:g} (learner.max_abs_return); not reported")
        final = np.array(obs, copy=True) if truncated else None
        session.pending_end = (reward, not truncated, truncated, final)
        session.in_episode = False

    @staticmethod
    def _await_action(session: Session, seq: int, obs: np.ndarray, batch: list) -> None:
        session.awaiting = seq
        batch.append((session, seq, obs))

    def _pipelined(self, session: Session, seq: int) -> None:
        """An ACT sent before the reply to the session's previous one: the client did not
        wait for the action it reports on, so neither this step nor the rest of its episode
        can be trusted. Dropped unanswered, and the session ends; the request in the batch
        is answered with an ERROR that says why."""
        self.stats.rejected.note("pipelined", f"client {session.client_id}: ACT seq {seq} before the reply to seq {session.awaiting}")
        self.sessions.drop(session.identity, "pipelined")

    def _answer(self, batch: list) -> None:
        """Answers the batch's requests: with one forward pass for the sessions still open,
        with an ERROR for those closed since they asked (unless the client left or replaced it)."""
        live = []
        for item in batch:
            session, seq, _ = item
            if session.closed is None:
                live.append(item)
            elif session.closed not in ("bye", "replaced"):
                self._reply(session.identity, wire.encode(wire.Kind.ERROR, seq=seq, meta=CLOSED.get(
                    session.closed, f"{session.closed}: the session was closed; say hello again and start a new episode")))
        if live:
            self._forward(live)

    def _forward(self, batch: list) -> None:
        """One forward pass for every request that needs an action."""
        obs = np.stack([o for _, _, o in batch])
        state = None
        if batch[0][0].state is not None:  # recurrent: the clients' core states, stacked like their observations
            state = tuple(np.concatenate(parts) for parts in zip(*(s.state for s, _, _ in batch)))
        try:
            actions, extras = self.policy.act(obs, state)
        except Exception as e:  # noqa: BLE001 - one client's request must not stop the others'
            # E.g. finite but huge observations whose logits overflow to NaN (the sampler
            # raises ValueError). Answer each request alone, to refuse only the culprits.
            if len(batch) > 1:
                for item in batch:
                    self._forward([item])
            else:
                session, seq, _ = batch[0]
                reason = "bad_value" if isinstance(e, ValueError) else "internal_error"
                self._refuse(session.identity, seq, reason, f"the policy cannot act on this observation: {e}")
            return
        new_state = extras.pop("state", None)
        self.stats.batches += 1
        self.stats.batch_sizes += len(batch)
        for i, (session, seq, _) in enumerate(batch):
            if new_state is not None:
                session.state = tuple(x[i : i + 1] for x in new_state)
            session.recorder.record(actions[i : i + 1], {k: v[i : i + 1] for k, v in extras.items()})
            session.awaiting = None
            a = actions[i]
            arr = np.asarray(a, np.int64) if self._act_discrete else np.asarray(a, np.float32)
            self._reply(session.identity, wire.encode(wire.Kind.ACTION, {"action": arr}, seq=seq, policy_version=self.policy_version))
            if self.fast is not None:
                self.fast.arm(session)  # its next routine ACT is served in C++

    def _forward_stats(self, msg: wire.Message) -> None:
        arrays = {}
        for info in msg.infos:
            if info.dtype != np.float64 or len(info.shape) != 1 or info.shape[0] > 1024:
                raise wire.WireError(wire.Reason.BAD_SHAPE, f"stats array {info.name!r} must be float64 [n <= 1024]")
        for name, a in msg.arrays.items():
            if name in ("episode_return", "episode_length", "eval_return", "eval_length"):
                raise wire.WireError(wire.Reason.BAD_VALUE, f"{name!r} is reserved")
            arrays[name] = np.array(a)
        if arrays and self.link is not None:
            self._push([self.sender.encode(wire.Kind.STATS, arrays, self.policy_version)])

    def _handle(self, identity: bytes, frame, batch: list, now: float) -> None:
        self.stats.requests += 1
        try:
            msg = wire.decode(frame, max_bytes=self.config.learner.max_message_bytes, allowed_kinds=REQUEST_KINDS)
        except wire.WireError as e:
            self._error(identity, 0, e.reason.value, f"bad request: {e}")
            return
        except Exception as e:  # noqa: BLE001 - the backstop, as below
            self._refuse(identity, 0, "internal_error", f"cannot decode the request: {e!r}")
            return
        try:
            if msg.kind == wire.Kind.HELLO:
                self._hello(identity, msg, now)
                return
            session = self.sessions.get(identity)
            if session is None:
                if msg.kind in (wire.Kind.BYE, wire.Kind.STATS):
                    return
                raise RequestError(NO_SESSION)
            if self.fast is not None:
                self.fast.reclaim(session)  # (the C++ loop may hold its counters)
            session.last_seen = now
            if msg.kind == wire.Kind.ACT:
                # Checked before the ACT touches the episode: its reward and observation
                # must not reach the recorder.
                if session.awaiting is not None:
                    self._pipelined(session, msg.seq)
                else:
                    self._act(session, msg, batch)
            elif msg.kind == wire.Kind.STATS:
                self._forward_stats(msg)
            elif msg.kind == wire.Kind.BYE:
                self.sessions.drop(identity, "bye")
        except wire.WireError as e:
            self._error(identity, msg.seq, e.reason.value, f"bad request: {e}")
        except RequestError as e:
            self._error(identity, msg.seq, "refused", str(e))
        except Exception as e:  # noqa: BLE001 - a bad request must never stop the server
            self._refuse(identity, msg.seq, "internal_error", f"cannot handle {msg.kind.name}: {e!r}")

    def _refuse(self, identity: bytes, seq: int, reason: str, text: str) -> None:
        """The backstop for a request that raised where no check expected it (called in the
        except block): counted, logged (an internal_error with its traceback: a bug to fix),
        answered with an ERROR, and its session dropped, since its state may be half updated."""
        self.sessions.drop(identity, reason)
        if reason == "internal_error":
            self._error(identity, seq, reason, text, level=logging.ERROR, exc_info=True)
        else:
            self._error(identity, seq, reason, text)

    # ------------------------------------------------------------------ loop

    def run(self, max_seconds: float | None = None) -> ServerStats:
        """Serves until stopped (or the learner shuts down); returns the counters."""

        try:
            if self.learner_endpoint is not None and not self._connect_learner():
                return self.stats
            if self.link is not None:
                self._on_weights(self.link.policy_version)  # (the C++ loop stamps its replies with it too)
            # The objects made so far (torch's import is most of them) leave the collector's
            # view: a full collection over them stalls every client for tens of milliseconds.
            gc.collect()
            gc.freeze()
            self._say(f"serving {self.obs_spec.to_json()} -> {self.action_spec.to_json()} on {self.endpoint}, policy version {self.policy_version}"
                      + (f", learner {self.learner_endpoint}" if self.link else " (no learner: inference only)")
                      + f"; requests served in {self.request_loop}")
            return self._loop(max_seconds)
        except LearnerFinished as e:
            self._say(f"learner finished ({e}); exiting")
            return self.stats
        except HelloError:
            raise
        finally:
            self.close()

    def serve_once(self, timeout_ms: int) -> int:
        """One iteration: wait up to timeout_ms for requests, drain what is queued, answer; returns requests handled."""
        if self.link is not None:
            self.link.poll_weights()
            if self.backlog:
                self._flush_backlog()
            if self.backlog or self._probe is not None:
                self._watch_learner(time.monotonic())
        if self.fast is not None:
            return self._serve_native(timeout_ms)
        if not self.router.poll(timeout_ms, zmq.POLLIN):
            return 0
        requests = []
        # Drain what is already queued, never wait for more. Bounded by requests, not by
        # actions: requests that need none (refused ones, a flood) must not delay the answers.
        while len(requests) < self.sc.max_batch:
            try:
                parts = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            requests.append([parts[0].bytes, *parts[1:]])
        self._handle_all(requests)
        return len(requests)

    def _serve_native(self, timeout_ms: int) -> int:
        """The C++ loop serves routine ACTs for up to server.native_budget_ms; what it hands back is served here."""
        handback, completed, answered, batches, unread = self.fast.serve(timeout_ms, self.sc.max_batch, self.sc.native_budget_ms)
        st = self.stats
        st.requests += answered
        st.steps += answered
        st.batches += batches
        st.batch_sizes += answered
        for _ in range(unread):
            st.rejected.note("reply_unread", "a client's queue is full (server.client_hwm): it does not read its replies")
        try:
            for client_id, action, logp in completed:
                self._complete(client_id, action, logp)
        finally:  # (those requests are off the socket: they are answered whatever happened above)
            self._handle_all(handback)
        return answered + len(handback)

    def _complete(self, client_id: int, action, logp: float) -> None:
        """A chunk the C++ loop filled: sent, and its session handed back to the loop. A failure
        is a bug: it is counted and logged, and ends that session only, as on the Python path."""
        session = self.fast.held.get(client_id)
        try:
            done = self.fast.complete(client_id, action, logp)
            if done is not None:
                self._push(done[1])
                self.fast.arm(session)
        except Exception as e:  # noqa: BLE001 - one session's chunk must not stop the server
            if session is not None:
                self.sessions.drop(session.identity, "internal_error")
                self.stats.rejected.note("internal_error", f"client {client_id}: cannot send its chunk: {e!r}",
                                         level=logging.ERROR, exc_info=True)

    def _handle_all(self, requests: list) -> None:
        """Handles requests ([identity, frame] each) in order, then answers those that need an action."""
        now = time.monotonic()
        batch: list = []
        for parts in requests:
            if len(parts) != 2:
                # (The C++ loop keeps 3 parts of a longer message.)
                self.stats.rejected.note("bad_header", f"a request of {len(parts) - 1}{'+' if len(parts) > 2 else ''} frames, expected 1 after the identity")
                continue
            self._handle(parts[0], parts[1], batch, now)
        if batch:
            self._answer(batch)

    def _loop(self, max_seconds: float | None) -> ServerStats:
        t_end = None if max_seconds is None else time.monotonic() + max_seconds
        last_expire = last_log = last_stats = time.monotonic()
        expire_every = min(1.0, self.sc.client_timeout_s / 4, self.sc.first_act_timeout_s / 4)
        try:
            while not self.stop.is_set():
                if t_end is not None and time.monotonic() >= t_end:
                    break
                self.serve_once(2 if self.backlog else 20)
                now = time.monotonic()
                if now - last_expire >= expire_every:
                    if self.fast is not None:
                        self.fast.refresh_last_seen(self.sessions.values())
                    self.sessions.expire(now)
                    last_expire = now
                if self._done_returns and now - last_stats >= self.config.actor.stats_interval_s:
                    self._send_episode_stats()
                    last_stats = now
                if now - last_log >= self.config.learner.log_interval_s * 5:
                    self.report.write(len(self.sessions), self.policy_version)
                    last_log = now
        finally:
            self.report.write(len(self.sessions), self.policy_version)  # the counters as the server stops
        return self.stats

    def _send_episode_stats(self) -> None:
        arrays = {"episode_return": np.array(self._done_returns), "episode_length": np.array(self._done_lengths)}
        self._done_returns, self._done_lengths = [], []
        if self.link is not None:
            self._push([self.sender.encode(wire.Kind.STATS, arrays, self.policy_version)])

    def close(self) -> None:
        if self._probe is not None:  # its socket must be closed before the context ends
            self._probe.join(self.link.timeout_s + 5 if self.link is not None else 5)
            self._probe = None
        if self.link is not None:
            self.link.finish()
            self.link = None
        if not self.router.closed:
            self.router.close(linger=0)
        self.report.close()
        if self._auth is not None:
            self._auth.release()
            self._auth = None
        if self._own_ctx and not self.ctx.closed:
            self.ctx.term()
