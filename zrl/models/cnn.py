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

On the CPU, uint8 frames enter the first conv in PyTorch's channels_last memory
format ([N, H, W, C] in memory; see `conv_input`), and every later activation
stays in it, which oneDNN's convolutions run faster, for actors and learner alike
(bench/ has the figures). The parameters keep their usual layout (they are views
of one flat buffer, flatten_parameters); a convolution follows its input's format.

Actors may act in int8 instead: a torso runs its `int8_first_conv`
(`zrl.models.int8`) or its `int8_torso` (`zrl.models.int8_torso`) when one is
set, and only for acting; forward passes with gradients take the float path.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from zrl import _core, spaces
from zrl.config import ModelConfig
from zrl.models.inputs import preprocess

if TYPE_CHECKING:  # only annotations: the int8 modules build on this one
    from zrl.models.int8 import Int8FirstConv
    from zrl.models.int8_torso import Int8Torso

__all__ = ["CnnTorso", "ImpalaShallow", "ImpalaDeep", "ResidualBlock", "build_cnn_torso", "conv_input"]


def _init(layer: nn.Module) -> nn.Module:
    nn.init.orthogonal_(layer.weight, math.sqrt(2))
    nn.init.zeros_(layer.bias)
    return layer


def conv_input(obs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 images [N, C, H, W] as `dtype` pixel values 0..255, for the first conv.

    On the CPU, for float32 and bfloat16, the result is in channels_last memory
    format, cast and relaid out in one pass by zrl's C++ kernel (faster than
    PyTorch's cast then relayout); the values are the same as obs.to(dtype),
    exactly. For uint8 (the int8 first conv's input) it is the relayout alone.
    Elsewhere (a GPU learner, other dtypes) it is obs.to(dtype). The kernel works on the tensors' memory through
    numpy, so torch.jit.trace and torch.compile cannot see into it (zrl uses
    neither).
    """
    if obs.dtype != torch.uint8 or obs.device.type != "cpu" or obs.dim() != 4 or dtype not in (torch.float32, torch.bfloat16, torch.uint8):
        return obs.to(dtype)
    n, c, h, w = obs.shape
    out = torch.empty((n, h, w, c), dtype=dtype, device=obs.device)
    _core.pixels_to_channels_last(obs.contiguous().numpy(), out.view(torch.int16).numpy() if dtype == torch.bfloat16 else out.numpy())
    return out.permute(0, 3, 1, 2)


def _input_dtype(obs: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the first conv computes in: autocast's where it is on for obs's device, else the weights'."""
    kind = obs.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return weight.dtype


def _image_shape(obs_spec: spaces.Spec, network: str) -> tuple[int, int, int]:
    if not isinstance(obs_spec, spaces.BoxSpec) or len(obs_spec.shape) != 3:
        shape = getattr(obs_spec, "shape", None)
        raise ValueError(f"model.network {network} needs image observations [C, H, W], got shape {shape} (use mlp for vectors)")
    return obs_spec.shape  # type: ignore[return-value]

class CnnTorso(nn.Module):
    """convs, then flatten -> FC -> ReLU; the FC's width comes from a dry run over the input shape."""

    out_dim: int
    int8_first_conv: Int8FirstConv | None = None  # set by use_int8_first_conv (actors)
    int8_torso: Int8Torso | None = None  # set by use_int8_torso (actors)

    network: str  # its model.network name, for messages

    def _finish(self, in_shape: tuple[int, int, int], hidden: int) -> None:
        try:
            with torch.no_grad():
                n = self.convs(torch.zeros(1, *in_shape)).numel()
        except RuntimeError as e:  # the images shrink to nothing in the convolutions
            raise ValueError(
                f"model.network {self.network} cannot take {in_shape[1]}x{in_shape[2]} images (observations {tuple(in_shape)}): "
                f"{e}; make them larger (env.screen_size for Atari) or use another model.network"
            ) from None
        self.fc = _init(nn.Linear(n, hidden))
        self.out_dim = hidden

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        acting = obs.dtype == torch.uint8 and obs.device.type == "cpu" and obs.dim() == 4 and not torch.is_grad_enabled()
        if acting and self.int8_torso is not None:
            return self.int8_torso(obs)  # acting: see Int8Torso
        layers = iter(self.convs)
        first = next(layers)
        q = self.int8_first_conv
        if q is not None and obs.dtype == torch.uint8 and obs.device.type == "cpu" and obs.dim() == 4 and not torch.is_grad_enabled():
            x = q(obs)  # acting: see Int8FirstConv
            if q.relu:
                next(layers)  # the ReLU, fused into the int8 conv
        elif obs.dtype == torch.uint8 and first.padding_mode == "zeros":
            # uint8 frames: conv(x / 255, W) = conv(x, W / 255), so the 1/255 goes on the first
            # conv's few weights instead of every pixel. Pixel values 0..255 are exact in bf16;
            # zero padding is zero either way.
            x = F.conv2d(conv_input(obs, _input_dtype(obs, first.weight)), first.weight * (1.0 / 255.0), first.bias, first.stride,
                         first.padding, first.dilation, first.groups)
        else:
            x = first(preprocess(obs, self.fc.weight.dtype))
        for layer in layers:
            x = layer(x)
        return torch.relu(self.fc(x.flatten(1)))


class ImpalaShallow(CnnTorso):
    network = "impala_shallow"

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


class ImpalaDeep(CnnTorso):
    network = "impala_deep"

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

def build_cnn_torso(cfg: ModelConfig, obs_spec: spaces.Spec) -> CnnTorso:
    """The torso model.network names (impala_shallow or impala_deep) for obs_spec's images."""
    shape = _image_shape(obs_spec, cfg.network)
    if cfg.network == "impala_shallow":
        return ImpalaShallow(shape, cfg.cnn_hidden)
    if cfg.network == "impala_deep":
        return ImpalaDeep(shape, tuple(cfg.cnn_channels), cfg.cnn_hidden)
    raise ValueError(f"model.network {cfg.network!r} is not a CNN")
