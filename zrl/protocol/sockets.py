"""pyzmq sockets with zrl's defaults, shared by the learner, actors and the agent
server: no linger, an optional high-water mark, and a bind that checks the endpoint
first and says which one it bound.
"""
from __future__ import annotations

import zmq

from zrl.protocol.endpoints import endpoint_problem


def socket(ctx: zmq.Context, kind: int, *, hwm: int | None = None, linger_ms: int = 0) -> zmq.Socket:
    """A socket with zrl's defaults: no linger (close never blocks), optional high-water mark."""
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, linger_ms)
    if hwm is not None:
        s.setsockopt(zmq.SNDHWM, hwm)
        s.setsockopt(zmq.RCVHWM, hwm)
    return s


def bind(sock: zmq.Socket, endpoint: str) -> str:
    """Binds and returns the endpoint actually bound (with the port chosen for `:*`)."""
    problem = endpoint_problem(endpoint, binding=True)
    if problem:
        raise OSError(f"cannot bind {endpoint}: {problem}")
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as e:
        raise OSError(f"cannot bind {endpoint}: {e}") from None
    last = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    return last or endpoint
