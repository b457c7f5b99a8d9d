"""Socket set-up shared by the learner, actors and the agent server.

Every component takes endpoints (`tcp://`, `ipc://`, `inproc://`), so tests
can put everything in one process and deployments can spread it over hosts.
The learner binds one public control endpoint; the trajectory and weights
endpoints are derived from it unless configured, and may use any free port
(`:*`): the handshake tells the others where they ended up.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import sys
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
# The per-message hot paths in C++ (csrc/zmq_native.h)

NATIVE_ENV = "ZRL_NATIVE_ZMQ"  # "0" keeps pyzmq's own send and recv everywhere
_native: list = []  # [ZmqNative or None, why], filled on first use


def native():
    """pyzmq's own libzmq reached from C++ (`zrl._core.ZmqNative`), or None.

    Actors send their trajectory chunks through it (`Pusher`) and the learner
    drains its PULL socket through it (`wire.Gate.drain`): one C++ call per
    message or burst instead of pyzmq's Python layers. None where the library
    cannot be found from pyzmq's extension (`native_note` says why) or where
    ZRL_NATIVE_ZMQ=0; everything then takes pyzmq's path, with the same results.
    """
    if not _native:
        why = ""
        api = None
        if os.environ.get(NATIVE_ENV, "1") == "0":
            why = f"{NATIVE_ENV}=0"
        else:
            try:
                from zrl import _core

                module = sys.modules[zmq.backend.Socket.__module__]
                path = getattr(module, "__file__", None) or ""
                if not path.endswith((".so", ".pyd", ".dylib")):  # (the CFFI backend, a frozen build, ...)
                    raise RuntimeError(f"pyzmq's backend {module.__name__} is not an extension module ({path or 'no file'})")
                api = _core.ZmqNative(path, *zmq.zmq_version_info())
                why = f"through {api.library}"
            except (ImportError, AttributeError, KeyError, RuntimeError) as e:
                why = f"unavailable: {e}"
        if api is None:
            log.info("native ZeroMQ path off (%s): pyzmq's send and recv", why)
        _native[:] = [api, why]
    return _native[0]


def zmq_error(err: int) -> zmq.ZMQError:
    """The exception pyzmq raises for a libzmq errno (zmq.Again for EAGAIN, ...)."""
    cls = {errno.EAGAIN: zmq.Again, zmq.ETERM: zmq.ContextTerminated, errno.EINTR: zmq.InterruptedSystemCall}.get(err, zmq.ZMQError)
    return cls(err)


def native_note() -> str:
    """How `native()` went: the library used, or why there is none."""
    native()
    return _native[1]


class Pusher:
    """Sends wire.OutMessage frames (an actor's chunks) on one pyzmq socket.

    Through `native()` where there is one, each frame goes out in one C++ call
    that stamps its header's per-message fields and hands it to ZeroMQ: a small
    frame copied (the OutMessage is free again at once), a large one (from
    wire.SEND_ZERO_COPY_FROM, kept in a SendBuffer) without a copy, ZeroMQ
    holding the SendBuffer until it has sent it. Without `native()`, frames get
    `OutMessage.finish` and pyzmq's send (zero-copy from zmq.COPY_THRESHOLD up).
    The socket stays pyzmq's: use a Pusher from the socket's thread only, and
    drop it when the socket closes.
    """

    __slots__ = ("sock", "api", "address", "_send_frame")

    def __init__(self, sock: zmq.Socket, use_native: bool = True):
        self.sock = sock
        self.api = native() if use_native else None
        self.address = sock.underlying
        self._send_frame = self.api.send_frame if self.api is not None else None

    def send(self, msg, sender_id: int, seq: int, policy_version: int, rows=None, wait: bool = False):
        """Sends `msg` (a wire.OutMessage) now: None if it went, else its finished frame for
        the caller to send later (the queue stayed full: `wait` is False, or the socket's
        SNDTIMEO ran out). Raises zmq.ZMQError for any other failure, as pyzmq would.
        `rows` is as for OutMessage.seal: a wire.Cut of msg's layout, a mapping, or None.
        (The actor's per-chunk path: kept flat.)"""
        if self._send_frame is not None and not self.sock.closed:  # (a closed socket's address dangles)
            buf = msg.send_buffer
            if buf is None:
                buf = msg.buffer
            if rows is not None and msg._sealed is rows and msg._sender_id == sender_id:  # (sent again as it was cut: seal has nothing to do)
                total = msg._total
            else:
                total = msg.seal(sender_id, rows)
            err = self._send_frame(self.address, buf, total, seq, policy_version, wait)
            if err == 0:
                return None
            return self._retry(msg, buf, err, seq, policy_version, wait)
        frame = msg.finish(sender_id=sender_id, seq=seq, policy_version=policy_version, rows=rows)
        try:
            self.sock.send(frame, 0 if wait else zmq.NOBLOCK, copy=False)
            return None
        except zmq.Again:
            return frame

    def _retry(self, msg, buf, err: int, seq: int, policy_version: int, wait: bool):
        while True:
            if err == errno.EAGAIN:
                return msg.frame()  # stamped: the finished frame
            if err != errno.EINTR:  # (a signal: Python has run its handler; try again)
                raise zmq_error(err)
            err = self._send_frame(self.address, buf, msg._total, seq, policy_version, wait)
            if err == 0:
                return None


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
