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
                 progress: Progress, stop: threading.Event, max_message_bytes: int):
        self.control = control
        self.pull = pull
        self.gate = gate
        self.handshake = handshake
        self.progress = progress
        self.stop = stop
        self.max_bytes = max_message_bytes
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
                item = self._on_data(checked)
                if item is not None:
                    self._enqueue(item)

    def _answer_hellos(self) -> None:
        while self.control.poll(0, zmq.POLLIN):
            self._on_control()

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
        try:
            msg = wire.decode(frame, max_bytes=self.max_bytes, allowed_kinds=CONTROL_KINDS)
            reply = self.handshake.answer(msg)
        except wire.WireError as e:
            self.progress.reject(e.reason.value, e.detail)
            reply = wire.encode(wire.Kind.ERROR, meta=f"bad hello: {e}")
        except HelloRefused as e:
            self.progress.reject("hello_refused", str(e))
            reply = wire.encode(wire.Kind.ERROR, meta=str(e))
        try:
            self.control.send_multipart([identity, reply], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # peer gone; nothing to do

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
        self.progress.received(msg.sender_id, self.algo.env_steps(msg, bindings))
        source = self.source
        if source is None:
            return None
        if not source.queued:
            source.take_chunk(msg, bindings)
            return None
        return (msg, bindings)
