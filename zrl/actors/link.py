"""An actor's (or the agent server's) link to the learner: the hello that agrees specs and
model with it (`hello_meta`, `say_hello`), and `LearnerLink`, which sends trajectories under
back-pressure, applies the newest weights without waiting, checks the learner is alive
(`HelloProbe`) and follows it when it restarts."""
from __future__ import annotations

import logging
import os
import socket as pysocket
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import zmq

from zrl import spaces, transport, wire
from zrl.config import Config
from zrl.models import flatten_parameters

__all__ = ["HelloBusy", "HelloError", "HelloProbe", "HelloReply", "LearnerFinished", "LearnerLink", "hello_meta", "say_hello"]

log = logging.getLogger("zrl.actor")


class HelloError(RuntimeError):
    """The learner refused our hello; the message is the learner's reason."""


class HelloBusy(HelloError):
    """The learner refused our hello for now (too many senders, or too many new ones at
    once), not for a mismatch: say hello again later."""


class LearnerFinished(Exception):
    pass


@dataclass
class HelloReply:
    """The learner's answer to a hello: its meta (`info`: the sender id to send with,
    endpoints, specs, policy version, instance) and, for a new sender id, the weights."""

    info: dict[str, Any]
    weights: wire.Message | None

    @property
    def sender_id(self) -> int:
        return self.info["sender_id"]


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
              stop: threading.Event | None = None) -> HelloReply | None:
    """One hello attempt on a fresh DEALER (the Lazy Pirate pattern): the reply, or None on
    timeout (or once `stop` is set: an actor told to stop does not wait out the timeout).
    `sender_id` is the id a previous reply handed out (0: none yet); the learner keeps it
    while it is live, and sends weights only with a new one.

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
        return _read_reply(sock.recv_multipart(copy=False), endpoint)
    finally:
        sock.close(linger=0)


def _read_reply(frames: list, endpoint: str) -> HelloReply:
    msg = wire.decode(frames[0], allowed_kinds=frozenset({int(wire.Kind.HELLO_REPLY), int(wire.Kind.ERROR)}))
    if msg.kind == wire.Kind.ERROR:
        text = msg.text()
        raise (HelloBusy if text.startswith(wire.BUSY) else HelloError)(f"learner at {endpoint} refused hello: {text}")
    weights = wire.decode(frames[1], allowed_kinds=frozenset({int(wire.Kind.WEIGHTS)})) if len(frames) > 1 else None
    return HelloReply(msg.json(), weights)


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

    def __init__(self, ctx: zmq.Context, endpoint: str, meta: dict[str, Any], model: torch.nn.Module, *, sender_id: int = 0,
                 timeout_s: float, send_hwm: int, stop: threading.Event, say, on_weights=None, curve: transport.Curve | None = None,
                 keepalive_s: float | None = None):
        self.ctx = ctx
        self.endpoint = endpoint
        self.meta = meta
        self.model = model
        self.sender_id = sender_id  # the learner's id for us, from its hello reply
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
        # Says hello (claiming its id) at least this often, so the learner never reuses the id
        # of a sender that is quiet (an agent server without clients, an evaluation actor on
        # long episodes), and a reused one is noticed (learner.actor_timeout_s / 2; None: never).
        self.keepalive_s = keepalive_s
        self._hello_at = time.monotonic()
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
            try:
                reply = say_hello(self.ctx, self.endpoint, self.meta, self.timeout_s, sender_id=self.sender_id, curve=self.curve, stop=self.stop)
            except HelloBusy as e:
                self._say(f"{e}; saying hello again in {min(attempt, 10)}s")
                self.stop.wait(min(attempt, 10))
                continue
            if reply is not None:
                break
            self._say(f"learner at {self.endpoint} not answering (attempt {attempt}, {time.monotonic() - t0:.0f}s); retrying")
        else:
            return False
        self._open(reply)
        self._apply_weights(reply.weights)
        if attempt > 1:
            self._say(f"learner is back; reconnected at policy version {self.policy_version}")
        return True

    def _open(self, reply: HelloReply) -> None:
        """(Re)opens PUSH and SUB to the endpoints a hello reply names, sending as the id it hands out."""
        info = reply.info
        self.close()
        self.sender_id = reply.sender_id
        self._hello_at = time.monotonic()
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

    def _apply_weights(self, msg: wire.Message | None) -> None:
        if msg is None:  # (a hello reply for an id the learner knows: the weights come on SUB)
            return
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
        if self._probe is None and self.keepalive_s is not None and time.monotonic() - self._hello_at >= self.keepalive_s:
            self._watch()

    def wait_for_version(self, version: int) -> None:
        """Waits until weights of `version` or newer are applied, until stopped, or until the
        link follows another learner instance (a restarted learner may resume at an older
        version). The learner's heartbeat keeps the liveness check quiet while it trains; a
        lost learner is followed as in `poll_weights`. Raises LearnerFinished on SHUTDOWN."""
        opened = self._opened
        while self.policy_version < version and not self.stop.is_set() and self._opened == opened:
            self.sub.poll(100, zmq.POLLIN)
            self.poll_weights()

    def _watch(self) -> None:
        """No weights for a timeout: asks the learner on a thread (the loop goes on), and
        follows it if it restarted (new endpoints, or a new instance on the same ones)."""
        if self._probe is None:
            self._probe = HelloProbe(self)
            self._probe_opened = self._opened
            self._hello_at = time.monotonic()
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

    def follow(self, reply: HelloReply) -> bool:
        """Given a hello reply from a liveness check: if the learner names other endpoints
        or is another instance (it restarted), reopens to those and applies its weights.
        True if it did."""
        info = reply.info
        if (info["trajectory_endpoint"], info["weights_endpoint"]) == self.endpoints:
            if info.get("learner_instance") == self.instance:
                if reply.sender_id != self.sender_id:  # (the learner reused our id while we were silent)
                    self._say(f"the learner handed out a new sender id; sending as {reply.sender_id}")
                    self.sender_id = reply.sender_id
                return False
            # The hello that got this reply has agreed the specs with the new learner.
            self._say("the learner restarted on the same endpoints; reconnecting")
        else:
            self._say("the learner restarted on new endpoints; reconnecting")
        self._open(reply)
        self._apply_weights(reply.weights)
        return True


class HelloProbe:
    """A liveness check that does not block its owner: says hello to the learner on a thread
    (a fresh DEALER on the shared context). `reply` is the answer, or None if there was none
    within the timeout or the learner refused; read it once `done` is set."""

    def __init__(self, link: LearnerLink):
        self.reply: HelloReply | None = None
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
