"""The learner's receiver thread: hellos on the control socket, chunks and stats on PULL.

It decodes and checks every message (`wire.Gate`: the header, the algorithm's
schema and value rules); a bad one is counted by reason, logged and dropped,
and never reaches training. Good chunks (and an A3C actor's gradients) go to
the batch source: a bounded queue (when it is full the receiver stops reading
PULL, so ZeroMQ's high-water marks push back on the actors while hellos are
still answered) or the replay.
"""
from __future__ import annotations

import logging
import queue
import threading
import time

import zmq

from zrl import wire
from zrl.learner.connection_watch import ConnectionWatch
from zrl.learner.handshake import Handshake, HelloRefused
from zrl.learner.progress import Progress

log = logging.getLogger("zrl.learner")

# What actors send on the PULL socket: chunks (or, A3C, gradients) and stats.
DATA_KINDS = frozenset({int(wire.Kind.TRAJECTORY), int(wire.Kind.GRADIENT), int(wire.Kind.STATS)})
CONTROL_KINDS = frozenset({int(wire.Kind.HELLO)})
# The receiver waits for data inside the drain (a blocking receive, no poll) and looks at
# the control socket (hellos) at least this often: a hello waits at most this long.
CONTROL_EVERY_MS = 10


class Receiver:
    """Runs on its own thread from `start()` until `stop` is set. `source` (set once the
    model is built) takes the chunks; None drops them after counting (a sink learner)."""

    def __init__(self, control: zmq.Socket, pull: zmq.Socket, gate: wire.Gate, handshake: Handshake,
                 progress: Progress, stop: threading.Event, max_message_bytes: int, watch: ConnectionWatch):
        self.control = control
        self.pull = pull
        self.gate = gate
        self.handshake = handshake
        self.progress = progress
        self.stop = stop
        self.max_bytes = max_message_bytes
        self.watch = watch  # (this thread's from start() on)
        self.source = None
        self.algo = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="zrl-receiver", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # a bug here must not hang the trainer
            self.error = e
            log.exception("receiver thread failed")
            self.stop.set()

    def _loop(self) -> None:
        next_control = 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_control:
                self._answer_hellos()
                next_control = now + CONTROL_EVERY_MS / 1000
            # A burst, checked (wire.Gate.drain), its first message waited for inside the
            # drain: a blocking receive costs one system call where a poll before it costs
            # three. A burst for the queue takes no more than the queue has room for: what
            # the learner cannot take yet stays in ZeroMQ, so actors feel back-pressure.
            source = self.source
            burst = source.room() if source is not None else 64
            if burst == 0:  # the source holds the actors back: their chunks wait in ZeroMQ
                self.stop.wait(CONTROL_EVERY_MS / 1000)
                continue
            for checked in self.gate.drain(self.pull, min(burst, 64), CONTROL_EVERY_MS):
                item = self._on_data_guarded(checked)
                if item is not None:
                    self._enqueue(item)

    def _answer_hellos(self) -> None:
        for reason, detail in self.watch.drain():
            self.progress.reject(reason, detail)
        while self.control.poll(0, zmq.POLLIN):
            try:
                self._on_control()
            except Exception as e:  # noqa: BLE001 - a check that raised where none should: count it, keep serving
                log.exception("a control message raised")
                self.progress.reject("internal_error", f"a control message raised {e!r}")

    def _enqueue(self, item) -> None:
        """Blocks while the queue is full (so the PULL socket fills and actors feel
        back-pressure), waking as soon as the trainer takes a batch, and keeps answering
        hellos meanwhile so actors can tell a busy learner from a lost one."""
        q: queue.Queue = self.source.queue
        while not self.stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return
            except queue.Full:
                self._answer_hellos()

    def _on_control(self) -> None:
        try:
            parts = self.control.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        if len(parts) != 2:
            self.progress.reject(wire.Reason.BAD_HEADER.value, f"control message with {len(parts)} frames")
            return
        identity, frame = parts
        self.watch.delivered(frame)
        try:
            msg = wire.decode(frame, max_bytes=self.max_bytes, allowed_kinds=CONTROL_KINDS)
            reply = self.handshake.answer(msg, identity.bytes)
        except wire.WireError as e:
            self.progress.reject(e.reason.value, e.detail)
            reply = [wire.encode(wire.Kind.ERROR, meta=f"bad hello: {e}")]
        except HelloRefused as e:
            self.progress.reject(e.reason, str(e))
            reply = [wire.encode(wire.Kind.ERROR, meta=str(e))]
        self._reply(identity, reply)

    def _reply(self, identity: zmq.Frame, frames: list) -> None:
        """Sends a reply without waiting; one the peer's queue has no room for (it does not
        read its replies) is dropped and counted. The weights frame goes without a copy."""
        try:
            self.control.send_multipart([identity, *frames], zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.progress.reject("reply_unread", "a peer's control queue is full (learner.control_hwm): it does not read its replies")
        except zmq.ZMQError:
            pass  # peer gone (EHOSTUNREACH): nothing to do

    def _on_data_guarded(self, checked):
        try:
            return self._on_data(checked)
        except Exception as e:  # noqa: BLE001 - a check that raised where none should: count it, keep training
            log.exception("a data message raised")
            self.progress.reject("internal_error", f"a data message raised {e!r}")
            return None

    def _on_data(self, checked):
        """One message as the gate checked it ((message, bindings) or the WireError):
        stats are recorded here, chunks and gradients counted (their env steps: the algorithm's
        `env_steps`) and handed on; returns a chunk or gradient for the queue."""
        if isinstance(checked, wire.WireError):
            self.progress.reject(checked.reason.value, checked.detail)
            return None
        msg, bindings = checked
        if bindings is None:  # STATS, the only data kind without a schema
            try:
                self.progress.on_stats(msg)
            except wire.WireError as e:
                self.progress.reject(e.reason.value, e.detail)
            return None
        if msg.policy_version > self.progress.updates:
            self.progress.reject(wire.Reason.FUTURE_VERSION.value, f"policy version {msg.policy_version} from sender {msg.sender_id}, "
                                 f"while the learner has made {self.progress.updates} updates")
            return None
        if not self.progress.received(msg.sender_id, self.algo.env_steps(msg, bindings)):
            self.progress.reject(wire.Reason.UNKNOWN_SENDER.value, f"sender id {msg.sender_id}, which no hello reply handed out")
            return None
        source = self.source
        if source is None:
            return None
        if not source.queued:
            source.take_chunk(msg, bindings)
            return None
        return (msg, bindings)
