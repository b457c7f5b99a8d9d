"""The checks of a hello (the first message an actor, agent server or client sends)
that the learner and the agent server both make: a JSON object, this protocol
version, and observation and action specs that `zrl.spaces` can read.
"""
from __future__ import annotations

from zrl import spaces
from zrl.protocol.frame import PROTOCOL_VERSION, WireError
from zrl.protocol.message import Message


class HelloInvalid(ValueError):
    """A hello every receiver refuses (not a JSON object, another protocol, bad specs)."""


def read_hello(msg: Message, receiver: str):
    """A hello's meta and its (obs, action) specs, after the checks the learner and the
    agent server both make; HelloInvalid says what is wrong. Role checks are the caller's."""
    try:
        hello = msg.json()
    except WireError as e:
        raise HelloInvalid(f"hello meta is not a JSON object: {e.detail}") from None
    if hello.get("protocol") != PROTOCOL_VERSION:
        raise HelloInvalid(f"protocol {hello.get('protocol')!r} not supported ({receiver} speaks {PROTOCOL_VERSION})")
    try:
        obs = spaces.from_json(hello.get("obs_space"))
        action = spaces.from_json(hello.get("action_space"))
    except spaces.SpecError as e:
        raise HelloInvalid(f"bad space spec: {e}") from None
    return hello, obs, action
