"""The actor process: step K envs with a CPU copy of the policy, stream chunks.

An actor knows one address, the learner's control endpoint. It says hello
there (who it is, its specs, its model hash) and the reply tells it where to
PUSH trajectories, where to SUB for weights, and carries the current
weights. Then it loops: apply the newest weights if any arrived (never
waiting for them), act on all K envs in one batched forward pass, step, let
the algorithm cut messages, send them.

Sends wait on ZeroMQ's high-water mark (back-pressure from a busy learner).
If a send cannot go through for `actor.learner_timeout_s`, the actor asks
the learner's control endpoint whether it is alive: a busy learner answers
and the actor keeps waiting; a lost one does not, and the actor says so and
keeps saying hello, with a deadline per attempt, until one comes back, then
reconnects to whatever endpoints that learner reports. If no weights arrive
for `actor.learner_timeout_s` while sends go through, it asks too (without
waiting for the answer): a learner restarted on the same endpoints (an ipc
path, fixed ports) is a new instance, which takes no data before a hello.
"""
from __future__ import annotations

import logging
import os
import socket as pysocket
import threading
import time
from typing import Any

import numpy as np
import torch
import zmq

from zrl import spaces, transport, wire
from zrl.actors.streams import ReadyStreams
from zrl.config import Config, ConfigError
from zrl.envs import make_vector_env
from zrl.learner import algorithms
from zrl.learner.algorithms.base import ActorAlgo, NullRecorder, Sender, resolve_precision
from zrl.models import flatten_parameters
from zrl.models.cnn import int8_conv_supported, use_int8_first_conv, use_int8_torso

log = logging.getLogger("zrl.actor")


def use_int8(setting: bool | str, model: torch.nn.Module, torso: bool = False) -> bool:
    """actor.int8_first_conv (or with torso=True, actor.int8_torso) applied to `model`: whether its
    CNN now acts with an int8 first conv (an int8 torso). Raises ValueError for true on a CPU (or
    PyTorch) without native int8 convolutions."""
    key = "actor.int8_torso" if torso else "actor.int8_first_conv"
    if setting is False:
        return False
    if setting is True and not int8_conv_supported():
        raise ValueError(f"{key}: true, but this is not an x86 CPU with AVX2 or newer, or this PyTorch's oneDNN "
                         "int8 convolution failed zrl's probe; set it to auto or false")
    used = use_int8_torso(model) if torso else use_int8_first_conv(model)
    if setting is True and not used:
        what = "no shallow CNN torso" if torso else "no CNN first conv"
        log.warning("%s: true, but the model has %s to run in int8; acting without it", key, what)
    return used


class HelloError(RuntimeError):
    """The learner refused our hello; the message is the learner's reason."""


class LearnerFinished(Exception):
    pass


def hello_meta(config: Config, role: str, index: int, obs_spec: spaces.Spec, action_spec: spaces.Spec, num_envs: int) -> dict[str, Any]:
    return {
        "role": role,
        "index": index,
        "protocol": wire.PROTOCOL_VERSION,
        "algo": config.algo.name,
        "obs_space": obs_spec.to_json(),
        "action_space": action_spec.to_json(),
        "model_hash": config.model_hash(obs_spec.to_json(), action_spec.to_json()),
        "model": config.model_shaping()["model"],  # so a refusal can say what differs
        "num_envs": num_envs,
        "unroll_length": config.actor.unroll_length,
        "host": pysocket.gethostname(),
        "pid": os.getpid(),
    }


def say_hello(ctx: zmq.Context, endpoint: str, meta: dict[str, Any], timeout_s: float, sender_id: int = 0, curve: transport.Curve | None = None,
              stop: threading.Event | None = None) -> wire.Message | None:
    """One hello attempt on a fresh DEALER (the Lazy Pirate pattern): the reply, or None on
    timeout (or once `stop` is set: an actor told to stop does not wait out the timeout).

    Raises HelloError when the learner answers with an error.
    """
    sock = transport.socket(ctx, zmq.DEALER)
    try:
        if curve is not None:
            curve.client(sock)
        sock.connect(endpoint)
        sock.send(wire.encode(wire.Kind.HELLO, meta=meta, sender_id=sender_id))
        deadline = time.monotonic() + timeout_s
        while not sock.poll(min(100, max(0, int((deadline - time.monotonic()) * 1000))), zmq.POLLIN):
            if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                return None
        msg = wire.decode(sock.recv(copy=False), allowed_kinds=frozenset({int(wire.Kind.HELLO_REPLY), int(wire.Kind.ERROR)}))
        if msg.kind == wire.Kind.ERROR:
            raise HelloError(f"learner at {endpoint} refused hello: {msg.text()}")
        return msg
    finally:
        sock.close(linger=0)


class LearnerLink:
    """An actor's (or the agent server's) connection to the learner.

    `connect()` says hello until the learner answers (a fresh DEALER per
    attempt, a deadline per attempt, saying so each time), then opens PUSH to
    the trajectory endpoint and SUB to the weights endpoint it was told, and
    applies the weights in the reply. `send()` waits on back-pressure (or
    returns False at once when asked not to block) and, if the learner stops
    answering entirely, reconnects. `poll_weights()` applies only the newest
    weights that arrived and never blocks. Not thread-safe: one owner thread.
    """

    def __init__(self, ctx: zmq.Context, endpoint: str, meta: dict[str, Any], model: torch.nn.Module, *, sender_id: int,
                 timeout_s: float, send_hwm: int, stop: threading.Event, say, on_weights=None, curve: transport.Curve | None = None):
        self.ctx = ctx
        self.endpoint = endpoint
        self.meta = meta
        self.model = model
        self.sender_id = sender_id
        self.timeout_s = timeout_s
        self.send_hwm = send_hwm
        self.stop = stop
        self._say = say
        self.on_weights = on_weights  # called with the new policy version
        self.curve = curve
        self.endpoints: tuple[str, str] | None = None  # (trajectory, weights) of the learner we are connected to
        self.instance: str | None = None  # that learner's instance (a new one after each start)
        self._weights_at = time.monotonic()  # when weights last came (or we connected)
        self._probe: HelloProbe | None = None  # a check of the learner while no weights come
        self._opened = 0  # how many times _open ran: a probe's reply is stale if the link reopened since
        self._probe_opened = 0
        self.push: zmq.Socket | None = None
        self.pusher: transport.Pusher | None = None  # sends recorders' chunks on `push` (Sender)
        self.sub: zmq.Socket | None = None
        self.policy_version = -1
        self.weights_applied = 0
        self.flat = flatten_parameters(model)
        self.n_params = self.flat.numel()
        self.blocked_s = 0.0  # time spent waiting on back-pressure
        self.dropped = 0  # messages dropped under the "drop" policy

    def connect(self) -> bool:
        """Says hello until the learner answers; False if stopped first. Raises HelloError if refused."""
        attempt = 0
        t0 = time.monotonic()
        while not self.stop.is_set():
            attempt += 1
            reply = say_hello(self.ctx, self.endpoint, self.meta, self.timeout_s, sender_id=self.sender_id, curve=self.curve, stop=self.stop)
            if reply is not None:
                break
            self._say(f"learner at {self.endpoint} not answering (attempt {attempt}, {time.monotonic() - t0:.0f}s); retrying")
        else:
            return False
        self._open(reply)
        self._apply_weights(reply)
        if attempt > 1:
            self._say(f"learner is back; reconnected at policy version {self.policy_version}")
        return True

    def _open(self, reply: wire.Message) -> None:
        """(Re)opens PUSH and SUB to the endpoints a hello reply names."""
        info = reply.json()
        self.close()
        self.endpoints = (info["trajectory_endpoint"], info["weights_endpoint"])
        self.instance = info.get("learner_instance")
        self._weights_at = time.monotonic()
        self._opened += 1
        self.push = transport.socket(self.ctx, zmq.PUSH, hwm=self.send_hwm)
        self.pusher = transport.Pusher(self.push)
        self.sub = transport.socket(self.ctx, zmq.SUB, hwm=2)
        if self.curve is not None:
            self.curve.client(self.push)
            self.curve.client(self.sub)
        self.push.connect(transport.connectable(info["trajectory_endpoint"], self.endpoint))
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(transport.connectable(info["weights_endpoint"], self.endpoint))

    def close(self) -> None:
        for s in (self.push, self.sub):
            if s is not None:
                s.close(linger=0)
        self.push = self.sub = self.pusher = None

    def finish(self) -> None:
        """close(), once a check of the learner in flight is over (its socket must be
        closed before the context ends)."""
        if self._probe is not None:
            self._probe.join(self.timeout_s + 5)
            self._probe = None
        self.close()

    def _apply_weights(self, msg: wire.Message) -> None:
        params = msg.arrays.get("params")
        if params is None or params.dtype != np.float32 or params.shape != (self.n_params,):
            log.warning("ignoring weights of shape %s (model has %d parameters)", None if params is None else params.shape, self.n_params)
            return
        with torch.no_grad():
            # One copy into the parameters' shared buffer (a cast too, for a bf16 actor).
            self.flat.copy_(torch.from_numpy(params))
        self.policy_version = msg.policy_version
        self.weights_applied += 1
        self._weights_at = time.monotonic()
        if self.on_weights is not None:
            self.on_weights(msg.policy_version)

    def poll_weights(self) -> None:
        """Applies only the newest weights that arrived; never blocks. Raises LearnerFinished on SHUTDOWN."""
        newest = None
        # Asked through ZMQ_EVENTS: a non-blocking recv on an empty socket raises zmq.Again,
        # and making that exception cost more than the rest of this call (it runs per batch).
        while self.sub.get(zmq.EVENTS) & zmq.POLLIN:
            try:
                frame = self.sub.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            try:
                msg = wire.decode(frame, allowed_kinds=frozenset({int(wire.Kind.WEIGHTS), int(wire.Kind.SHUTDOWN)}))
            except wire.WireError as e:
                log.warning("dropping bad weights message: %s", e)
                continue
            if msg.kind == wire.Kind.SHUTDOWN:
                raise LearnerFinished(msg.text())
            newest = msg
        if newest is not None:
            if newest.policy_version != self.policy_version:
                self._apply_weights(newest)
            else:
                self._weights_at = time.monotonic()
        elif self._probe is not None or time.monotonic() - self._weights_at >= self.timeout_s:
            self._watch()

    def _watch(self) -> None:
        """No weights for a timeout: asks the learner on a thread (the loop goes on), and
        follows it if it restarted (new endpoints, or a new instance on the same ones)."""
        if self._probe is None:
            self._probe = HelloProbe(self)
            self._probe_opened = self._opened
            return
        if not self._probe.done.is_set():
            return
        reply, self._probe = self._probe.reply, None
        self._weights_at = time.monotonic()  # (asked again a timeout from now, if still none)
        if reply is not None and self._opened == self._probe_opened:  # (else a reply from before a reconnect)
            self.follow(reply)

    def try_send(self, frame) -> bool:
        """Sends without waiting; False if the high-water mark is reached."""
        try:
            self.push.send(frame, zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False

    def send(self, frame, drop: bool = False) -> bool:
        """Sends one frame. Under back-pressure it waits (reconnecting if the learner is
        gone), or with `drop` it drops the frame at once and counts it. True if sent."""
        if self.try_send(frame):
            return True
        if drop:
            self.dropped += 1
            return False
        t0 = time.monotonic()
        try:
            while not self.stop.is_set():
                waited = 0.0
                while waited < self.timeout_s and not self.stop.is_set():
                    if self.push.poll(100, zmq.POLLOUT):
                        break
                    waited += 0.1
                    self.poll_weights()
                else:
                    if self.stop.is_set():
                        return False
                    self.check_alive()
                if self.try_send(frame):
                    return True
            return False
        finally:
            self.blocked_s += time.monotonic() - t0

    def check_alive(self) -> None:
        """After a whole timeout without progress: is the learner busy, restarted, or gone?

        A busy learner answers with the endpoints we already use: keep waiting.
        A restarted one (e.g. resumed after a crash) may have bound new ports:
        reconnect to those. No answer: say so and keep saying hello until one comes.
        """
        try:
            reply = say_hello(self.ctx, self.endpoint, self.meta, self.timeout_s, sender_id=self.sender_id, curve=self.curve, stop=self.stop)
        except HelloError:
            reply = None
        if reply is None:
            self._say("lost the learner; reconnecting")
            self.connect()
            return
        if not self.follow(reply):
            self._say("learner is busy (back-pressure); still waiting to send")

    def follow(self, reply: wire.Message) -> bool:
        """Given a hello reply from a liveness check: if the learner names other endpoints
        or is another instance (it restarted), reopens to those and applies its weights.
        True if it did."""
        info = reply.json()
        if (info["trajectory_endpoint"], info["weights_endpoint"]) == self.endpoints:
            if info.get("learner_instance") == self.instance:
                return False
            # The hello that got this reply has agreed the specs with the new learner.
            self._say("the learner restarted on the same endpoints; reconnecting")
        else:
            self._say("the learner restarted on new endpoints; reconnecting")
        self._open(reply)
        self._apply_weights(reply)
        return True


class HelloProbe:
    """A liveness check that does not block its owner: says hello to the learner on a thread
    (a fresh DEALER on the shared context). `reply` is the answer, or None if there was none
    within the timeout or the learner refused; read it once `done` is set."""

    def __init__(self, link: LearnerLink):
        self.reply: wire.Message | None = None
        self.done = threading.Event()
        args = (link.ctx, link.endpoint, link.meta, link.timeout_s)
        kw = {"sender_id": link.sender_id, "curve": link.curve, "stop": link.stop}
        self._thread = threading.Thread(target=self._run, args=(args, kw), name="zrl-hello-probe", daemon=True)
        self._thread.start()

    def _run(self, args, kw) -> None:
        try:
            self.reply = say_hello(*args, **kw)
        except Exception as e:  # noqa: BLE001 (HelloError, or a context closing under it)
            log.warning("liveness check of the learner failed: %s", e)
        finally:
            self.done.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)


class Actor:
    def __init__(
        self,
        config: Config,
        learner: str,
        index: int = 0,
        num_actors: int = 1,
        seed: int | None = None,
        *,
        ctx: zmq.Context | None = None,
        stop: threading.Event | None = None,
        console: bool = True,
        max_steps: int | None = None,
        eval_mode: bool = False,
    ):
        self.config = config
        self.learner = learner
        self.index = index
        self.num_actors = num_actors
        self.seed = config.run.seed if seed is None else seed
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.stop = stop or threading.Event()
        self.console = console
        self.max_steps = max_steps
        # An evaluation actor acts greedily, feeds no data, and reports its episodes as eval_*.
        self.eval_mode = eval_mode
        self.link: LearnerLink | None = None
        self.env_steps = 0
        self.model: torch.nn.Module | None = None
        self.recorders: list = []

    @property
    def policy_version(self) -> int:
        return self.link.policy_version if self.link is not None else -1

    @property
    def weights_applied(self) -> int:
        return self.link.weights_applied if self.link is not None else 0

    def _say(self, text: str) -> None:
        if self.console:
            print(f"[actor {self.index}] {text}", flush=True)
        log.info("actor %d: %s", self.index, text)

    def _on_weights(self, version: int) -> None:
        for r in self.recorders:
            r.policy_version = version

    # ------------------------------------------------------------------ main loop

    def run(self) -> int:
        """Runs until stopped, the learner shuts down, or max_steps; returns env steps taken."""
        cfg = self.config
        torch.set_num_threads(cfg.actor.torch_threads)
        K = cfg.run.eval_num_envs if self.eval_mode else cfg.actor.num_envs
        G = 1 if self.eval_mode else cfg.actor.env_groups
        width = K // G  # envs per group: the columns of one chunk
        seed = self.seed * 10_000 + (5_000 if self.eval_mode else 0) + self.index * K
        torch.manual_seed(seed)
        envs = []
        ready = cfg.actor.env_batching == "first_ready" and G > 1  # (one group: the same as groups)
        try:
            batch = cfg.actor.act_batch or width  # (first_ready) envs per act() call
            if ready:
                envs = [make_ready_env(cfg, K, batch, seed)]
            else:
                envs = [make_vector_env(cfg.env, width, seed + g * width) for g in range(G)]
            obs_spec, action_spec = envs[0].observation_spec, envs[0].action_spec
            try:
                algo = algorithms.get(cfg.algo.name)(cfg, obs_spec, action_spec)
                self.model = algo.build_model()
            except ValueError as e:  # e.g. a CNN for vector observations: the config cannot run here
                raise ConfigError(f"{cfg.env.id}: {e}") from None
            precision = resolve_precision(cfg.actor.precision, torch.device("cpu"))
            if precision == "bf16":
                # The model itself in bf16: the link casts the weights it receives straight into it.
                self.model.to(torch.bfloat16)
            self.model.eval()
            if use_int8(cfg.actor.int8_torso, self.model, torso=True):
                precision += ", int8 torso"
            elif use_int8(cfg.actor.int8_first_conv, self.model):
                precision += ", int8 first conv"
            meta = hello_meta(cfg, "eval" if self.eval_mode else "actor", self.index, obs_spec, action_spec, width)
            self.link = LearnerLink(self.ctx, self.learner, meta, self.model, sender_id=self.index, timeout_s=cfg.actor.learner_timeout_s,
                                    send_hwm=cfg.actor.send_hwm, stop=self.stop, say=self._say, on_weights=self._on_weights,
                                    curve=transport.Curve.from_config(cfg.security))
            if not self.link.connect():
                return 0
            sender = Sender(self.index, link=self.link)  # sends chunks through link.pusher
            if self.eval_mode:
                policy, self.recorders = algo.make_eval_policy(self.model, greedy=True), [NullRecorder()]
            else:
                policy = algo.make_policy(self.model, actor_index=self.index, num_actors=self.num_actors, seed=seed)
                self.recorders = [algo.make_recorder(self.model, num_envs=width, sender=sender) for _ in range(G)]
            for r in self.recorders:
                r.policy_version = self.policy_version
            what = "evaluating greedily" if self.eval_mode else "acting"
            groups = f" in {G} groups" if G > 1 else ""
            if ready:
                groups = f", acting on the first {batch} ready, chunks of {G} fixed groups of {width}"
            self._say(f"connected to {self.learner}: {K} x {cfg.env.id}{groups}, {what} ({precision}), policy version {self.policy_version}")
            if ready:
                return self._loop_ready(envs[0], ReadyStreams(policy, self.recorders, width), sender)
            return self._loop(envs, policy, sender)
        except LearnerFinished as e:
            self._say(f"learner finished ({e}); exiting")
            return self.env_steps
        finally:
            for env in envs:
                env.close()
            if self.link is not None:
                self.link.finish()
            if self._own_ctx:
                self.ctx.term()

    def _loop(self, envs, policy, sender: Sender) -> int:
        """Steps the env groups in turn, every group but one always in flight.

        Each group's actions go to its emulator threads (step_async) as soon as
        the policy has them; then the actor waits for the next group (step_wait),
        records its step (a full chunk goes out from there if the queue has room)
        and acts on it. With G > 1 groups the other G - 1 groups keep the emulator
        busy while the policy runs; a chunk that has to wait for room waits only
        once the group's next step is under way.
        """
        G = len(envs)
        width = envs[0].num_envs
        stats = _EpisodeStats(self, sender, G * width)
        streams = [ActorAlgo(policy, r) for r in self.recorders]  # policy state + recorder per group
        for env, stream in zip(envs, streams):
            obs = env.reset()
            stream.begin(obs)
            env.step_async(stream.act(obs))
        g = 0
        while not self.stop.is_set():
            self.link.poll_weights()
            step = envs[g].step_wait()
            frames = streams[g].observe(step)  # chunks that found the queue full
            envs[g].step_async(streams[g].act(step.obs))
            for frame in frames:
                self.link.send(frame, drop=stats.drop)
            self.env_steps += width
            stats.add(range(g * width, (g + 1) * width), step.reward.tolist(), (step.terminated | step.truncated).tolist())
            g = (g + 1) % G
            if self.max_steps is not None and self.env_steps >= self.max_steps:
                break
        return self.env_steps  # a step still in flight is abandoned: close() stops the env

    def _loop_ready(self, env, streams: ReadyStreams, sender: Sender) -> int:
        """actor.env_batching first_ready: acts on whichever batch of envs finished first.

        The same loop as `_loop` with one env whose batches are the first W envs
        to finish (ale_py's asynchronous mode); `ReadyStreams` files their steps
        under the fixed groups' recorders. Rows that are an env's first
        observation (after the reset) are acted on but are no step.
        """
        stats = _EpisodeStats(self, sender, streams.num_envs)
        ids, obs = env.reset_batch()
        streams.begin(ids, obs)
        env.step_async(streams.act(ids, obs))
        while not self.stop.is_set():
            self.link.poll_weights()
            step = env.step_wait()
            frames, stepped = streams.observe(step)
            env.step_async(streams.act(step.env_ids, step.obs))
            for frame in frames:
                self.link.send(frame, drop=stats.drop)
            # In Python lists: a batch is a few rows, and numpy's per-call cost (several calls
            # per batch) was most of this bookkeeping's next to the emulator threads.
            rows = stepped.tolist()  # False: an env's first observation, not a step
            done = (step.terminated | step.truncated).tolist()
            stats.add(step.env_ids.tolist(), step.reward.tolist(), done, rows)
            self.env_steps += sum(rows)
            if self.max_steps is not None and self.env_steps >= self.max_steps:
                break
        return self.env_steps


class _EpisodeStats:
    """An actor's running episode returns and lengths per env; finished episodes go to the
    learner as a STATS message at most every actor.stats_interval_s."""

    def __init__(self, actor: Actor, sender: Sender, num_envs: int):
        self.actor = actor
        self.sender = sender
        self.names = ("eval_return", "eval_length") if actor.eval_mode else ("episode_return", "episode_length")
        self.drop = actor.config.actor.backpressure == "drop"
        self.bp_names = (f"actor{actor.index}/blocked_s", f"actor{actor.index}/dropped_chunks")
        self.every = actor.config.actor.stats_interval_s
        self.ret = [0.0] * num_envs
        self.len = [0] * num_envs
        self.done_ret: list[float] = []
        self.done_len: list[float] = []
        self.last = time.monotonic()

    def add(self, envs, reward: list[float], done: list[bool], stepped: list[bool] | None = None) -> None:
        """One step of each env in `envs` (env indices): its reward and whether its episode
        ended; rows whose `stepped` is False (an env's first observation) are left out."""
        ret, length = self.ret, self.len
        for i, (k, r, d) in enumerate(zip(envs, reward, done)):
            if stepped is not None and not stepped[i]:
                continue
            ret[k] += r
            length[k] += 1
            if d:
                self.done_ret.append(ret[k])
                self.done_len.append(float(length[k]))
                ret[k], length[k] = 0.0, 0
        now = time.monotonic()
        if self.done_ret and now - self.last >= self.every:
            link = self.actor.link
            stats = {self.names[0]: np.array(self.done_ret), self.names[1]: np.array(self.done_len),
                     self.bp_names[0]: np.array([link.blocked_s]), self.bp_names[1]: np.array([float(link.dropped)])}
            link.send(self.sender.encode(wire.Kind.STATS, stats, self.actor.policy_version), drop=self.drop)
            self.done_ret, self.done_len = [], []
            self.last = now


def make_ready_env(cfg: Config, num_envs: int, batch: int, seed: int):
    """actor.env_batching first_ready's env: the K envs in one ale_py AtariVectorEnv that returns
    batches of the first `batch` to finish. ConfigError where the env is not ale_vector's."""
    from zrl.envs.atari import AleVectorEnv, uses_ale_vector

    if not uses_ale_vector(cfg.env):
        raise ConfigError(f"actor.env_batching: first_ready needs ale_py's AtariVectorEnv (an Atari env.id with env.backend "
                          f"auto or ale_vector), not {cfg.env.id!r} with backend {cfg.env.backend}; use groups")
    return AleVectorEnv(cfg.env, num_envs, seed, batch_size=batch)
