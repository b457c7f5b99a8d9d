"""CURVE security from the config's `security` section: key pairs on sockets
(`Curve`) and the one ZAP handler per context that admits only the authorized public
keys (`Authenticator`).
"""
from __future__ import annotations

import logging
import os
import weakref

import zmq
import zmq.auth


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
        # lazy: zmq.auth.thread imports asyncio, a start-up cost for every importer of this module (clients too)
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
