"""The agent server's client sessions, and the limits that keep room for clients that act.

A hello opens a session. Until its first ACT a session holds a slot but no
trajectory buffer (its recorder is made at that ACT). Three limits keep a
flood of hellos from filling the table: new sessions open at most
`server.new_sessions_per_s` on average (a token bucket of
`server.new_sessions_burst`); a session with no ACT within
`server.first_act_timeout_s` of its hello is dropped; and when the table
is full (`server.max_clients`) a hello evicts the session that has waited
longest for its first ACT. A session that has acted is never evicted for a
newcomer; it leaves by BYE, by `server.client_timeout_s` of silence, or by
breaking the protocol.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from zrl.algorithms.base import Recorder
from zrl.config_sections import ServerConfig
from zrl.protocol.limits import TokenBucket
from zrl.server.stats import Tally


@dataclass(eq=False)
class Session:
    """One client: its routing identity, episode state and recorder."""

    client_id: int
    identity: bytes
    opened: float  # when its hello came
    last_seen: float
    recorder: Recorder | None = None  # made at its first ACT
    awaiting: int | None = None  # the seq of its ACT that the current batch will answer
    closed: str | None = None  # why it was dropped (a request of it may still be in the batch)
    in_episode: bool = False  # an action was given and its reward is awaited
    pending_end: tuple | None = None  # (reward, terminated, truncated, final_obs) awaiting the next FIRST
    begun: bool = False  # the recorder has its first observation
    steps: int = 0
    episode_return: float = 0.0
    episode_length: int = 0
    state: tuple | None = None  # a recurrent policy's core state for this client ([1, H] arrays)

    @property
    def acted(self) -> bool:
        return self.recorder is not None


class SessionRefused(Exception):
    """A hello that opens no session; `reason` is the counter it goes to."""

    def __init__(self, reason: str, text: str):
        super().__init__(text)
        self.reason = reason


class Sessions:
    """The live sessions by routing identity; every session that ends is counted by
    reason in `drops`."""

    def __init__(self, sc: ServerConfig, drops: Tally, now: float, on_drop: Callable[[Session], None] | None = None):
        self.sc = sc
        self.drops = drops
        self.on_drop = on_drop  # told of every session that ends
        self.live: dict[bytes, Session] = {}
        self._unacted: dict[bytes, Session] = {}  # sessions before their first ACT, oldest hello first
        self._bucket = TokenBucket(sc.new_sessions_per_s, sc.new_sessions_burst, now)
        self._next_id = 1

    def __len__(self) -> int:
        return len(self.live)

    def get(self, identity: bytes) -> Session | None:
        return self.live.get(identity)

    def values(self):
        return self.live.values()

    def open(self, identity: bytes, now: float) -> Session:
        """A new session for `identity` (its old one, if any, is replaced); SessionRefused
        when every slot holds an acting client, or new sessions come too fast."""
        self.drop(identity, "replaced")
        full = len(self.live) >= self.sc.max_clients
        if full and not self._unacted:
            raise SessionRefused("server_full", f"server is full ({self.sc.max_clients} clients, all acting): try again later")
        if not self._bucket.take(now):
            raise SessionRefused("hello_rate", f"too many new sessions (server.new_sessions_per_s is "
                                               f"{self.sc.new_sessions_per_s:g}): say hello again in a moment")
        if full:
            self.drop(next(iter(self._unacted)), "evicted", "(the server was full; it had not acted yet)")
        session = Session(self._next_id, identity, opened=now, last_seen=now)
        self._next_id += 1
        self.live[identity] = self._unacted[identity] = session
        return session

    def acted(self, session: Session) -> None:
        """Its first ACT: from now on it is never evicted for a newcomer."""
        self._unacted.pop(session.identity, None)

    def drop(self, identity: bytes, reason: str, detail: str = "") -> bool:
        session = self.live.pop(identity, None)
        if session is None:
            return False
        self._unacted.pop(identity, None)
        session.closed = reason
        if self.on_drop is not None:
            self.on_drop(session)
        self.drops.note(reason, f"client {session.client_id} {detail}".rstrip())
        return True

    def expire(self, now: float) -> None:
        """Drops the sessions that have not acted first_act_timeout_s after their hello,
        and those silent for client_timeout_s."""
        grace = self.sc.first_act_timeout_s
        while self._unacted:
            oldest = next(iter(self._unacted.values()))
            if now - oldest.opened <= grace:
                break
            self.drop(oldest.identity, "first_act_timeout", f"(no ACT within server.first_act_timeout_s {grace:g} of its hello)")
        limit = self.sc.client_timeout_s
        for identity in [i for i, s in self.live.items() if now - s.last_seen > limit]:
            self.drop(identity, "timeout")
