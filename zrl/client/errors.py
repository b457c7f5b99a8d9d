"""The agent-server client's errors: every one is a `ClientError`."""
from __future__ import annotations

__all__ = ["ClientError", "ClientTimeout", "ServerError", "UsageError"]


class ClientError(RuntimeError):
    """Base of the client's errors."""


class ClientTimeout(ClientError, TimeoutError):
    """The server did not answer within the timeout."""


class ServerError(ClientError):
    """The server answered with an error; the message is its text."""


class UsageError(ClientError):
    """A call out of order (send before init) or with a wrong observation."""
