"""Deterministic acting as one torch module: observations [B, *obs] in the env's dtype -> the
env's actions [B, *action] (int64 for Discrete, float32 for Box), the model's observation
normalisation and the action's squashing, rescaling or clipping to the Box's bounds inside.
An LSTM model's module takes and returns its core state: (obs, h, c) -> (action, h, c).

`zrl.load`'s agents act with these modules and `zrl export` traces them, so an exported
policy and `zrl.load(...).act` agree by construction. Nothing here runs zrl's C++ kernels:
a trace cannot see into them. Each algorithm picks its module
(`Algorithm.deterministic_policy`).
"""
from __future__ import annotations

import torch
from torch import nn

from zrl import spaces
from zrl.models.actor_critic import ActorCritic
from zrl.models.inputs import preprocess

__all__ = ["ActionForm", "ActorCriticMode", "RecurrentActorCriticMode", "GreedyQ", "SquashedMean", "actor_critic_mode"]


def network_input(obs: torch.Tensor, cnn: bool, dtype: torch.dtype) -> torch.Tensor:
    """What the network gets: a CNN torso would take uint8 frames through zrl's C++ relayout
    kernel, which a trace cannot follow, so it gets them scaled to [0, 1] in float instead."""
    return preprocess(obs, dtype) if cnn else obs


class ActionForm(nn.Module):
    """A batch of actions in the action spec's form: int64 [B] for Discrete; float32
    [B, *shape] for Box, clamped to the bounds the spec has, per element where they differ
    (a Gaussian's mean may lie outside)."""

    def __init__(self, action_spec: spaces.Spec):
        super().__init__()
        self.discrete = isinstance(action_spec, spaces.DiscreteSpec)
        self.shape = tuple(action_spec.shape)
        if not self.discrete:  # [*shape] each, +-inf where there is none (buffers: they follow the module; not saved)
            self.register_buffer("low", torch.from_numpy(action_spec.bound_array("low")).float(), persistent=False)
            self.register_buffer("high", torch.from_numpy(action_spec.bound_array("high")).float(), persistent=False)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return a.to(torch.int64)
        a = a.float().reshape(a.shape[0], *self.shape)
        return torch.minimum(torch.maximum(a, self.low), self.high)


class ActorCriticMode(nn.Module):
    """The mode of an actor-critic's policy (argmax, or the Gaussian's mean clamped to bounds)."""

    def __init__(self, model: ActorCritic, action_spec: spaces.Spec):
        super().__init__()
        self.model = model
        self.form = ActionForm(action_spec)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        m = self.model
        params = m.policy(network_input(obs, m.cnn, m.dtype))
        return self.form(m.head.mode(params.float()))


class RecurrentActorCriticMode(nn.Module):
    """The mode of an LSTM actor-critic's policy, one step: (obs, h, c) -> (action, h, c)."""

    def __init__(self, model: ActorCritic, action_spec: spaces.Spec):
        super().__init__()
        self.model = model
        self.form = ActionForm(action_spec)

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m = self.model
        params, _, (h, c) = m.step(network_input(obs, m.cnn, m.dtype), (h.to(m.dtype), c.to(m.dtype)))
        return self.form(m.head.mode(params.float())), h.float(), c.float()


def actor_critic_mode(model: ActorCritic, action_spec: spaces.Spec) -> nn.Module:
    """The deterministic module of an actor-critic: recurrent where it has an LSTM core."""
    if not isinstance(model, ActorCritic):
        raise TypeError(f"expected an ActorCritic, got {type(model).__name__}: its algorithm must say how it acts deterministically")
    return RecurrentActorCriticMode(model, action_spec) if model.recurrent else ActorCriticMode(model, action_spec)


class GreedyQ(nn.Module):
    """argmax_a Q(s, a) of a Q-network (zrl.models.QNetwork)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        m = self.model
        return m(network_input(obs, m.cnn, m.dtype)).argmax(-1)


class SquashedMean(nn.Module):
    """tanh of a squashed Gaussian policy's mean, rescaled to the Box's bounds (SAC's
    SquashedGaussianPolicy: its `greedy` and `to_bounds`)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.model.to_bounds(self.model.greedy(obs))
