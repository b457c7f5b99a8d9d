"""`zrl keys generate DIR`: CURVE key pairs in ZeroMQ's certificate format, one
allow-list per role (docs/DEPLOY.md, the trust model).

DIR/server.key(_secret)           the learner's and the agent servers' pair
DIR/actor.key(_secret), actor2..  actors, and agent servers towards the learner
DIR/client.key(_secret), client2.. simulator clients of an agent server
DIR/actors/                       public keys the learner admits (security.authorized_keys)
DIR/clients/                      public keys the agent server admits (security.client_keys)

Add or remove .key files in an allow-list to grant or revoke access. Only key
pairs made by this call are added to their allow-list; a pair that already exists
is kept and its authorisation left as it is, so running the command again never
re-authorises a revoked key.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NamedTuple

import zmq.auth


class Role(NamedTuple):
    """The peers of one kind of server: their key pairs' names and their allow-list."""

    prefix: str  # pairs are PREFIX.key, PREFIX2.key, ...
    allow_list: str  # the folder under DIR that holds their public keys
    who: str


ACTORS = Role("actor", "actors", "actor / agent-server")
CLIENTS = Role("client", "clients", "simulator-client")


def generate_keys(directory: str | os.PathLike, clients: int = 1, actors: int | None = None) -> list[str]:
    """Makes the key pairs and allow-lists in `directory`: `actors` actor pairs (default:
    as many as `clients`) and `clients` simulator-client pairs. Returns what it did, line by line."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    lines = [_make_pair(d, "server")[1]]
    for role, n in ((ACTORS, clients if actors is None else actors), (CLIENTS, clients)):
        lines += _make_role(d, role, n)
    if (d / "authorized").is_dir():  # made by earlier versions, for every role at once
        lines.append(f"left {d / 'authorized'} (the one allow-list of earlier versions) as it is: "
                     "a config whose security.authorized_keys names it keeps admitting its keys at the learner")
    return lines + _config_lines(d)


def _make_pair(d: Path, name: str) -> tuple[bool, str]:
    """Writes d/NAME.key and d/NAME.key_secret unless the pair exists; (whether it did, what it did)."""
    if (d / f"{name}.key_secret").exists():
        return False, f"kept existing {d / name}.key / .key_secret"
    zmq.auth.create_certificates(str(d), name)
    os.chmod(d / f"{name}.key_secret", 0o600)
    return True, f"wrote {d / name}.key and {d / name}.key_secret"


def _make_role(d: Path, role: Role, n: int) -> list[str]:
    """The role's first n pairs; the new ones are added to its allow-list, the existing left as they are."""
    allowed = d / role.allow_list
    allowed.mkdir(exist_ok=True)
    lines, added, kept = [], 0, 0
    for i in range(n):
        name = role.prefix if i == 0 else f"{role.prefix}{i + 1}"
        made, line = _make_pair(d, name)
        if made:
            shutil.copy(d / f"{name}.key", allowed / f"{name}.key")
            added += 1
        else:
            kept += 1  # a key revoked by deleting it from the allow-list stays revoked
        lines.append(line)
    lines.append(f"authorised {added} new {role.who} key(s) in {allowed}")
    if kept:
        lines.append(f"left the authorisation of {kept} existing {role.who} key(s) as it is "
                     f"(copy a .key into {allowed} to authorise it)")
    return lines


def _config_lines(d: Path) -> list[str]:
    """Which config key points at which file, and who holds it; the last line is the section to paste."""
    keys = {
        "server_secret_key": (d / "server.key_secret", "learner and agent servers only"),
        "authorized_keys": (d / ACTORS.allow_list, "learner: admits actors and agent servers"),
        "client_keys": (d / CLIENTS.allow_list, "agent server: admits simulator clients"),
        "server_public_key": (d / "server.key", "actors, agent servers and simulator clients"),
        "client_secret_key": (d / "actor.key_secret", "actors and agent servers; actorN.key_secret on the N-th host"),
    }
    lines = [f"security.{k}: {path}  ({who})" for k, (path, who) in keys.items()]
    lines.append(f"simulator clients: {d / 'server.key'} and {d / 'client.key_secret'} (or clientN.key_secret), "
                 "as Client(server_public_key=..., client_secret_key=...) or ClientOptions::load_curve_keys")
    lines.append("config: security: {curve: true, %s}" % ", ".join(f"{k}: {path}" for k, (path, _) in keys.items()))
    return lines
