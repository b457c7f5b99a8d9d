"""The algorithm seam: what an algorithm must provide to the actor and learner pipelines."""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import numpy as np
import torch

from zrl import spaces, wire
from zrl.config import Config
from zrl.envs import Step

# Builds the header and returns the frame for a message an actor algorithm
# filled: (OutMessage | None, fallback arrays | None, rows) -> frame bytes.
FrameFn = Callable[..., Any]


class ActorAlgo:
    """The per-actor half of an algorithm: picks actions and cuts messages to send.

    The actor pipeline calls `begin(obs)` once, then for every step
    `act(obs) -> actions` and `observe(step) -> [frames]`, and sends what
    `observe` returns. `policy_version` is set by the pipeline whenever new
    weights are applied, and `sender` frames messages with the actor's id and
    sequence numbers.
    """

    policy_version: int = 0

    def begin(self, obs: np.ndarray) -> None:
        raise NotImplementedError

    def act(self, obs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def observe(self, step: Step) -> list[Any]:
        raise NotImplementedError


class Sender:
    """Frames an actor's messages: its sender id and a running sequence number."""

    def __init__(self, sender_id: int):
        self.sender_id = sender_id
        self.seq = 0

    def finish(self, msg: wire.OutMessage, policy_version: int, rows: dict[str, int] | None = None):
        self.seq += 1
        return msg.finish(sender_id=self.sender_id, seq=self.seq, policy_version=policy_version, rows=rows)

    def encode(self, kind: wire.Kind, arrays, policy_version: int, meta=None) -> bytearray:
        self.seq += 1
        return wire.encode(kind, arrays, meta, sender_id=self.sender_id, seq=self.seq, policy_version=policy_version)


class Algorithm:
    name: ClassVar[str]
    uses_replay: ClassVar[bool] = False

    def __init__(self, config: Config, obs_spec: spaces.Spec, action_spec: spaces.Spec):
        self.config = config
        self.obs_spec = obs_spec
        self.action_spec = action_spec

    # -- both sides
    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def trajectory_schema(self, max_columns: int) -> wire.Schema:
        """What a TRAJECTORY message must carry; checked by the learner on receive."""
        raise NotImplementedError

    # -- actor side
    def make_actor(self, model: torch.nn.Module, *, num_envs: int, actor_index: int, num_actors: int, seed: int, sender: Sender) -> ActorAlgo:
        raise NotImplementedError

    def act_eval(self, model: torch.nn.Module, obs: torch.Tensor, greedy: bool = True) -> torch.Tensor:
        """Actions for evaluation: greedy, or sampled from the policy."""
        raise NotImplementedError

    # -- learner side, stream mode
    def columns(self, msg: wire.Message, bindings: dict[str, int]) -> int:
        """How many batch columns a message fills."""
        raise NotImplementedError

    def env_steps(self, msg: wire.Message, bindings: dict[str, int]) -> int:
        raise NotImplementedError

    def check_values(self, msg: wire.Message, bindings: dict[str, int]) -> None:
        """Content checks a schema cannot express (index ranges, action bounds); raise wire.WireError."""

    def collate(self, msgs: list[wire.Message], device: torch.device) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    # -- learner side, replay mode (see apex_dqn)
    def ingest(self, msg: wire.Message, bindings: dict[str, int]) -> None:
        raise NotImplementedError

    def sample(self, device: torch.device) -> dict[str, torch.Tensor] | None:
        raise NotImplementedError

    def after_update(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], info: dict[str, Any]) -> None:
        """Called after each optimiser step (priority updates, target syncs)."""

    def state_dict(self) -> dict[str, Any]:
        """Extra learner state to checkpoint (target network, replay, ...)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
