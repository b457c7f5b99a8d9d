"""`Int8Torso`: the shallow CNN torso acting in int8 end to end on the CPU (actor.int8_torso),
every layer an int8 product, in oneDNN's int8 kernels or zrl's own (`_core.int8_layer`), with
activation scales calibrated on the frames being acted on. Acting only: the learner never uses it.
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from zrl import _core
from zrl.models.cnn import CnnTorso, conv_input
from zrl.models.int8 import Int8FirstConv, int8_blocks, int8_conv_supported, int8_dot_products, native_int8_layers, quantize_conv_weight

__all__ = ["Int8Torso", "use_int8_torso"]


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
    `warmup` calls all calibrate, so the maxima start from more than one batch.
    Weights are quantized per output channel as in Int8FirstConv; the FC's in C++
    (`_core.quantize_rows`) and relaid out to the convs' channels_last order.

    The features' error is ~2% of the largest (the int8 first conv with bf16:
    ~1.5%); on a partly trained Pong model the policy's KL from the fp32 one was
    at most 2e-5 over 240 frames. Each weights update requantizes and recalibrates.
    Where `native_int8_layers` says so, every layer runs in zrl's own kernel
    (`_core.int8_layer`) instead of oneDNN's, with the same arithmetic (the same
    quantized weights, scales and rounding; its calibration passes run in it too):
    on CPUs without int8 dot products its AVX2 kernel (4 positions x 16 outputs per
    tile, vpmaddubsw on runs of 4 input bytes read in place, so the pixels need no
    relayout and no layer an im2col), on CPUs with AVX-512 VNNI its VNNI kernel (8
    positions x 16 outputs per tile, vpdpbusd: exact, so the weights keep 127 levels
    and the last conv's output 0..255). The recorded log mu(a|x) is this model's, so
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
        # fastest there); oneDNN's int8 linear elsewhere (_int_mm is far slower than it on AVX2).
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
        """Whether the weights changed since they were quantized. Two cheap checks: each
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
        # this int8 transpose is faster than torch's.
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


def use_int8_torso(model: nn.Module) -> bool:
    """Makes the CNN torsos in `model` that `Int8Torso` fits act in int8 end to end; False (and
    nothing changed) where none fits, or this CPU and PyTorch lack native int8 convolutions."""
    if not int8_conv_supported():
        return False
    done = False
    for torso in model.modules():
        if isinstance(torso, CnnTorso) and Int8Torso.fits(torso):
            torso.int8_torso = Int8Torso(torso)
            done = True
    return done
