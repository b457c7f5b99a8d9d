"""The MLP torso for vector observations: Linear + activation layers, orthogonally initialised
with gain sqrt(2) and zero biases (the CNN torsos use the same initialisation)."""
from __future__ import annotations

import math

from torch import nn

__all__ = ["mlp"]


def _act(name: str) -> type[nn.Module]:
    return {"tanh": nn.Tanh, "relu": nn.ReLU}[name]


def mlp(in_dim: int, sizes: tuple[int, ...], activation: str) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in sizes:
        lin = nn.Linear(in_dim, h)
        nn.init.orthogonal_(lin.weight, math.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers += [lin, _act(activation)()]
        in_dim = h
    return nn.Sequential(*layers)
