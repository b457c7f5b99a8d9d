"""The agent server (`zrl serve`): batched inference for external simulators."""
from zrl.server.server import AgentServer, resolve_specs

__all__ = ["AgentServer", "resolve_specs"]
