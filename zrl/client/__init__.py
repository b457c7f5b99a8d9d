"""Python client for the agent server (`zrl serve`), RELAAX-style: `Client` (zrl.client.client)
and its errors (zrl.client.errors); the docstring of zrl.client.client shows its use."""
from __future__ import annotations

from zrl.client.client import Client
from zrl.client.errors import ClientError, ClientTimeout, ServerError, UsageError

__all__ = ["Client", "ClientError", "ClientTimeout", "ServerError", "UsageError"]
