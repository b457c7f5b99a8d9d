"""CURVE security from the config's `security` section: key pairs on sockets
(`Curve`), the allow-list each kind of server admits (`Peers`), and the one ZAP
handler per context that checks every server's peers against its own allow-list
(`Authenticator`).

The trust model (docs/DEPLOY.md): the learner's sockets admit actors and agent
servers (`security.authorized_keys`); the agent server's client socket admits
simulator clients (`security.client_keys`). A client's key gets nothing from the
learner, and an actor's key gets nothing from an agent server unless it is also
in `client_keys`.
"""
from __future__ import annotations

import logging
import os
import weakref
from typing import NamedTuple

import zmq
import zmq.auth

from zrl.typed_config import ConfigError


class Peers(NamedTuple):
    """Who a CURVE server admits: the ZAP domain its sockets declare, the `security`
    key naming the folder of their public keys, and both in words for errors."""

    domain: str
    key: str
    server: str
    admits: str


# The learner's control, trajectory and weights sockets: actors and agent servers' learner links.
LEARNER_PEERS = Peers("zrl.learner", "authorized_keys", "the learner", "actors and agent servers")
# The agent server's client socket: simulator clients (zrl.client, the C++ client).
CLIENT_PEERS = Peers("zrl.clients", "client_keys", "an agent server", "simulator clients")


class Curve:
    """CURVE keys from the config's `security` section, applied to sockets.

    Servers (the learner's and the agent server's bound sockets) get the
    server key pair, `curve_server` and the ZAP domain of the peers they admit;
    the context's authenticator admits only the public keys in that domain's
    folder. Clients (actors, the server's learner link, zrl clients) get their
    own key pair and the server's public key, so they also know they reach the
    right server.
    """

    def __init__(self, server_secret_key=None, authorized_keys=None, server_public_key=None, client_secret_key=None, client_keys=None):
        self.server_secret_key = server_secret_key
        self.authorized_keys = authorized_keys
        self.server_public_key = server_public_key
        self.client_secret_key = client_secret_key
        self.client_keys = client_keys

    @classmethod
    def from_config(cls, sec) -> "Curve | None":
        if not sec.curve:
            return None
        return cls(sec.server_secret_key, sec.authorized_keys, sec.server_public_key, sec.client_secret_key, sec.client_keys)

    @staticmethod
    def _load(path, what: str) -> tuple[bytes, bytes | None]:
        try:
            return zmq.auth.load_certificate(path)
        except (OSError, ValueError) as e:
            raise ValueError(f"security.{what}: cannot read key file {path}: {e}") from None

    def allow_list(self, peers: Peers) -> str:
        """The folder of public keys that `peers` come from; ConfigError naming its key if unset."""
        folder = getattr(self, peers.key)  # the attributes are named as the config keys
        if folder is None:
            raise ConfigError(f"security.{peers.key}: is required when {peers.server} runs with security.curve: "
                              f"the folder of the public keys of the {peers.admits} it admits (`zrl keys generate DIR` prints it)")
        return folder

    def server(self, sock: zmq.Socket, peers: Peers = LEARNER_PEERS) -> None:
        public, secret = self._load(self.server_secret_key, "server_secret_key")
        if secret is None:
            raise ValueError(f"security.server_secret_key: {self.server_secret_key} holds no secret key")
        # Set before bind: ZeroMQ puts the domain in every ZAP request for this socket.
        sock.zap_domain = peers.domain.encode()
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

    def start_authenticator(self, ctx: zmq.Context, peers: Peers = LEARNER_PEERS) -> "Authenticator":
        """The context's authenticator, admitting `peers` from their allow-list; release() it when done."""
        return Authenticator.acquire(ctx, peers, self.allow_list(peers))


class Authenticator:
    """One ZAP handler per context (ZeroMQ allows only one), shared by the servers on it.

    Each server registers its peers' ZAP domain with its folder of public keys, so a
    learner and an agent server in one process still admit different keys.
    """

    # Keyed by the context itself, weakly: an id() could be reused by a later context.
    _by_ctx: "weakref.WeakKeyDictionary[zmq.Context, Authenticator]" = weakref.WeakKeyDictionary()

    def __init__(self, ctx: zmq.Context):
        # lazy: zmq.auth.thread imports asyncio, a start-up cost for every importer of this module (clients too)
        from zmq.auth.thread import ThreadAuthenticator

        self.ctx = ctx
        self.folders: dict[str, str] = {}  # ZAP domain -> the folder its keys came from
        self.users: dict[str, int] = {}  # ZAP domain -> servers on this context that use it
        self.auth = ThreadAuthenticator(ctx, log=logging.getLogger("zrl.auth"))
        self.auth.start()

    @classmethod
    def acquire(cls, ctx: zmq.Context, peers: Peers, keys_dir: str) -> "Lease":
        if not os.path.isdir(keys_dir):
            raise ValueError(f"security.{peers.key}: {keys_dir} is not a folder of public keys")
        a = cls._by_ctx.get(ctx)
        if a is None:
            a = cls._by_ctx[ctx] = cls(ctx)
        a._allow(peers, keys_dir)
        return Lease(a, peers.domain)

    def _allow(self, peers: Peers, keys_dir: str) -> None:
        known = self.folders.get(peers.domain)
        if known is None:
            # Only this domain's sockets are checked against this folder; ZAP denies a domain it does not know.
            self.auth.configure_curve(domain=peers.domain, location=keys_dir)
            self.folders[peers.domain] = keys_dir
        elif known != keys_dir:
            raise ValueError(f"security.{peers.key}: this context already authenticates {peers.domain} against {known}")
        self.users[peers.domain] = self.users.get(peers.domain, 0) + 1

    def _release(self, domain: str) -> None:
        self.users[domain] -= 1
        if self.users[domain] <= 0:
            # A later server of this domain reloads its folder (keys added or revoked meanwhile).
            del self.users[domain], self.folders[domain]
            self.auth.certs.pop(domain, None)
        if not self.users:
            self.auth.stop()
            Authenticator._by_ctx.pop(self.ctx, None)


class Lease:
    """One server's use of its context's authenticator; release() once, when its sockets are closed."""

    def __init__(self, authenticator: Authenticator, domain: str):
        self.authenticator = authenticator
        self.domain = domain
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.authenticator._release(self.domain)
