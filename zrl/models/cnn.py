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
stays in it, which oneDNN's convolutions run faster. Measured on 2 cores (Pong,
shallow CNN unless said): a bf16 actor's act() on 8 frames 51 -> 44 us per frame
(the deep ResNet's 1,710 -> 457); a learner update on 8 x 20 steps 51 -> 28 ms
in fp32 and 19-20 -> 18-19 ms in bf16 (the deep ResNet's bf16 update 490-500 ->
256-260 ms). The parameters keep their usual layout (they are views of one flat
buffer, flatten_parameters); a convolution follows its input's format.

Actors may act with an int8 first conv (`use_int8_first_conv`, from
actor.int8_first_conv): the uint8 pixels go in as they are (relaid out, not
cast) and only that conv's weights are quantized; oneDNN's int8 convolution
writes the model's dtype with the ReLU fused. On 2 cores (AVX-512 VNNI) a bf16
actor's act() on 8 frames 333 -> 275 us.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import nn
from torch.nn import functional as F

from zrl import _core, spaces
from zrl.config import ModelConfig
from zrl.cpu import cpu_flags
from zrl.models import preprocess

__all__ = ["ImpalaShallow", "ImpalaDeep", "ResidualBlock", "Int8FirstConv", "build_cnn_torso", "int8_conv_supported", "use_int8_first_conv"]


def _init(layer: nn.Module) -> nn.Module:
    nn.init.orthogonal_(layer.weight, math.sqrt(2))
    nn.init.zeros_(layer.bias)
    return layer


def conv_input(obs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 images [N, C, H, W] as `dtype` pixel values 0..255, for the first conv.

    On the CPU, for float32 and bfloat16, the result is in channels_last memory
    format, cast and relaid out in one pass by zrl's C++ kernel (~3-4 us per
    84x84x4 frame, against ~12 us for PyTorch's cast then relayout); the values
    are the same as obs.to(dtype), exactly. For uint8 (the int8 first conv's
    input) it is the relayout alone (~0.5 us per frame, PyTorch's ~10 us).
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


_INT8_CONV: bool | None = None


def _int8_conv_probe() -> bool:
    """Runs one small int8 conv at full scale (pixels 255, weights +-127: products that would
    saturate int16 pairs, as oneDNN's pre-VNNI int8 kernels do) against the exact answer.
    False if the ops are missing, take other arguments (older PyTorch) or get it wrong."""
    try:
        conv = nn.Conv2d(2, 2, 3, stride=2, padding=1)
        with torch.no_grad():
            conv.weight.copy_(torch.tensor([1.0, -1.0]).view(2, 1, 1, 1).expand(2, 2, 3, 3))
            conv.bias.zero_()
        x = torch.full((1, 2, 5, 5), 255, dtype=torch.uint8)
        with torch.inference_mode():
            got = Int8FirstConv(conv, relu=False)(x).float()
        want = torch.nn.functional.conv2d(x.float() / 255.0, conv.weight.detach(), conv.bias.detach(), 2, 1)
        return bool(got.shape == want.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-4))
    except (RuntimeError, TypeError, AttributeError, NotImplementedError):
        return False


def int8_conv_supported() -> bool:
    """Whether this CPU has int8 dot products (AVX-512 VNNI, AVX-VNNI or AMX) and this PyTorch's
    oneDNN int8 convolution (torch.ops.onednn.qconv2d_pointwise, the op of PyTorch's x86 int8
    inference) computes a probe conv exactly. Decided once per process."""
    global _INT8_CONV
    if _INT8_CONV is None:
        flags = cpu_flags()
        vnni = "avx512_vnni" in flags or "avx_vnni" in flags or "amx_int8" in flags
        _INT8_CONV = bool(vnni and torch.backends.mkldnn.is_available() and _int8_conv_probe())
    return _INT8_CONV


class Int8FirstConv:
    """A torso's first convolution for acting on uint8 pixels with int8 weights (on the CPU).

    The pixels are exact as uint8 (scale 1/255, zero point 0), so only the weights
    are quantized: per output channel, to round(W / s) with s = max|W| / 127 (an
    error of at most 1/254 of the channel's largest weight). On Pong's shallow CNN
    that is ~1% relative error in the conv's output, about twice a bf16 conv's
    0.4%. oneDNN accumulates in int32 and writes the model's dtype, channels_last,
    the ReLU that follows fused in. Measured on 2 cores (AVX-512 VNNI, 8 frames of
    4x84x84, one thread): the relayout, conv and ReLU ~70 us against ~140 for the
    bf16 path's cast-and-relayout, conv and ReLU.

    The weights are requantized whenever the conv's weights change (a compare of
    a few thousand values per call, ~4 us; requantizing and repacking ~40 us).
    Non-finite weights raise (the float path would give NaN logits, which the
    actor's draw refuses). Acting only: no autograd, and the learner never uses
    it. The actions it picks are the acting model's, and so is the log mu(a|x)
    recorded with them, so V-trace corrects for the difference from the
    learner's fp32 model like it does for a bf16 actor.
    """

    @staticmethod
    def fits(conv: nn.Module) -> bool:
        """Whether `conv` is one this can run: a Conv2d with zero padding, groups 1 and a bias."""
        return isinstance(conv, nn.Conv2d) and conv.padding_mode == "zeros" and conv.groups == 1 and conv.bias is not None

    def __init__(self, conv: nn.Conv2d, relu: bool):
        if not self.fits(conv):
            raise ValueError("Int8FirstConv: a Conv2d with zero padding, groups 1 and a bias")
        self.conv = conv
        self.relu = relu
        self._geometry = (list(conv.stride), list(conv.padding), list(conv.dilation), conv.groups)
        self._source: torch.Tensor | None = None  # the weights last quantized
        self._packed: torch.Tensor | None = None  # oneDNN's opaque tensor: cannot be copied
        self._scales: torch.Tensor | None = None
        self._zero_points = torch.zeros(conv.out_channels, dtype=torch.int64)

    def __deepcopy__(self, memo):
        # A copied model gets its own, not yet quantized, int8 conv over its copy of the conv.
        return Int8FirstConv(copy.deepcopy(self.conv, memo), self.relu)

    def _quantize(self) -> None:
        w = self.conv.weight.detach().float()
        if not torch.isfinite(w).all():
            raise ValueError("the first conv's weights are not finite (the learner diverged?): cannot act")
        scales = (w.abs().amax(dim=(1, 2, 3)) / 127.0).clamp_min(1e-12)
        q = torch.round(w / scales[:, None, None, None]).clamp_(-127, 127).to(torch.int8)
        self._packed = torch.ops.onednn.qconv_prepack(q, scales, 1.0 / 255.0, 0, *self._geometry, None)
        self._scales = scales
        self._source = self.conv.weight.detach().clone()

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        """uint8 [N, C, H, W] -> (ReLU of) the conv of obs / 255, in the conv's dtype, channels_last."""
        w = self.conv.weight
        if self._source is None or not torch.equal(self._source, w):
            self._quantize()
        return torch.ops.onednn.qconv2d_pointwise(
            conv_input(obs, torch.uint8), 1.0 / 255.0, 0, self._packed, self._scales, self._zero_points, self.conv.bias,
            *self._geometry, 1.0, 0, w.dtype, "relu" if self.relu else "none", [], "")


class _Torso(nn.Module):
    """convs, then flatten -> FC -> ReLU; the FC's width comes from a dry run over the input shape."""

    out_dim: int
    int8_first_conv: Int8FirstConv | None = None  # set by use_int8_first_conv (actors)

    def _finish(self, in_shape: tuple[int, int, int], hidden: int) -> None:
        with torch.no_grad():
            n = self.convs(torch.zeros(1, *in_shape)).numel()
        self.fc = _init(nn.Linear(n, hidden))
        self.out_dim = hidden

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        layers = iter(self.convs)
        first = next(layers)
        q = self.int8_first_conv
        if q is not None and obs.dtype == torch.uint8 and obs.device.type == "cpu" and obs.dim() == 4 and not torch.is_grad_enabled():
            x = q(obs)  # acting: see Int8FirstConv
            if q.relu:
                next(layers)  # the ReLU, fused into the int8 conv
        elif obs.dtype == torch.uint8 and first.padding_mode == "zeros":
            # uint8 frames: conv(x / 255, W) = conv(x, W / 255), so the 1/255 goes on the first
            # conv's few weights instead of every pixel (a bf16 actor's forward pass: 10% less
            # time). Pixel values 0..255 are exact in bf16; zero padding is zero either way.
            x = F.conv2d(conv_input(obs, _input_dtype(obs, first.weight)), first.weight * (1.0 / 255.0), first.bias, first.stride,
                         first.padding, first.dilation, first.groups)
        else:
            x = first(preprocess(obs, self.fc.weight.dtype))
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


def use_int8_first_conv(model: nn.Module) -> bool:
    """Makes the CNN torsos in `model` act with an int8 first conv (`Int8FirstConv`) on uint8
    pixels; False (and nothing changed) where there is none, or this CPU and PyTorch lack
    native int8 convolutions. For acting only: forward passes with gradients use the normal path."""
    if not int8_conv_supported():
        return False
    done = False
    for torso in model.modules():
        if isinstance(torso, _Torso):
            convs = list(torso.convs)
            if Int8FirstConv.fits(convs[0]):
                torso.int8_first_conv = Int8FirstConv(convs[0], relu=len(convs) > 1 and isinstance(convs[1], nn.ReLU))
                done = True
    return done


def build_cnn_torso(cfg: ModelConfig, obs_spec: spaces.Spec) -> _Torso:
    """The torso model.network names (impala_shallow or impala_deep) for obs_spec's images."""
    shape = _image_shape(obs_spec, cfg.network)
    if cfg.network == "impala_shallow":
        return ImpalaShallow(shape, cfg.cnn_hidden)
    if cfg.network == "impala_deep":
        return ImpalaDeep(shape, tuple(cfg.cnn_channels), cfg.cnn_hidden)
    raise ValueError(f"model.network {cfg.network!r} is not a CNN")
