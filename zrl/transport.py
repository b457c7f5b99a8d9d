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
import weakref
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


# ---------------------------------------------------------------------------
# CURVE


class Curve:
    """CURVE keys from the config's `security` section, applied to sockets.

    Servers (the learner's and the agent server's bound sockets) get the
    server key pair and `curve_server`; a ZAP authenticator thread on their
    context admits only the public keys in `authorized_keys`. Clients
    (actors, the server's learner link, zrl clients) get their own key pair
    and the server's public key, so they also know they reach the right
    server.
    """

    def __init__(self, server_secret_key=None, authorized_keys=None, server_public_key=None, client_secret_key=None):
        self.server_secret_key = server_secret_key
        self.authorized_keys = authorized_keys
        self.server_public_key = server_public_key
        self.client_secret_key = client_secret_key

    @classmethod
    def from_config(cls, sec) -> "Curve | None":
        if not sec.curve:
            return None
        return cls(sec.server_secret_key, sec.authorized_keys, sec.server_public_key, sec.client_secret_key)

    @staticmethod
    def _load(path, what: str) -> tuple[bytes, bytes | None]:
        import zmq.auth

        try:
            return zmq.auth.load_certificate(path)
        except (OSError, ValueError) as e:
            raise ValueError(f"security.{what}: cannot read key file {path}: {e}") from None

    def server(self, sock: zmq.Socket) -> None:
        public, secret = self._load(self.server_secret_key, "server_secret_key")
        if secret is None:
            raise ValueError(f"security.server_secret_key: {self.server_secret_key} holds no secret key")
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True

    def client(self, sock: zmq.Socket) -> None:
        public, secret = self._load(self.client_secret_key, "client_secret_key")
        if secret is None:
            raise ValueError(f"security.client_secret_key: {self.client_secret_key} holds no secret key")
        server_public, _ = self._load(self.server_public_key, "server_public_key")
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_serverkey = server_public

    def start_authenticator(self, ctx: zmq.Context) -> "Authenticator":
        return Authenticator.acquire(ctx, self.authorized_keys)


class Authenticator:
    """One ZAP handler per context (ZeroMQ allows only one), shared by the servers on it."""

    # Keyed by the context itself, weakly: an id() could be reused by a later context.
    _by_ctx: "weakref.WeakKeyDictionary[zmq.Context, Authenticator]" = weakref.WeakKeyDictionary()

    def __init__(self, ctx: zmq.Context, keys_dir: str):
        import os

        from zmq.auth.thread import ThreadAuthenticator

        if not os.path.isdir(keys_dir):
            raise ValueError(f"security.authorized_keys: {keys_dir} is not a folder of public keys")
        self.ctx = ctx
        self.keys_dir = keys_dir
        self.users = 0
        self.auth = ThreadAuthenticator(ctx, log=logging.getLogger("zrl.auth"))
        self.auth.start()
        self.auth.configure_curve(domain="*", location=keys_dir)

    @classmethod
    def acquire(cls, ctx: zmq.Context, keys_dir: str) -> "Authenticator":
        a = cls._by_ctx.get(ctx)
        if a is None:
            a = cls._by_ctx[ctx] = cls(ctx, keys_dir)
        elif a.keys_dir != keys_dir:
            raise ValueError(f"security.authorized_keys: this context already authenticates against {a.keys_dir}")
        a.users += 1
        return a

    def release(self) -> None:
        self.users -= 1
        if self.users <= 0:
            self.auth.stop()
            Authenticator._by_ctx.pop(self.ctx, None)
