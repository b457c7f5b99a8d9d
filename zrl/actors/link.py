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
from typing import Any

import numpy as np
import torch
import zmq

from zrl import spaces, transport, wire
from zrl.config import Config
from zrl.models import flatten_parameters

__all__ = ["HelloError", "HelloProbe", "LearnerFinished", "LearnerLink", "hello_meta", "say_hello"]

log = logging.getLogger("zrl.actor")


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
