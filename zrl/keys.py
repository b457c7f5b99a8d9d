"""`zrl keys generate DIR`: CURVE key pairs in ZeroMQ's certificate format.

DIR/server.key and DIR/server.key_secret for the learner and the agent
server; DIR/client.key(_secret), client2.key(_secret), ... for actors and
clients; DIR/authorized/ holds the client public keys the servers accept
(add or remove files there to grant or revoke access). Only key pairs made by
this call are added to authorized/; a pair that already exists is kept and its
authorisation left as it is, so running the command again never re-authorises
a revoked key.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import zmq.auth


def generate_keys(directory: str | os.PathLike, clients: int = 1) -> list[str]:
    d = Path(directory)
    authorized = d / "authorized"
    authorized.mkdir(parents=True, exist_ok=True)
    lines = []
    names = ["server"] + ["client" if i == 0 else f"client{i + 1}" for i in range(clients)]
    added = kept = 0
    for name in names:
        if (d / f"{name}.key_secret").exists():
            # A kept pair's authorisation is left as it is: a key revoked by
            # deleting it from authorized/ stays revoked.
            lines.append(f"kept existing {d / name}.key / .key_secret")
            kept += name != "server"
            continue
        zmq.auth.create_certificates(str(d), name)
        os.chmod(d / f"{name}.key_secret", 0o600)
        lines.append(f"wrote {d / name}.key and {d / name}.key_secret")
        if name != "server":
            shutil.copy(d / f"{name}.key", authorized / f"{name}.key")
            added += 1
    lines.append(f"authorised {added} new client key(s) in {authorized}")
    if kept:
        lines.append(f"left the authorisation of {kept} existing client key(s) as it is "
                     f"(copy a .key into {authorized} to authorise it)")
    lines.append("config: security: {curve: true, server_secret_key: %s, authorized_keys: %s, server_public_key: %s, client_secret_key: %s}"
                 % (d / "server.key_secret", authorized, d / "server.key", d / "client.key_secret"))
    return lines
