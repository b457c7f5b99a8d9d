"""The weights PUB socket: version-tagged weights after updates, a heartbeat while none come.

`HostWeights` brings the flat weights to the host without making the training
loop wait (on a GPU, a copy into pinned memory behind the update, handed over
once it has landed); `WeightsFrames` writes them into reusable WEIGHTS frames;
`WeightPublisher` sends them, keeps the frame sent last for hello replies, and publishes
them again every `heartbeat_s` while no update does, so that actors'
watchdogs (actor.learner_timeout_s) hear from the learner.
"""
from __future__ import annotations

import time

import numpy as np
import torch
import zmq

from zrl import wire


def publishable(flat: torch.Tensor) -> np.ndarray:
    """The flat weights as a host float32 array (a view on CPU, one copy from a GPU)."""
    return flat.detach().to("cpu", torch.float32).numpy()


class HostWeights:
    """The flat weights on the host, for publishing, without making the training loop wait.

    On CPU the host array is the buffer itself: `start(v)` makes version v ready at once.
    On a GPU, `start(v)` queues a copy into pinned memory behind the update and records an
    event; `ready()` hands the copy over once the stream has passed the event. The next
    update's V-trace round trip waits for the stream anyway, so a version is published one
    update late at no extra synchronisation (a blocking `.cpu()` per update was a second
    round trip). While a copy is in flight, `start` skips: a newer version follows. The
    last copy of a run may go unpublished; the final checkpoint has those weights.
    """

    def __init__(self, flat: torch.Tensor):
        self.flat = flat
        self.pending: int | None = None
        self.gpu = flat.device.type == "cuda"
        if self.gpu:
            self.host = torch.empty(flat.shape, dtype=torch.float32, pin_memory=True)
            self.event = torch.cuda.Event()
            self.stream = torch.cuda.current_stream(flat.device)  # the learner's, on its own GPU (cuda:N too)

    def start(self, version: int) -> None:
        if self.pending is not None:
            return
        if self.gpu:
            with torch.cuda.stream(self.stream):
                self.host.copy_(self.flat.detach(), non_blocking=True)
            self.event.record(self.stream)
        self.pending = version

    def ready(self) -> tuple[int, np.ndarray] | None:
        """(version, float32 weights) once a started copy has landed, else None. The array
        is valid until the next `start` (the caller encodes it into a frame right away)."""
        if self.pending is None or (self.gpu and not self.event.query()):
            return None
        version, self.pending = self.pending, None
        return version, (self.host.numpy() if self.gpu else publishable(self.flat))


class WeightsFrames:
    """WEIGHTS frames of float32 weights, for one thread: one copy into a frame of a
    wire.Layout, which hands a frame's buffer out again only once nothing holds it any
    more (ZeroMQ, a view of it), so a frame is never written while anyone reads it. It
    spares the zeroed buffer and two copies that wire.encode and bytes() make, which a GPU
    learner with a small net would pay per update."""

    def __init__(self):
        self.layout: wire.Layout | None = None

    def frame(self, version: int, params: np.ndarray) -> memoryview:
        """The frame of `params` (any shape: sent flat), read-only."""
        layout = self.layout
        if layout is None or layout.shapes[0][0] != params.size:
            layout = self.layout = wire.Layout(wire.Kind.WEIGHTS, [("params", np.float32, (params.size,))])
        out = layout.allocate()
        out.arrays["params"][...] = params.reshape(-1)
        return out.finish(sender_id=0, seq=0, policy_version=version).toreadonly()


class WeightPublisher:
    """Sends weights on `pub` (the training loop's thread alone), and keeps the frame sent
    last in `latest_frame` as (version, frame) for hello replies (read by the receiver
    thread: a read-only frame that nothing writes until it is free again, sent to any
    number of peers without a copy)."""

    def __init__(self, pub: zmq.Socket, heartbeat_s: float):
        self.pub = pub
        self.heartbeat_s = heartbeat_s
        self.latest_frame: tuple[int, bytes | memoryview] | None = None
        self.frames = WeightsFrames()
        self.host_weights: HostWeights | None = None
        self._published_at = time.monotonic()

    def attach(self, flat: torch.Tensor, version: int) -> None:
        """The flat weights to publish from now on (the built or resumed model's), at `version`."""
        self.host_weights = HostWeights(flat)
        frame = bytes(wire.encode(wire.Kind.WEIGHTS, {"params": publishable(flat)}, policy_version=version))
        self.latest_frame = (version, frame)

    def after_update(self, updates: int, publish_interval: int) -> None:
        """Publishes what has landed, then starts this update's copy (on a CPU it lands at once)."""
        self.publish_ready()
        if updates % publish_interval == 0:
            self.host_weights.start(updates)
            self.publish_ready()

    def publish_ready(self) -> None:
        landed = self.host_weights.ready()
        if landed is not None:
            self.publish(*landed)

    def publish(self, version: int, params: np.ndarray) -> None:
        """Sends version `version` of the weights; the frame is reused once nothing holds it
        (ZeroMQ, hello replies queued for peers, `latest_frame`)."""
        frame = self.frames.frame(version, params)
        self.latest_frame = (version, frame)
        self.send(frame)

    def heartbeat(self) -> None:
        """Publishes the latest weights again if none went out for `heartbeat_s`: an actor
        takes weights of the version it has as a sign of life, and copies nothing."""
        if self.latest_frame is None or time.monotonic() - self._published_at < self.heartbeat_s:
            return
        self.send(self.latest_frame[1])

    def send(self, frame: bytes | memoryview) -> None:
        self._published_at = time.monotonic()
        try:
            self.pub.send(frame, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            pass  # a slow subscriber's queue is full: it gets a newer version later

    def shutdown(self) -> None:
        """Tells subscribers that training is over."""
        try:
            self.pub.send(wire.encode(wire.Kind.SHUTDOWN, meta="learner finished"), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
