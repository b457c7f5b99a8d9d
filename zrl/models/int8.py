"""Acting in int8 on the CPU: what this CPU's int8 products can do, the per-channel int8
quantization of conv weights, and `Int8FirstConv`, a torso's first conv run on uint8 pixels.

Actors may act with an int8 first conv (`use_int8_first_conv`, from
actor.int8_first_conv): the uint8 pixels go in as they are (relaid out, not
cast) and only that conv's weights are quantized; oneDNN's int8 convolution
writes the model's dtype with the ReLU fused. With `use_int8_torso`
(actor.int8_torso, in `zrl.models.int8_torso`) the shallow CNN acts in int8 end
to end. Both run on any x86 CPU with AVX2 or newer; without int8 dot products
(VNNI, AMX) the conv weights take 63 levels a side, not 127 (`int8_weight_max`).
zrl's own int8 kernels (`_core.int8_layer`, AVX2 and AVX-512 VNNI) run the int8
torso where they beat oneDNN's (`native_int8_layers`); bench/ has the figures.
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from zrl import _core
from zrl.cpu import cpu_flags
from zrl.models.cnn import CnnTorso, conv_input

__all__ = ["Int8FirstConv", "int8_blocks", "int8_conv_supported", "int8_dot_products", "int8_weight_max", "native_int8_layers",
           "quantize_conv_weight", "use_int8_first_conv"]


_INT8_CONV: bool | None = None


def int8_dot_products() -> bool:
    """Whether this CPU multiplies int8 into int32 in one instruction (AVX-512 VNNI, AVX-VNNI or
    AMX). Without it (plain AVX2, as on AMD Zen 1-3), oneDNN's int8 kernels multiply uint8 by
    int8 into pairs summed in saturating int16 (vpmaddubsw), so zrl keeps those products in
    range: see `int8_weight_max`."""
    flags = cpu_flags()
    return "avx512_vnni" in flags or "avx_vnni" in flags or "amx_int8" in flags


def int8_weight_max() -> int:
    """The largest magnitude of the int8 conv weights zrl quantizes to: 127 on CPUs with int8 dot
    products, else 63, so that a pair of uint8 pixels times weights (2 x 255 x 63 = 32,130) fits
    the int16 that pre-VNNI kernels sum pairs in (with 127 a bright frame would saturate it and
    the conv be wrong; PyTorch's x86 int8 backend narrows the range the same way, as its
    reduce_range). Those weights are rounded to 1/126 of each channel's largest instead of 1/254."""
    return 127 if int8_dot_products() else 63


def native_int8_layers() -> bool:
    """Whether Int8Torso runs its layers with zrl's own kernel (`_core.int8_layer`) rather than
    oneDNN's. Where the kernel has AVX-512 VNNI (Intel Ice Lake and later, AMD Zen 4 and later;
    exact for any int8 weights), it is faster than oneDNN's VNNI kernels. Where it has AVX2
    alone, only on CPUs without int8 dot products (AMD Zen 1-3, Intel before Ice Lake), whose
    weights take 63 levels (int8_weight_max) so its pairs of products fit int16: there too it
    is faster than oneDNN. A CPU with AVX-VNNI but not AVX-512 (Intel Alder Lake) keeps
    oneDNN's kernels."""
    kernel = _core.int8_layer_kernels()[0]
    return kernel == "avx512_vnni" or (kernel == "avx2" and not int8_dot_products())


def int8_blocks(w: np.ndarray) -> np.ndarray:
    """int8 weights [J, OC, 4] (output oc's j-th run of 4 input bytes at [j, oc]) laid out as
    `_core.int8_layer` reads them: [OC / 16, J, 64], blocks of 16 outputs whose runs follow one
    another, so that a tile of the kernel streams its weights."""
    j, oc, four = w.shape
    if four != 4 or oc % 16:
        raise ValueError(f"int8_blocks: expected [J, OC, 4] with OC a multiple of 16, got {w.shape}")
    return np.ascontiguousarray(w.reshape(j, oc // 16, 64).transpose(1, 0, 2))


def quantize_conv_weight(conv: nn.Conv2d, whose: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A conv's weights in int8 per output channel: (round(W / s) in +-int8_weight_max(), the
    scales s = max|W| / int8_weight_max()). Raises ValueError, naming `whose` weights, if any
    is not finite."""
    w = conv.weight.detach().float()
    if not torch.isfinite(w).all():
        raise ValueError(f"{whose} weights are not finite (the learner diverged?): cannot act")
    top = int8_weight_max()
    scales = (w.abs().amax(dim=(1, 2, 3)) / top).clamp_min(1e-12)
    return torch.round(w / scales[:, None, None, None]).clamp_(-top, top).to(torch.int8), scales


def _int8_conv_probe() -> bool:
    """Runs one small int8 conv at full scale (pixels 255, weights at int8_weight_max: products
    that would saturate int16 pairs with weights of 127, as oneDNN's pre-VNNI int8 kernels do)
    against the exact answer. False if the ops are missing, take other arguments (older
    PyTorch) or get it wrong."""
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
    """Whether this CPU (x86 with AVX2 or better) and this PyTorch's oneDNN int8 convolution
    (torch.ops.onednn.qconv2d_pointwise, the op of PyTorch's x86 int8 inference) compute a probe
    conv exactly with zrl's weight range (`int8_weight_max`). Decided once per process."""
    global _INT8_CONV
    if _INT8_CONV is None:
        flags = cpu_flags()
        x86 = "avx2" in flags or int8_dot_products()
        _INT8_CONV = bool(x86 and torch.backends.mkldnn.is_available() and _int8_conv_probe())
    return _INT8_CONV


class Int8FirstConv:
    """A torso's first convolution for acting on uint8 pixels with int8 weights (on the CPU).

    The pixels are exact as uint8 (scale 1/255, zero point 0), so only the weights
    are quantized: per output channel, to round(W / s) with s = max|W| / 127 (an
    error of at most 1/254 of the channel's largest weight; 63 and 1/126 on CPUs
    without int8 dot products, see `int8_weight_max`). On Pong's shallow CNN
    that is ~1% relative error in the conv's output, about twice a bf16 conv's
    0.4%. oneDNN accumulates in int32 and writes the model's dtype, channels_last,
    the ReLU that follows fused in: faster than the bf16 path's cast-and-relayout,
    conv and ReLU.

    The weights are requantized whenever the conv's weights change (a compare of
    a few thousand values per call, much cheaper than requantizing and repacking).
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
        q, scales = quantize_conv_weight(self.conv, "the first conv's")
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


def use_int8_first_conv(model: nn.Module) -> bool:
    """Makes the CNN torsos in `model` act with an int8 first conv (`Int8FirstConv`) on uint8
    pixels; False (and nothing changed) where there is none, or this CPU and PyTorch lack
    native int8 convolutions. For acting only: forward passes with gradients use the normal path."""
    if not int8_conv_supported():
        return False
    done = False
    for torso in model.modules():
        if isinstance(torso, CnnTorso):
            convs = list(torso.convs)
            if Int8FirstConv.fits(convs[0]):
                torso.int8_first_conv = Int8FirstConv(convs[0], relu=len(convs) > 1 and isinstance(convs[1], nn.ReLU))
                done = True
    return done
