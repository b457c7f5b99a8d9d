"""The learner's three sockets, bound together and closed together.

control ROUTER (`bind`, the one address actors know): hellos in, replies out;
trajectory PULL: chunks and stats from actors and agent servers;
weights PUB: version-tagged weights, and SHUTDOWN at the end.
With security.curve every one is a CURVE server.
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
        self._auth = self.curve.start_authenticator(self.ctx) if self.curve else None
        self.control = transport.socket(self.ctx, zmq.ROUTER)
        self.control.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.pull = transport.socket(self.ctx, zmq.PULL, hwm=lc.pull_hwm)
        self.pull.setsockopt(zmq.MAXMSGSIZE, lc.max_message_bytes)
        self.pub = transport.socket(self.ctx, zmq.PUB, hwm=4)
        try:
            if self.curve:
                for sock in (self.control, self.pull, self.pub):
                    self.curve.server(sock)
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
