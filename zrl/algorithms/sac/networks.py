"""SAC's networks: the tanh-squashed Gaussian policy (what actors get) and the twin Q-networks.

Actions live in two scales. The networks work in [-1, 1]^A (the tanh's range): the policy's
log-densities are of that action, so the default target entropy -dim(A) means the same for
any bounds, and the critics take it as their input. Envs get it rescaled affinely to
[low, high] (`to_bounds`); what the wire and the replay carry is the env's action.
"""
from __future__ import annotations

import math

import numpy as np

import torch
from torch import nn
from torch.nn import functional as F

from zrl.models.inputs import preprocess
from zrl.models.mlp_torso import mlp

__all__ = ["SquashedGaussianPolicy", "TwinQ", "squashed_log_prob"]

# The log std's range (as SB3 and the SAC authors' code): wide, but no exp() overflow or collapse.
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def squashed_log_prob(u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """log pi(tanh(u)) for u ~ N(mean, exp(log_std)), summed over the action dims: the Gaussian's
    log-density minus log |d tanh(u) / du| = log(1 - tanh(u)^2), written as
    2 (log 2 - u - softplus(-2u)) so that it stays finite where tanh(u) rounds to +-1."""
    z = (u - mean) * torch.exp(-log_std)
    gauss = -0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    log_det = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
    return (gauss - log_det).sum(-1)


class SquashedGaussianPolicy(nn.Module):
    """Observation -> a tanh-squashed diagonal Gaussian over [-1, 1]^A (state-dependent std).

    `trained` is 0 until the learner's first update sets it to 1: a parameter that takes no
    gradient, so it travels with the weights (and checkpoints), and acting policies act at
    random until weights that have been trained reach them.
    """

    def __init__(self, obs_dim: int, action_shape: tuple[int, ...], hidden_sizes: tuple[int, ...], activation: str,
                 low: "float | np.ndarray", high: "float | np.ndarray"):
        super().__init__()
        self.obs_dim = obs_dim
        self.action_shape = tuple(action_shape)
        self.action_dim = math.prod(action_shape)
        if np.ndim(low) == 0 and np.ndim(high) == 0:
            self.low, self.high = float(low), float(high)
        else:  # per element: [A] buffers (they follow the module to its device; not saved)
            for side, v in (("low", low), ("high", high)):
                self.register_buffer(side, torch.from_numpy(np.array(np.broadcast_to(v, self.action_shape), np.float32).reshape(-1)), persistent=False)
        self.torso = mlp(obs_dim, tuple(hidden_sizes), activation)
        width = hidden_sizes[-1] if hidden_sizes else obs_dim
        self.mean = nn.Linear(width, self.action_dim)
        self.log_std = nn.Linear(width, self.action_dim)
        self.trained = nn.Parameter(torch.zeros(()), requires_grad=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.mean.weight.dtype

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log_std) of the Gaussian before the tanh, [N, A] each."""
        h = self.torso(preprocess(obs, self.dtype).reshape(obs.shape[0], self.obs_dim))
        return self.mean(h), self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised draw in [-1, 1]^A and its log-density, both float32."""
        mean, log_std = self(obs)
        mean, log_std = mean.float(), log_std.float()
        u = mean + torch.exp(log_std) * torch.randn_like(mean)
        return torch.tanh(u), squashed_log_prob(u, mean, log_std)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """tanh of the mean, in [-1, 1]^A (float32)."""
        return torch.tanh(self(obs)[0].float())

    def to_bounds(self, a: torch.Tensor) -> torch.Tensor:
        """[-1, 1]^A -> the env's [low, high], shaped as the action spec ([N, *shape])."""
        low, high = self.low, self.high
        scaled = low + (a + 1.0) * (0.5 * (high - low))
        if isinstance(low, torch.Tensor):
            return torch.minimum(torch.maximum(scaled, low.float()), high.float()).reshape(a.shape[0], *self.action_shape)
        return scaled.clamp(low, high).reshape(a.shape[0], *self.action_shape)

    def from_bounds(self, action: torch.Tensor) -> torch.Tensor:
        """The env's action [N, *shape] -> [-1, 1]^A [N, A] (the critics' input)."""
        a = action.reshape(action.shape[0], self.action_dim).float()
        return (a - self.low) * (2.0 / (self.high - self.low)) - 1.0


class TwinQ(nn.Module):
    """Two Q-networks, (observation, action in [-1, 1]^A) -> (Q1, Q2), [N] each.

    Both run as one: each layer holds both networks' weights stacked ([2, in, out]) and
    is one batched matmul, half the operations of two networks (what a CPU learner pays
    for, per update, at these sizes). Hidden layers are initialised as zrl's MLP torsos
    (orthogonal, gain sqrt(2), zero biases), the output layers as torch's nn.Linear.
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: tuple[int, ...], activation: str):
        super().__init__()
        self.obs_dim = obs_dim
        sizes = [obs_dim + action_dim, *hidden_sizes, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            last = i == len(sizes) - 2
            w, b = torch.empty(2, n_in, n_out), torch.zeros(2, 1, n_out)
            for k in range(2):
                if last:
                    lin = nn.Linear(n_in, n_out)
                    w[k], b[k, 0] = lin.weight.detach().T, lin.bias.detach()
                else:
                    nn.init.orthogonal_(w[k].T, math.sqrt(2))  # (an nn.Linear's [out, in] weight, as zrl's mlp)
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(b))
        self.act = {"tanh": torch.tanh, "relu": torch.relu}[activation]

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([preprocess(obs).reshape(obs.shape[0], self.obs_dim), action.float()], -1)
        h = torch.matmul(x, self.weights[0]) + self.biases[0]  # [2, N, width]: one input, both networks
        for w, b in zip(self.weights[1:], self.biases[1:]):
            h = torch.baddbmm(b, self.act(h), w)
        q = h.squeeze(-1).float()
        return q[0], q[1]
