"""Endpoint strings (`tcp://HOST:PORT`, `ipc://PATH`, `inproc://NAME`): what is wrong
with one, the learner's derived endpoints, and where a peer can reach one.

Every component takes endpoints, so tests can put everything in one process and
deployments can spread it over hosts. The learner binds one public control endpoint;
the trajectory and weights endpoints are derived from it unless configured, and may
use any free port (`:*`): the handshake tells the others where they ended up.
config.py reads this module at start-up: it imports no zmq, numpy or other heavy module.
"""
from __future__ import annotations

import re
from urllib.parse import urlsplit

_LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def endpoint_problem(endpoint: str, *, binding: bool) -> str | None:
    """Why `endpoint` cannot be bound (binding) or connected to, or None if its form is fine.

    libzmq's own answer is a bare "Invalid argument", and it takes tcp port 99999 as
    99999 - 65536; this names what is wrong first.
    """
    forms = "tcp://HOST:PORT, ipc://PATH or inproc://NAME"
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("tcp", "ipc", "inproc"):
        return f"endpoint {endpoint!r}: expected {forms}"
    if not rest:
        return f"endpoint {endpoint!r}: nothing after {scheme}://"
    if scheme != "tcp":
        return None
    host, colon, port = rest.rpartition(":")
    if not colon or not host:
        return f"endpoint {endpoint!r}: expected tcp://HOST:PORT"
    if port == "*":
        return None if binding else f"endpoint {endpoint!r}: port * can only be bound, not connected to"
    if not port.isdigit() or not (0 if binding else 1) <= int(port) <= 65535:  # binding port 0 picks one, as * does
        return f"endpoint {endpoint!r}: the port must be " + ("0-65535 or *" if binding else "1-65535")
    return None


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
