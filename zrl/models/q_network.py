"""The Q-network of value-based algorithms (apex_dqn): observation -> Q(s, .) over discrete
actions, with an MLP or CNN torso and an optional dueling head."""
from __future__ import annotations

import math

import torch
from torch import nn

from zrl import spaces
from zrl.config import ModelConfig
from zrl.models.cnn import build_cnn_torso
from zrl.models.inputs import preprocess
from zrl.models.mlp_torso import mlp

__all__ = ["QNetwork"]


def _check_no_core(cfg: ModelConfig, what: str) -> None:
    if cfg.lstm_size > 0:
        raise NotImplementedError(f"model.lstm_size > 0: {what} has no LSTM core (set model.lstm_size: 0)")


class QNetwork(nn.Module):
    """Observation -> Q(s, .) [N, n_actions], with an optional dueling head."""

    def __init__(self, cfg: ModelConfig, obs_spec: spaces.Spec, action_spec: spaces.Spec, dueling: bool = True):
        super().__init__()
        _check_no_core(cfg, "the Q-network (apex_dqn)")
        if not isinstance(action_spec, spaces.DiscreteSpec):
            raise ValueError(f"Q-learning needs discrete actions, got {action_spec}")
        if not isinstance(obs_spec, spaces.BoxSpec):
            raise ValueError(f"observations must be a box, got {obs_spec}")
        self.obs_dim = math.prod(obs_spec.shape)
        self.cnn = cfg.network != "mlp"
        if self.cnn:
            self.torso = build_cnn_torso(cfg, obs_spec)
            out = self.torso.out_dim
        else:
            out = cfg.hidden_sizes[-1] if cfg.hidden_sizes else self.obs_dim
            self.torso = mlp(self.obs_dim, cfg.hidden_sizes, cfg.activation)
        self.dueling = dueling
        self.advantage = nn.Linear(out, action_spec.n)
        self.value = nn.Linear(out, 1) if dueling else None

    @property
    def dtype(self) -> torch.dtype:
        return self.advantage.weight.dtype

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.torso(obs if self.cnn else preprocess(obs, self.dtype).reshape(obs.shape[0], self.obs_dim))
        adv = self.advantage(h)
        if not self.dueling:
            return adv
        return self.value(h) + adv - adv.mean(-1, keepdim=True)
