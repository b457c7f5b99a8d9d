"""`zrl keys generate DIR`: CURVE key pairs in ZeroMQ's certificate format.

DIR/server.key and DIR/server.key_secret for the learner and the agent
server; DIR/client.key(_secret), client2.key(_secret), ... for actors and
clients; DIR/authorized/ holds the client public keys the servers accept
(add or remove files there to grant or revoke access).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def generate_keys(directory: str | os.PathLike, clients: int = 1) -> list[str]:
    import zmq.auth

    d = Path(directory)
    authorized = d / "authorized"
    authorized.mkdir(parents=True, exist_ok=True)
    lines = []
    names = ["server"] + ["client" if i == 0 else f"client{i + 1}" for i in range(clients)]
    for name in names:
        if (d / f"{name}.key_secret").exists():
            lines.append(f"kept existing {d / name}.key / .key_secret")
        else:
            zmq.auth.create_certificates(str(d), name)
            os.chmod(d / f"{name}.key_secret", 0o600)
            lines.append(f"wrote {d / name}.key and {d / name}.key_secret")
        if name != "server":
            shutil.copy(d / f"{name}.key", authorized / f"{name}.key")
    lines.append(f"authorised {len(names) - 1} client key(s) in {authorized}")
    lines.append("config: security: {curve: true, server_secret_key: %s, authorized_keys: %s, server_public_key: %s, client_secret_key: %s}"
                 % (d / "server.key_secret", authorized, d / "server.key", d / "client.key_secret"))
    return lines
