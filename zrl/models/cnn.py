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
actor's act() on 8 frames 333 -> 275 us. With `use_int8_torso` (actor.int8_torso)
the shallow CNN acts in int8 end to end (`Int8Torso`): act() on 8 frames ~265 ->
~195 us. Both run on any x86 CPU with AVX2 or newer; without int8 dot products
(VNNI, AMX) the conv weights take 63 levels a side, not 127 (`int8_weight_max`),
and on such a CPU (AMD EPYC, AVX2 only) the shallow torso on 8 frames takes
~600 us in oneDNN's int8 against ~1,000 in fp32 (bf16 is emulated there: ~6,500),
and ~350 us in zrl's own AVX2 kernel, which Int8Torso uses there (`native_int8_layers`).
On CPUs with AVX-512 VNNI zrl's own VNNI kernel runs it: on 2 cores of an AMD EPYC
(Zen 4, 11-26) the torso on 8 frames ~155 us against ~337 in oneDNN's int8, act()
~198 us against ~397.
"""
from __future__ import annotations

import copy
import math

import numpy as np
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
    exact for any int8 weights): on the shallow CNN, 8 Pong frames, 2 cores of an AMD EPYC
    (Zen 4), the torso ~155 us against ~337 in oneDNN's VNNI kernels. Where it has AVX2 alone,
    only on CPUs without int8 dot products (AMD Zen 1-3, Intel before Ice Lake), whose weights
    take 63 levels (int8_weight_max) so its pairs of products fit int16: there it is about twice
    as fast as oneDNN (an AMD EPYC: the torso ~340-370 us against ~600-780). A CPU with AVX-VNNI
    but not AVX-512 (Intel Alder Lake) keeps oneDNN's kernels."""
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


class Int8Torso:
    """A torso of conv + ReLU pairs, then FC + ReLU (the shallow CNN), acting in int8 end to end.

    `Int8FirstConv` quantizes only the first conv's weights, and the later layers
    run in bf16. Here every layer is an int8 product: oneDNN's int8 convolutions
    write their activations straight as 8-bit integers (the ReLU fused; uint8
    between convs, int8 0..127 out of the last, so the FC can read it as int8),
    and the FC is one int8 matrix product (`torch._int_mm`, int32 accumulators,
    on CPUs with int8 dot products; oneDNN's int8 linear elsewhere) scaled back
    to float. No pass quantizes activations: each layer's output
    scale is fixed in advance, calibrated on the frames being acted on with a
    float pass layer by layer (its largest output x `margin` maps to the top of
    the 8-bit range; a larger output saturates there, it never wraps). That
    calibration runs whenever the weights change and every `recalibrate_every`
    calls besides. Each layer's largest output is a running maximum: with the
    same weights it never shrinks, and across a weights change the old one
    carries over at `carry` (0.9) of itself. So a batch that is darker than
    usual (an actor's first, on reset frames: three of the four stacked frames
    black) does not set scales that later frames overflow: calibrated on reset
    frames alone, the features' error on ordinary ones had been ~12%. The first
    `warmup` calls all calibrate, so the maxima start from more than one batch. Weights are quantized per output channel as in Int8FirstConv;
    the FC's in C++ (`_core.quantize_rows`, ~0.23 ms for Pong's 256 x 2,592 with
    AVX2) and relaid out to the convs' channels_last order.

    Measured on 2 cores (AVX-512 VNNI, Pong, 8 frames, one thread, alone): a bf16
    actor's act() ~195 us against ~265 with the int8 first conv and the rest in
    bf16. Each weights update costs ~0.8 ms (requantizing ~0.6, calibrating ~0.2); on the
    AVX2-only EPYC below, ~2.1 ms (the weights' copy into the model included).
    The features' error is ~2% of the largest (the int8 first conv with bf16:
    ~1.5%); on a partly trained Pong model the policy's KL from the fp32 one was
    at most 2e-5 over 240 frames. On an AVX2-only CPU (AMD EPYC, conv weights at
    63 levels a side, fp32 model) oneDNN's int8 torso on 8 frames takes ~600 us against
    ~1,000 in fp32 (convs ~420 us against ~670, the FC ~180 against ~220), the features'
    error ~2.4%. There every layer runs in zrl's own kernel instead (`native_int8_layers`,
    `_core.int8_layer`: 4 positions x 16 outputs per tile, vpmaddubsw on runs of 4 input
    bytes read in place, so the pixels need no relayout and no layer an im2col): ~350 us
    (the convs 160 + 62, the FC 62), the same arithmetic (the same quantized weights,
    scales and rounding; its calibration passes run in it too). On CPUs with AVX-512 VNNI
    its VNNI kernel (8 positions x 16 outputs per tile, vpdpbusd: exact, so the weights keep
    127 levels and the last conv's output 0..255) runs every layer instead of oneDNN: the
    torso ~155 us against ~337 there (AMD EPYC, Zen 4, 11-26). The recorded log mu(a|x) is this model's, so
    V-trace corrects for the difference as for any behaviour policy. Acting only;
    the learner never uses it.
    """

    @staticmethod
    def fits(torso: nn.Module) -> bool:
        """Whether `torso` is one this can run: convs that are (Conv2d, ReLU) pairs that
        Int8FirstConv fits, then an FC with a bias."""
        layers = list(getattr(torso, "convs", ()))
        if len(layers) < 2 or len(layers) % 2:
            return False
        pairs = zip(layers[::2], layers[1::2])
        return all(Int8FirstConv.fits(c) and isinstance(r, nn.ReLU) for c, r in pairs) and getattr(torso, "fc", None) is not None

    carry = 0.9  # the share of a layer's largest output kept across a weights change
    warmup = 8  # the first calls, which all calibrate

    def __init__(self, torso: nn.Module, margin: float = 1.25, recalibrate_every: int = 128):
        if not self.fits(torso):
            raise ValueError("Int8Torso: a torso of (Conv2d, ReLU) pairs and an FC")
        self._setup([c for c in torso.convs if isinstance(c, nn.Conv2d)], torso.fc, margin, recalibrate_every)

    def __deepcopy__(self, memo):
        # The layers, not the torso: a copied torso copies this while it is being built. The
        # copy is not yet quantized (oneDNN's packed weights cannot be copied).
        twin = Int8Torso.__new__(Int8Torso)
        twin._setup(copy.deepcopy(self.convs, memo), copy.deepcopy(self.fc, memo), self.margin, self.recalibrate_every)
        return twin

    def _setup(self, convs: list[nn.Conv2d], fc: nn.Linear, margin: float, recalibrate_every: int) -> None:
        self.convs = convs
        self.fc = fc
        self.margin = margin
        self.recalibrate_every = recalibrate_every
        self._geometry = [(list(c.stride), list(c.padding), list(c.dilation), c.groups) for c in self.convs]
        self._zero_points = [torch.zeros(c.out_channels, dtype=torch.int64) for c in self.convs]
        self._params = [p for m in (*self.convs, self.fc) for p in (m.weight, m.bias)]
        self._seen: tuple | None = None  # the parameters' (storage, version) when last quantized
        self._first: torch.Tensor | None = None  # the first conv's weights when last quantized
        self._packed: list[torch.Tensor] = []
        self._w_scales: list[torch.Tensor] = []
        self._x_scales: list[float] = []  # per conv: the scale of its input (pixels: 1/255)
        self._largest: list[float] = []  # per conv: its largest float output, a running maximum
        self._keep = 1.0  # the share of _largest the next calibration keeps (carry after a weights change)
        self._calls_ever = 0
        self.generation = 0  # how many times the weights were quantized (each change seen)
        # The FC's int8 product: torch._int_mm where the CPU has int8 dot products (measured
        # fastest there); oneDNN's int8 linear elsewhere (_int_mm is ~15x slower than it on AVX2).
        self._int_mm = int8_dot_products()
        self._fc_q: torch.Tensor | None = None  # int8 [K, hidden] (rows in channels_last order) or oneDNN's packing
        self._fc_zero_points = torch.zeros(fc.out_features, dtype=torch.int64)
        self._fc_w_scales: torch.Tensor | None = None  # float32 [hidden]
        self._fc_scales: torch.Tensor | None = None  # float32 [hidden]: weight scale x input scale
        self._fc_bias: torch.Tensor | None = None
        self._calls = 0
        # zrl's own AVX2 kernel (_core.int8_layer) for every layer, where the CPU has no int8 dot
        # products (oneDNN's pre-VNNI kernels are slower on these shapes) and the layers fit it.
        self._native = native_int8_layers() and self._native_fits()
        # The FC reads the last conv's output: 0..127 where the AVX2 kernel sums pairs of its
        # products in int16, 0..255 where the VNNI kernel sums them exactly (features' error on
        # Pong frames 1.9% -> 1.6% of their mean).
        self._fc_top = 255 if self._native and _core.int8_layer_kernels()[0] == "avx512_vnni" else 127
        self._plan: list[dict] | None = None  # native: per layer, its input runs (offs) and shapes
        self._bases: dict[int, list[np.ndarray]] = {}  # native: per batch size, each layer's base offsets

    def _native_fits(self) -> bool:
        """Whether _core.int8_layer can run every layer: convs without padding or dilation whose
        outputs are a multiple of 16 wide and whose inputs come in runs of 4 bytes (the first
        conv's kernel width on NCHW pixels, the later convs' input channels in NHWC), and an FC
        of a multiple of 16 outputs on a multiple of 4 inputs."""
        first, *rest = self.convs
        ok = first.kernel_size[1] % 4 == 0 and all(c.in_channels % 4 == 0 for c in rest)
        ok = ok and all(tuple(c.padding) == (0, 0) and tuple(c.dilation) == (1, 1) and c.out_channels % 16 == 0 for c in self.convs)
        return ok and self.fc.out_features % 16 == 0 and self.fc.in_features % 4 == 0

    def _make_plan(self, c: int, h: int, w: int) -> None:
        """Native: each conv's input runs (offs) and output shape, from the pixels' [C, H, W]."""
        plan = []
        for i, conv in enumerate(self.convs):
            kh, kw = conv.kernel_size
            sh, sw = conv.stride
            oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
            if i == 0:  # NCHW pixels: runs of 4 along the kernel's width
                ic, ky, kx = np.meshgrid(np.arange(c), np.arange(kh), np.arange(0, kw, 4), indexing="ij")
                offs = (ic * h * w + ky * w + kx).ravel()
            else:  # NHWC activations: runs of 4 input channels
                ky, kx, ic = np.meshgrid(np.arange(kh), np.arange(kw), np.arange(0, c, 4), indexing="ij")
                offs = ((ky * w + kx) * c + ic).ravel()
            plan.append({"in": (c, h, w), "out": (conv.out_channels, oh, ow), "stride": (sh, sw), "offs": offs.astype(np.int32)})
            c, h, w = conv.out_channels, oh, ow
        k = c * h * w
        plan.append({"in": (k,), "offs": np.arange(0, k, 4, dtype=np.int32)})
        self._plan = plan
        self._last_shape = (c, h, w)

    def _native_bases(self, n: int) -> list[np.ndarray]:
        """Native: each layer's base offsets for a batch of n (cached per n)."""
        bases = self._bases.get(n)
        if bases is None:
            bases = []
            for i, layer in enumerate(self._plan[:-1]):
                c, h, w = layer["in"]
                _, oh, ow = layer["out"]
                sh, sw = layer["stride"]
                nn_, oy, ox = np.meshgrid(np.arange(n), np.arange(oh), np.arange(ow), indexing="ij")
                if i == 0:
                    b = nn_ * (c * h * w) + oy * sh * w + ox * sw
                else:
                    b = ((nn_ * h + oy * sh) * w + ox * sw) * c
                bases.append(b.ravel().astype(np.int64))
            (k,) = self._plan[-1]["in"]
            bases.append(np.arange(n, dtype=np.int64) * k)
            self._bases[n] = bases
        return bases

    def _native_run(self, x: np.ndarray, calibrate: bool) -> np.ndarray:
        """Native: the torso on uint8 pixels [N, C, H, W]; with calibrate, first sets each layer's
        output scale from a float pass over x (as _calibrate does)."""
        n = x.shape[0]
        bases = self._native_bases(n)
        if calibrate:
            x = self._native_calibrate(x, bases)  # it runs the convs' int8 pass as it goes
        else:
            for base, (w, offs, scale, bias, inv, top) in zip(bases, self._native_args):
                out = np.empty((len(base), len(scale)), np.uint8)
                _core.int8_layer(x, base, w, offs, scale, bias, inv, top, out)
                x = out
        w, offs, scale, bias = self._native_fc
        y = np.empty((n, len(scale)), np.float32)
        _core.int8_layer(x.reshape(n, -1), bases[-1], w, offs, scale, bias, 1.0, 0, y)
        return y

    def _native_calibrate(self, x: np.ndarray, bases: list[np.ndarray]) -> np.ndarray:
        """Native: each layer's output scale from a float pass (its largest output x margin maps
        to the top of its 8-bit range), and the arguments of its int8 pass; returns the last
        conv's int8 output for x (each layer's int8 pass feeds the next one's calibration)."""
        self._x_scales = [1.0 / 255.0]
        self._native_args = []
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            w, offs = self._packed[i], self._plan[i]["offs"]
            scale = (self._w_scales[i] * self._x_scales[i]).numpy()
            bias = conv.bias.detach().float().numpy()
            top = 255 if i < last else self._fc_top
            y = np.empty((len(bases[i]), conv.out_channels), np.float32)
            _core.int8_layer(x, bases[i], w, offs, scale, bias, 1.0, 0, y)
            s = self._output_scale(i, float(y.max()), top)
            self._x_scales.append(s)
            self._native_args.append((w, offs, scale, bias, 1.0 / s, top))
            out = np.empty(y.shape, np.uint8)  # the next layer's input, as the int8 pass makes it
            _core.int8_layer(x, bases[i], w, offs, scale, bias, 1.0 / s, top, out)
            x = out
        self._fc_scales = self._fc_w_scales * self._x_scales[-1]
        self._native_fc = (self._fc_q, self._plan[-1]["offs"], self._fc_scales.numpy(), self._fc_bias.numpy())
        self._keep = 1.0
        return x

    def _changed(self) -> bool:
        """Whether the weights changed since they were quantized. Two checks, ~4 us: each
        parameter's storage and version counter (any in-place write through the parameter,
        load_state_dict's included), and the first conv's weights compared with a copy. The
        second is for writes into the flat buffer the parameters are views of (an actor
        applying the learner's weights), which do not reach the parameters' version counters;
        every learner update moves the first conv's weights with the rest."""
        return self._seen != tuple((p.data_ptr(), p._version) for p in self._params) or not torch.equal(self._first, self.convs[0].weight)

    def _quantize(self) -> None:
        self.generation += 1
        self._packed, self._w_scales = [], []
        for i, (conv, geometry) in enumerate(zip(self.convs, self._geometry)):
            q, scales = quantize_conv_weight(conv, "the CNN's")
            if self._native:  # [J, OC, 4], then in blocks of 16 outputs (int8_blocks)
                oc, ic, kh, kw = q.shape
                if i == 0:  # j over (ic, ky, kx / 4): runs of 4 along the kernel's width
                    w = q.reshape(oc, ic, kh, kw // 4, 4).permute(1, 2, 3, 0, 4)
                else:  # j over (ky, kx, ic / 4): runs of 4 channels
                    w = q.reshape(oc, ic // 4, 4, kh, kw).permute(3, 4, 1, 0, 2)
                self._packed.append(int8_blocks(w.reshape(-1, oc, 4).contiguous().numpy()))
            else:  # the input scale given here is not baked in: each call passes its own
                self._packed.append(torch.ops.onednn.qconv_prepack(q, scales, 1.0, 0, *geometry, None))
            self._w_scales.append(scales)
        c, h, w = self._last_shape
        fc = self.fc.weight.detach()
        rows = fc.shape[0]
        src = fc.contiguous()
        src = src.view(torch.int16) if src.dtype == torch.bfloat16 else src.float()
        q = torch.empty((rows, c, h, w), dtype=torch.int8)
        scales = torch.empty(rows, dtype=torch.float32)
        if not _core.quantize_rows(src.numpy(), q.view(rows, -1).numpy(), scales.numpy()):
            raise ValueError("the CNN's weights are not finite (the learner diverged?): cannot act")
        # The FC reads the last conv's output in channels_last order (h, w, c): its columns are
        # relaid out to match (once per weights update, not once per call), by numpy: its copy of
        # this int8 transpose takes about half of torch's (Pong's FC on AVX2: ~0.25 ms).
        cols = np.ascontiguousarray(q.numpy().transpose(0, 2, 3, 1)).reshape(rows, -1)  # [hidden, K]
        if self._native:
            # [hidden / 16, K / 4, 64] (int8_blocks): each block of 16 outputs' runs of 4 channels
            # at each (h, w), transposed as int32s.
            runs = cols.view(np.int32).reshape(rows // 16, 16, -1)
            self._fc_q = np.ascontiguousarray(runs.transpose(0, 2, 1)).view(np.int8).reshape(rows // 16, -1, 64)
        elif self._int_mm:
            self._fc_q = torch.from_numpy(cols).t()  # [K, hidden], the layout torch._int_mm reads fastest
        else:
            self._fc_q = torch.ops.onednn.qlinear_prepack(torch.from_numpy(cols), None)  # oneDNN's own layout of [hidden, K]
        self._fc_w_scales = scales
        self._fc_bias = self.fc.bias.detach().float()
        self._seen = tuple((p.data_ptr(), p._version) for p in self._params)
        self._first = self.convs[0].weight.detach().clone()

    def _output_scale(self, i: int, largest: float, top: float) -> float:
        """Layer i's output scale: its largest output (in a float pass here, or the running
        maximum, see the class) x margin maps to top."""
        if i < len(self._largest):
            largest = self._largest[i] = max(largest, self._keep * self._largest[i])
        else:
            self._largest.append(largest)
        return max(largest * self.margin, 1e-6) / top

    def _calibrate(self, x: torch.Tensor) -> None:
        """Activation scales from a float pass over x (the relaid-out uint8 frames)."""
        self._x_scales = [1.0 / 255.0]
        n = len(self.convs)
        for i, (packed, scales, zp, geometry) in enumerate(zip(self._packed, self._w_scales, self._zero_points, self._geometry)):
            y = torch.ops.onednn.qconv2d_pointwise(x, self._x_scales[i], 0, packed, scales, zp, self.convs[i].bias,
                                                   *geometry, 1.0, 0, torch.float32, "relu", [], "")
            top = 127.0 if i == n - 1 else 255.0
            s = self._output_scale(i, float(y.max()), top)
            self._x_scales.append(s)
            x = torch.round(y * (1.0 / s)).clamp_(0, top).to(torch.uint8)
        self._fc_scales = self._fc_w_scales * self._x_scales[-1]
        self._keep = 1.0

    @property
    def native(self) -> bool:
        """Whether every layer runs in zrl's own kernel (so `features` can be called)."""
        return self._native

    def _prepare(self, shape: tuple[int, ...]) -> bool:
        """Before a call on frames [N, *shape]: quantizes on the first call and after the
        weights changed; returns whether this call calibrates."""
        if self._seen is None:  # the first call: the layers' shapes
            if self._native:
                self._make_plan(*shape)
            else:
                h, w = shape[1:]
                for conv in self.convs:
                    h, w = ((size + 2 * p - d * (k - 1) - 1) // st + 1 for size, p, d, k, st in
                            zip((h, w), conv.padding, conv.dilation, conv.kernel_size, conv.stride))
                self._last_shape = (self.convs[-1].out_channels, h, w)
        fresh = self._seen is None or self._changed()
        if fresh:
            self._quantize()
            self._calls = 0
            self._keep = self.carry
        calibrate = fresh or self._calls % self.recalibrate_every == 0 or self._calls_ever < self.warmup
        self._calls += 1
        self._calls_ever += 1
        return calibrate

    def features(self, obs: np.ndarray) -> np.ndarray:
        """Native only (`native`): uint8 frames [N, C, H, W] (C-contiguous numpy) -> the torso's
        features, float32 [N, hidden] numpy, with no torch op on the way (an actor's act())."""
        if not self._native:
            raise RuntimeError("Int8Torso.features: only where every layer runs in zrl's kernel (native)")
        return self._native_run(obs, self._prepare(obs.shape[1:]))

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        """uint8 [N, C, H, W] -> the torso's features, in the FC's dtype."""
        calibrate = self._prepare(tuple(obs.shape[1:]))
        if self._native:
            return torch.from_numpy(self._native_run(obs.contiguous().numpy(), calibrate)).to(self.fc.weight.dtype)
        x = conv_input(obs, torch.uint8)
        if calibrate:
            self._calibrate(x)
        last = len(self.convs) - 1
        for i, (packed, scales, zp, geometry) in enumerate(zip(self._packed, self._w_scales, self._zero_points, self._geometry)):
            x = torch.ops.onednn.qconv2d_pointwise(x, self._x_scales[i], 0, packed, scales, zp, self.convs[i].bias,
                                                   *geometry, self._x_scales[i + 1], 0, torch.int8 if i == last else torch.uint8,
                                                   "relu", [], "")
        feats = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)
        if self._int_mm:
            acc = torch._int_mm(feats, self._fc_q)
            out = torch.addcmul(self._fc_bias, acc.to(torch.float32), self._fc_scales).relu_()
        else:
            # The features are 0..127, so their int8 bits read as uint8 are the same values, and a
            # pair of products (2 x 127 x 127) fits pre-VNNI kernels' int16 with 8-bit weights.
            out = torch.ops.onednn.qlinear_pointwise(feats.view(torch.uint8), self._x_scales[-1], 0, self._fc_q, self._fc_w_scales,
                                                     self._fc_zero_points, self._fc_bias, 1.0, 0, torch.float32, "relu", [], "")
        return out.to(self.fc.weight.dtype)


class _Torso(nn.Module):
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


class ImpalaDeep(_Torso):
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


def use_int8_torso(model: nn.Module) -> bool:
    """Makes the CNN torsos in `model` that `Int8Torso` fits act in int8 end to end; False (and
    nothing changed) where none fits, or this CPU and PyTorch lack native int8 convolutions."""
    if not int8_conv_supported():
        return False
    done = False
    for torso in model.modules():
        if isinstance(torso, _Torso) and Int8Torso.fits(torso):
            torso.int8_torso = Int8Torso(torso)
            done = True
    return done


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
