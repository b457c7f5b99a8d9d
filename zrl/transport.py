"""Socket set-up under its public name: `zrl.transport` re-exports the protocol's
endpoints, sockets, native and curve modules (`zrl.protocol`), so that code written
against `zrl.transport.X` keeps working. New code inside zrl imports from
`zrl.protocol` directly.
"""
from __future__ import annotations

from zrl.protocol.curve import CLIENT_PEERS, LEARNER_PEERS, Authenticator, Curve, Peers
from zrl.protocol.endpoints import connectable, derive_endpoint, endpoint_problem, is_loopback
from zrl.protocol.native import NATIVE_ENV, Pusher, native, native_note, zmq_error
from zrl.protocol.sockets import bind, socket

__all__ = [
    "CLIENT_PEERS",
    "LEARNER_PEERS",
    "NATIVE_ENV",
    "Authenticator",
    "Curve",
    "Peers",
    "Pusher",
    "bind",
    "connectable",
    "derive_endpoint",
    "endpoint_problem",
    "is_loopback",
    "native",
    "native_note",
    "socket",
    "zmq_error",
]
