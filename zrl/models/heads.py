"""Policy heads: a `PolicyHead` turns torso features into distribution parameters and knows how
to sample, score (`log_prob`, which gives trajectories' `behaviour_logp`) and measure entropy,
so algorithms are written once for Discrete (`CategoricalHead`) and Box (`GaussianHead`) actions."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from zrl import _core, spaces

__all__ = ["PolicyHead", "CategoricalHead", "GaussianHead", "make_head"]


class PolicyHead(nn.Module):
    """Features -> distribution parameters, plus the distribution's operations on them."""

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward_float(self, h: torch.Tensor) -> torch.Tensor:
        """The parameters in float32, from features of any dtype (what actors sample from)."""
        return self(h).float()

    def sample_with_log_prob(self, params: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(actions, log-probabilities of them) as numpy arrays, for acting (no autograd)."""
        action = self.sample(params)
        return action.numpy(), self.log_prob(params, action).numpy()


class CategoricalHead(PolicyHead):
    def __init__(self, in_dim: int, n: int):
        super().__init__()
        self.linear = nn.Linear(in_dim, n)
        nn.init.orthogonal_(self.linear.weight, 0.01)
        nn.init.zeros_(self.linear.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(h)  # logits

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(torch.softmax(params, -1), 1).squeeze(-1)

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return params.argmax(-1)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(params, -1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(params, -1)
        return -(logp.exp() * logp).sum(-1)

    def forward_float(self, h: torch.Tensor) -> torch.Tensor:
        # A bf16 model's 256 -> n layer in fp32 (its few weights cast per call): on a few rows
        # oneDNN's bf16 linear is slower than its fp32 one.
        lin = self.linear
        return F.linear(h.float(), lin.weight.float(), lin.bias.float())

    def sample_with_log_prob(self, params: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        # zrl's C++ draw (inverse CDF, one pass per row) instead of multinomial, log_softmax and
        # gather: one call instead of several torch ops per act(). The uniforms come from
        # torch's generator, so torch.manual_seed still fixes the actions.
        if params.device.type != "cpu" or params.dtype != torch.float32 or params.dim() != 2:
            return super().sample_with_log_prob(params)
        u = torch.rand(params.shape[0], dtype=torch.float64)
        return _core.sample_categorical(params.contiguous().numpy(), u.numpy())


class GaussianHead(PolicyHead):
    """Diagonal Gaussian with a state-independent log std; params = [mean, log_std]."""

    def __init__(self, in_dim: int, action_dim: int):
        super().__init__()
        self.mean = nn.Linear(in_dim, action_dim)
        nn.init.orthogonal_(self.mean.weight, 0.01)
        nn.init.zeros_(self.mean.bias)
        self.log_std = nn.Parameter(torch.zeros(action_dim))
        self.action_dim = action_dim

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        mean = self.mean(h)
        return torch.cat([mean, self.log_std.expand_as(mean)], -1)

    def _split(self, params):
        return params[..., : self.action_dim], params[..., self.action_dim :]

    def sample(self, params):
        mean, log_std = self._split(params)
        return mean + log_std.exp() * torch.randn_like(mean)

    def mode(self, params):
        return self._split(params)[0]

    def log_prob(self, params, actions):
        mean, log_std = self._split(params)
        z = (actions - mean) / log_std.exp()
        return (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self, params):
        _, log_std = self._split(params)
        return (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)


def make_head(in_dim: int, action_spec: spaces.Spec) -> PolicyHead:
    if isinstance(action_spec, spaces.DiscreteSpec):
        return CategoricalHead(in_dim, action_spec.n)
    if isinstance(action_spec, spaces.BoxSpec):
        return GaussianHead(in_dim, math.prod(action_spec.shape))
    raise ValueError(f"no policy head for {action_spec}")
