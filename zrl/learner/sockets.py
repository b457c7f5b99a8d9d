"""The learner's three sockets, bound together and closed together.

control ROUTER (`bind`, the one address actors know): hellos in, replies out;
trajectory PULL: chunks and stats from actors and agent servers;
weights PUB: version-tagged weights, and SHUTDOWN at the end.
With security.curve every one is a CURVE server that admits only the keys in
security.authorized_keys (actors and agent servers; docs/DEPLOY.md, the trust model).
"""
from __future__ import annotations

import zmq

from zrl import transport
from zrl.config import Config


class LearnerSockets:
    def __init__(self, config: Config, bind: str, ctx: zmq.Context | None = None):
        lc = config.learner
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.curve = transport.Curve.from_config(config.security)
        # Only actors and agent servers (security.authorized_keys), never simulator clients.
        self._auth = self.curve.start_authenticator(self.ctx, transport.LEARNER_PEERS) if self.curve else None
        # Any peer reaches the control socket first: ZeroMQ cuts off a larger hello before
        # reading it, and a peer's queues (hellos in, replies out) stay short. MANDATORY
        # makes a reply to a peer that does not read raise, so it is counted.
        self.control = transport.socket(self.ctx, zmq.ROUTER, hwm=lc.control_hwm)
        self.control.setsockopt(zmq.MAXMSGSIZE, lc.max_hello_bytes)
        self.control.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.pull = transport.socket(self.ctx, zmq.PULL, hwm=lc.pull_hwm)
        self.pull.setsockopt(zmq.MAXMSGSIZE, lc.max_message_bytes)
        # CONFLATE: a subscriber that does not read holds the newest weights frame (shared
        # by every subscriber), never a queue of old versions of its own.
        self.pub = transport.socket(self.ctx, zmq.PUB)
        self.pub.setsockopt(zmq.CONFLATE, 1)
        try:
            if self.curve:
                for sock in (self.control, self.pull, self.pub):
                    self.curve.server(sock, transport.LEARNER_PEERS)
            self.control_endpoint = transport.bind(self.control, bind)
            self.trajectory_endpoint = transport.bind(self.pull, lc.trajectory_bind or transport.derive_endpoint(bind, "traj"))
            self.weights_endpoint = transport.bind(self.pub, lc.weights_bind or transport.derive_endpoint(bind, "weights"))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for s in (self.control, self.pull, self.pub):
            s.close(linger=0)
        if self._auth is not None:
            self._auth.release()
            self._auth = None
        if self._own_ctx:
            self.ctx.term()
