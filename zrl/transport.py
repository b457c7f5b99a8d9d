"""Socket set-up shared by the learner, actors and the agent server.

Every component takes endpoints (`tcp://`, `ipc://`, `inproc://`), so tests
can put everything in one process and deployments can spread it over hosts.
The learner binds one public control endpoint; the trajectory and weights
endpoints are derived from it unless configured, and may use any free port
(`:*`): the handshake tells the others where they ended up.
"""
from __future__ import annotations

import logging
import re
from urllib.parse import urlsplit

import zmq

log = logging.getLogger("zrl.transport")

_LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


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
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as e:
        raise OSError(f"cannot bind {endpoint}: {e}") from None
    last = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    return last or endpoint


def derive_endpoint(control: str, role: str) -> str:
    """The endpoint for `role` ("traj", "weights") next to a control endpoint, on any free port."""
    if control.startswith("tcp://"):
        host = control[len("tcp://") :].rsplit(":", 1)[0]
        return f"tcp://{host}:*"
    if control.startswith("ipc://") or control.startswith("inproc://"):
        return f"{control}.{role}"
    raise ValueError(f"endpoint {control!r}: expected tcp://, ipc:// or inproc://")


def connectable(advertised: str, via: str) -> str:
    """Rewrites a wildcard host in `advertised` (tcp://0.0.0.0:P) to the host of `via`.

    A learner bound to all interfaces advertises 0.0.0.0; an actor reaches it
    at the host it used for the control endpoint.
    """
    m = re.match(r"tcp://(0\.0\.0\.0|\*|\[::\]|::):(\d+)$", advertised)
    if not m or not via.startswith("tcp://"):
        return advertised
    host = via[len("tcp://") :].rsplit(":", 1)[0]
    return f"tcp://{host}:{m.group(2)}"


def is_loopback(endpoint: str) -> bool:
    """True for ipc://, inproc:// and tcp endpoints on a loopback address."""
    if not endpoint.startswith("tcp://"):
        return True
    host = urlsplit(endpoint).hostname or ""
    return host in _LOOPBACK or host.startswith("127.")
