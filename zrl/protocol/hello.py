"""The checks of a hello (the first message an actor, agent server or client sends)
that the learner and the agent server both make: a JSON object, this protocol
version, and observation and action specs that `zrl.spaces` can read.
"""
from __future__ import annotations

from zrl import spaces
from zrl.protocol.frame import PROTOCOL_VERSION, WireError
from zrl.protocol.message import Message


MAX_ERROR_CHARS = 600  # a refusal's text: enough to name a difference, never an echo of the hello
BUSY = "busy: "  # how a refusal that asks the peer to say hello again later (not a mismatch) starts


class HelloInvalid(ValueError):
    """A hello every receiver refuses (not a JSON object, another protocol, bad specs)."""


def show(value, limit: int = 80) -> str:
    """A peer's value for an error text or a log line: its repr, cut short."""
    return short(repr(value), limit)


def short(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_hello(msg: Message, receiver: str):
    """A hello's meta and its (obs, action) specs, after the checks the learner and the
    agent server both make; HelloInvalid says what is wrong. Role checks are the caller's."""
    try:
        hello = msg.json()
    except WireError as e:
        raise HelloInvalid(f"hello meta is not a JSON object: {e.detail}") from None
    if hello.get("protocol") != PROTOCOL_VERSION:
        raise HelloInvalid(f"protocol {show(hello.get('protocol'))} not supported ({receiver} speaks {PROTOCOL_VERSION})")
    try:
        obs = spaces.from_json(hello.get("obs_space"))
        action = spaces.from_json(hello.get("action_space"))
    except spaces.SpecError as e:
        raise HelloInvalid(short(f"bad space spec: {e}")) from None
    return hello, obs, action
