"""IMPALA's convolutional torsos (Espeholt et al. 2018, figure 3) for image observations.

A torso maps observations [N, C, H, W] in their wire dtype (uint8 frames are
scaled to [0, 1] here, on the model's device, by scaling the first conv's
weights) to features [N, cnn_hidden]:

- `ImpalaShallow`: conv 16 8x8 /4, ReLU, conv 32 4x4 /2, ReLU, FC, ReLU
  (the DQN-style network of the paper's "shallow" agent).
- `ImpalaDeep`: three stages of conv 3x3, max-pool 3x3 /2 and two residual
  blocks [ReLU, conv 3x3, ReLU, conv 3x3] + skip, then ReLU, FC, ReLU.

Weights are orthogonal with gain sqrt(2) (ReLU) and biases zero, as in the
MLP torso. Actor-critic models share one CNN torso between policy and value.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from zrl import spaces
from zrl.config import ModelConfig
from zrl.models import preprocess

__all__ = ["ImpalaShallow", "ImpalaDeep", "ResidualBlock", "build_cnn_torso"]


def _init(layer: nn.Module) -> nn.Module:
    nn.init.orthogonal_(layer.weight, math.sqrt(2))
    nn.init.zeros_(layer.bias)
    return layer


def _image_shape(obs_spec: spaces.Spec, network: str) -> tuple[int, int, int]:
    if not isinstance(obs_spec, spaces.BoxSpec) or len(obs_spec.shape) != 3:
        shape = getattr(obs_spec, "shape", None)
        raise ValueError(f"model.network {network} needs image observations [C, H, W], got shape {shape} (use mlp for vectors)")
    return obs_spec.shape  # type: ignore[return-value]


class _Torso(nn.Module):
    """convs, then flatten -> FC -> ReLU; the FC's width comes from a dry run over the input shape."""

    out_dim: int

    def _finish(self, in_shape: tuple[int, int, int], hidden: int) -> None:
        with torch.no_grad():
            n = self.convs(torch.zeros(1, *in_shape)).numel()
        self.fc = _init(nn.Linear(n, hidden))
        self.out_dim = hidden

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        layers = iter(self.convs)
        first = next(layers)
        if obs.dtype != torch.uint8 or first.padding_mode != "zeros":
            x = self.convs(preprocess(obs, self.fc.weight.dtype))
            return torch.relu(self.fc(x.flatten(1)))
        # uint8 frames: conv(x / 255, W) = conv(x, W / 255), so the 1/255 goes on the first
        # conv's few weights instead of every pixel (a bf16 actor's forward pass: 10% less
        # time). Pixel values 0..255 are exact in bf16; zero padding is zero either way.
        x = F.conv2d(obs.to(first.weight.dtype), first.weight * (1.0 / 255.0), first.bias, first.stride,
                     first.padding, first.dilation, first.groups)
        for layer in layers:
            x = layer(x)
        return torch.relu(self.fc(x.flatten(1)))


class ImpalaShallow(_Torso):
    def __init__(self, in_shape: tuple[int, int, int], hidden: int = 256):
        super().__init__()
        c = in_shape[0]
        self.convs = nn.Sequential(
            _init(nn.Conv2d(c, 16, 8, stride=4)),
            nn.ReLU(),
            _init(nn.Conv2d(16, 32, 4, stride=2)),
            nn.ReLU(),
        )
        self._finish(in_shape, hidden)


class ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))), 3x3 convolutions keeping the shape."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = _init(nn.Conv2d(channels, channels, 3, padding=1))
        self.conv1 = _init(nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Not in place: x is the skip path (and, in the first block, the max-pool's output autograd keeps).
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaDeep(_Torso):
    def __init__(self, in_shape: tuple[int, int, int], channels: tuple[int, ...] = (16, 32, 32), hidden: int = 256):
        super().__init__()
        layers: list[nn.Module] = []
        c = in_shape[0]
        for out in channels:
            layers += [
                _init(nn.Conv2d(c, out, 3, padding=1)),
                nn.MaxPool2d(3, stride=2, padding=1),
                ResidualBlock(out),
                ResidualBlock(out),
            ]
            c = out
        layers.append(nn.ReLU())
        self.convs = nn.Sequential(*layers)
        self._finish(in_shape, hidden)


def build_cnn_torso(cfg: ModelConfig, obs_spec: spaces.Spec) -> _Torso:
    """The torso model.network names (impala_shallow or impala_deep) for obs_spec's images."""
    shape = _image_shape(obs_spec, cfg.network)
    if cfg.network == "impala_shallow":
        return ImpalaShallow(shape, cfg.cnn_hidden)
    if cfg.network == "impala_deep":
        return ImpalaDeep(shape, tuple(cfg.cnn_channels), cfg.cnn_hidden)
    raise ValueError(f"model.network {cfg.network!r} is not a CNN")
