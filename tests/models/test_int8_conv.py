"""actor.int8_first_conv: a CNN policy's first conv on uint8 pixels with int8 weights;
actor.int8_torso: the shallow CNN in int8 end to end (and the C++ weight quantizer under it);
and the actors' categorical draw in C++ (zrl._core.sample_categorical)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from zrl import _core, spaces
from zrl.actors import actor as actor_mod
from zrl.config import ConfigError, load_config
from zrl import algorithms
from zrl.models import cnn, flatten_parameters, int8, int8_torso
from helpers import ROOT

pytestmark = pytest.mark.timeout(60)

PONG_CONFIG = ROOT / "configs" / "pong_impala.yaml"
OBS = spaces.BoxSpec((4, 84, 84), "uint8", 0.0, 255.0)
ACTIONS = spaces.DiscreteSpec(6)
needs_int8 = pytest.mark.skipif(not int8.int8_conv_supported(), reason="no int8 convolution here (an x86 CPU with AVX2 or newer, and oneDNN)")


def pong_model(network="impala_shallow", dtype=torch.float32):
    cfg = load_config(PONG_CONFIG, [f"model.network={network}"])
    torch.manual_seed(0)
    return algorithms.get("impala")(cfg, OBS, ACTIONS).build_model().eval().to(dtype)


def frames(n, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (n, 4, 84, 84), dtype=np.uint8))


def test_uint8_relayout_is_the_permutation():
    src = np.random.default_rng(1).integers(0, 256, (3, 4, 7, 5), dtype=np.uint8)
    out = np.empty((3, 7, 5, 4), np.uint8)
    _core.pixels_to_channels_last(src, out)
    np.testing.assert_array_equal(out, src.transpose(0, 2, 3, 1))
    x = cnn.conv_input(torch.from_numpy(src), torch.uint8)
    assert x.shape == (3, 4, 7, 5) and x.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(x, torch.from_numpy(src))


@needs_int8
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_first_conv_matches_the_conv_up_to_weight_rounding(dtype):
    model = pong_model(dtype=dtype)
    conv = model.pi_torso.convs[0]
    x = frames(5)
    q = int8.Int8FirstConv(conv, relu=True)
    with torch.inference_mode():
        got = q(x)
        want = torch.relu(F.conv2d(x.float() / 255.0, conv.weight.float(), conv.bias.float(), conv.stride))
    assert got.dtype == dtype and got.shape == want.shape and got.is_contiguous(memory_format=torch.channels_last)
    assert (got >= 0).all()  # the ReLU is fused in
    # Weights rounded to 1/254 (1/126 without VNNI) of each channel's largest, and a bf16 output's own rounding.
    err = (got.float() - want).abs().max().item()
    assert err <= 0.02 * want.abs().max().item(), err
    assert err > 0  # the int8 weights, not the float conv


def test_the_weight_range_follows_the_cpus_int8_products(monkeypatch):
    # Pre-VNNI kernels (vpmaddubsw) sum pairs of uint8 x int8 products in saturating int16:
    # weights of at most 63 keep 2 x 255 x 63 below 32,767.
    for flags, top in ((frozenset({"avx2"}), 63), (frozenset({"avx2", "avx512_vnni"}), 127), (frozenset({"avx_vnni"}), 127),
                       (frozenset({"amx_int8"}), 127)):
        monkeypatch.setattr(int8, "cpu_flags", lambda f=flags: f)
        assert int8.int8_weight_max() == top and int8.int8_dot_products() is (top == 127)


def test_the_torso_runs_zrls_kernel_where_it_is_exact_for_the_weight_range(monkeypatch):
    # zrl's AVX-512 VNNI kernel is exact for any int8 weights: used wherever it runs. Its AVX2
    # kernel sums pairs in saturating int16, so only where weights take 63 levels (no int8 dot
    # products); a CPU with AVX-VNNI alone keeps oneDNN's kernels.
    for kernels, flags, native in (
        (["avx512_vnni", "avx2", "portable"], {"avx2", "avx512_vnni"}, True),
        (["avx2", "portable"], {"avx2"}, True),
        (["avx2", "portable"], {"avx2", "avx_vnni"}, False),
        (["portable"], set(), False),
    ):
        monkeypatch.setattr(int8._core, "int8_layer_kernels", lambda k=kernels: k)
        monkeypatch.setattr(int8, "cpu_flags", lambda f=frozenset(flags): f)
        assert int8.native_int8_layers() is native, (kernels, flags)


@needs_int8
@pytest.mark.parametrize("torso", [False, True])
def test_white_frames_do_not_saturate_the_int8_products(torso):
    # All pixels 255, the worst case for a pre-VNNI CPU's int16 pairs: the answer stays the float one's.
    model = pong_model()
    reference = copy.deepcopy(model)
    assert (int8_torso.use_int8_torso if torso else int8.use_int8_first_conv)(model)
    x = torch.full((3, 4, 84, 84), 255, dtype=torch.uint8)
    x[1, :, 20:60, 30:50] = 0  # and a dark patch, so the features differ between frames
    with torch.inference_mode():
        got, want = model.pi_torso(x), reference.pi_torso(x)
    err = (got - want).abs().max().item()
    assert err <= 0.05 * want.abs().max().item(), err


@needs_int8
def test_int8_first_conv_requantizes_when_the_weights_change():
    model = pong_model()
    flat = flatten_parameters(model)
    assert int8.use_int8_first_conv(model)
    q = model.pi_torso.int8_first_conv
    x = frames(3)
    with torch.inference_mode():
        before = model.policy(x)
        packed = q._packed
        again = model.policy(x)
        assert q._packed is packed and torch.equal(before, again)  # no change: no repack
        flat.mul_(1.5)  # what LearnerLink does to apply new weights: a copy into the flat buffer
        after = model.policy(x)
        assert q._packed is not packed
        model.pi_torso.int8_first_conv = None
        reference = model.policy(x)
    assert (after - reference).abs().max() <= 0.02 * reference.abs().max() + 1e-6


@needs_int8
def test_non_finite_first_conv_weights_raise_instead_of_acting_quietly():
    model = pong_model()
    assert int8.use_int8_first_conv(model)
    with torch.no_grad():
        model.pi_torso.convs[0].weight[3, 0, 0, 0] = float("nan")
    with torch.inference_mode(), pytest.raises(ValueError, match="first conv's weights are not finite"):
        model.policy(frames(2))


@needs_int8
def test_a_model_with_an_int8_conv_can_be_copied():
    model = pong_model()
    assert int8.use_int8_first_conv(model)
    x = frames(2)
    with torch.inference_mode():
        out = model.policy(x)  # quantizes: oneDNN's packed weights now sit on the torso
    twin = copy.deepcopy(model)
    q = twin.pi_torso.int8_first_conv
    assert q is not model.pi_torso.int8_first_conv and q.conv is twin.pi_torso.convs[0]
    with torch.inference_mode():
        assert torch.equal(twin.policy(x), out)


def test_the_probe_says_no_where_the_op_fails(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(int8.Int8FirstConv, "__call__", broken)
    assert int8._int8_conv_probe() is False


@needs_int8
@pytest.mark.parametrize("network", ["impala_shallow", "impala_deep"])
def test_the_int8_path_is_for_acting_only(network):
    model = pong_model(network)
    reference = copy.deepcopy(model)
    assert int8.use_int8_first_conv(model)
    # The deep ResNet's first conv is followed by a max-pool, not a ReLU: nothing to fuse.
    assert model.pi_torso.int8_first_conv.relu is (network == "impala_shallow")
    x = frames(4)
    with torch.inference_mode():
        acting, ref = model.policy(x), reference.policy(x)
    assert not torch.equal(acting, ref) and (acting - ref).abs().max() <= 0.02 * ref.abs().max() + 1e-6
    # With gradients on (the learner's loss) it is the float path, exactly.
    out, ref_out = model.policy(x), reference.policy(x)
    assert out.requires_grad and torch.equal(out, ref_out)


def test_use_int8_first_conv_leaves_mlps_alone():
    cfg = load_config(ROOT / "configs" / "cartpole_impala.yaml", [])
    algo = algorithms.get("impala")(cfg, spaces.BoxSpec((4,), "float32", -1.0, 1.0), spaces.DiscreteSpec(2))
    assert int8.use_int8_first_conv(algo.build_model()) is False


def test_int8_first_conv_setting(monkeypatch):
    with pytest.raises(ConfigError, match="actor.int8_first_conv"):
        load_config(PONG_CONFIG, ["actor.int8_first_conv=sometimes"])
    assert load_config(PONG_CONFIG, ["actor.int8_first_conv=true"]).actor.int8_first_conv is True
    assert load_config(PONG_CONFIG, []).actor.int8_first_conv == "auto"
    assert actor_mod.use_int8(False, pong_model()) is False
    monkeypatch.setattr(int8, "_INT8_CONV", False)  # a CPU (or PyTorch) without int8 convolutions
    with pytest.raises(ValueError, match="actor.int8_first_conv: true, but this is not an x86 CPU"):
        actor_mod.use_int8(True, pong_model())
    model = pong_model()
    assert actor_mod.use_int8("auto", model) is False and model.pi_torso.int8_first_conv is None


def test_int8_first_conv_true_on_an_mlp_says_it_does_nothing(monkeypatch, caplog):
    monkeypatch.setattr(int8, "_INT8_CONV", True)
    cfg = load_config(ROOT / "configs" / "cartpole_impala.yaml", [])
    model = algorithms.get("impala")(cfg, spaces.BoxSpec((4,), "float32", -1.0, 1.0), spaces.DiscreteSpec(2)).build_model()
    with caplog.at_level("WARNING", logger="zrl.actor"):
        assert actor_mod.use_int8(True, model) is False
    assert "no CNN first conv" in caplog.text


# -- the int8 torso


def test_quantize_rows_is_torchs_per_row_rounding():
    w = torch.randn(7, 53) * torch.linspace(0.01, 3.0, 7)[:, None]
    w[2] = 0.0  # an all-zero row: the scale's floor
    want_s = (w.abs().amax(1) / 127.0).clamp_min(1e-12)
    want = torch.round(w / want_s[:, None]).clamp(-127, 127).to(torch.int8)
    for src in (w, w.to(torch.bfloat16)):
        ref_s = (src.float().abs().amax(1) / 127.0).clamp_min(1e-12)
        ref = torch.round(src.float() / ref_s[:, None]).clamp(-127, 127).to(torch.int8)
        q, s = np.empty((7, 53), np.int8), np.empty(7, np.float32)
        arr = src.view(torch.int16).numpy() if src.dtype == torch.bfloat16 else src.numpy()
        assert _core.quantize_rows(arr, q, s) is True
        np.testing.assert_array_equal(q, ref.numpy())
        np.testing.assert_array_equal(s, ref_s.numpy())
    np.testing.assert_array_equal(np.abs(want.numpy()).max(1)[[0, 1, 3, 4, 5, 6]], 127)
    w[4, 9] = float("nan")
    assert _core.quantize_rows(w.numpy(), np.empty((7, 53), np.int8), np.empty(7, np.float32)) is False
    w[4, 9] = float("-inf")
    assert _core.quantize_rows(w.numpy(), np.empty((7, 53), np.int8), np.empty(7, np.float32)) is False
    with pytest.raises(ValueError, match="out must be"):
        _core.quantize_rows(np.zeros((2, 3), np.float32), np.empty((2, 4), np.int8), np.empty(2, np.float32))
    with pytest.raises(ValueError, match="src: expected float32"):
        _core.quantize_rows(np.zeros((2, 3), np.float64), np.empty((2, 3), np.int8), np.empty(2, np.float32))
    with pytest.raises(ValueError, match="src: expected float32"):  # bf16 bits in the other byte order
        _core.quantize_rows(np.zeros((2, 3), ">i2"), np.empty((2, 3), np.int8), np.empty(2, np.float32))


@needs_int8
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,n", [((4, 84, 84), 8), ((4, 84, 84), 1), ((3, 36, 36), 5), ((1, 45, 37), 3)])
# The layers as zrl's own kernel (AVX-512 VNNI, or AVX2 CPUs without int8 dot products), or oneDNN's
# convolutions with the FC as torch._int_mm (VNNI CPUs) or oneDNN's int8 linear.
@pytest.mark.parametrize("kernels", ["native", "int_mm", "onednn"])
def test_int8_torso_matches_the_float_torso(dtype, shape, n, kernels, monkeypatch):
    torch.manual_seed(1)
    model = cnn.ImpalaShallow(shape).eval()
    x = torch.from_numpy(np.random.default_rng(2).integers(0, 256, (n, *shape), dtype=np.uint8))
    with torch.inference_mode():
        want = model(x)
    model.to(dtype)
    assert int8_torso.Int8Torso.fits(model)
    if kernels == "native" and _core.int8_layer_kernels()[0] != "avx512_vnni":
        monkeypatch.setattr(int8, "int8_weight_max", lambda: 63)  # the range zrl's AVX2 kernel takes
    model.int8_torso = int8_torso.Int8Torso(model)
    # Before its first call, which quantizes for those kernels.
    model.int8_torso._native = kernels == "native"
    model.int8_torso._int_mm = kernels == "int_mm"
    with torch.inference_mode():
        got = model(x)
    assert got.dtype == dtype and got.shape == want.shape and (got >= 0).all()
    # Weights per channel and activations per layer in 8 bits: ~2% of the largest feature.
    err = (got.float() - want).abs().max().item()
    assert 0 < err <= 0.05 * want.abs().max().item(), err


def test_the_int8_layer_kernel_is_a_convolution_and_checks_its_arguments():
    # Pong's first conv (8x8 stride 4 on 4 x 84 x 84 pixels) through _core.int8_layer as Int8Torso
    # lays it out, in float (the exact integer sums, then scale and bias) against PyTorch's conv.
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (3, 4, 84, 84), dtype=np.uint8)
    q = torch.from_numpy(rng.integers(-63, 64, (16, 4, 8, 8), dtype=np.int8))
    runs = q.reshape(16, 4, 8, 2, 4).permute(1, 2, 3, 0, 4).reshape(-1, 16, 4).contiguous().numpy()  # [J, OC, 4]
    packed = int8.int8_blocks(runs)  # [OC / 16, J, 64]
    assert packed.shape == (1, 64, 64) and (packed[0, 5, 4 * 3:4 * 3 + 4] == runs[5, 3]).all()
    ic, ky, kx = np.meshgrid(np.arange(4), np.arange(8), np.arange(0, 8, 4), indexing="ij")
    offs = (ic * 84 * 84 + ky * 84 + kx).ravel().astype(np.int32)
    n, oy, ox = np.meshgrid(np.arange(3), np.arange(20), np.arange(20), indexing="ij")
    base = (n * 4 * 84 * 84 + oy * 4 * 84 + ox * 4).ravel().astype(np.int64)
    scale = np.full(16, 0.5, np.float32)
    bias = np.linspace(-3, 3, 16).astype(np.float32)
    want = F.conv2d(torch.from_numpy(x).double(), q.double(), stride=4).permute(0, 2, 3, 1).reshape(-1, 16)
    want = (want * 0.5 + torch.from_numpy(bias).double()).clamp_min(0)
    assert _core.int8_layer_kernels()[-1] == "portable"
    for kernel in ["auto", *_core.int8_layer_kernels()]:
        out = np.empty((len(base), 16), np.float32)
        _core.int8_layer(x, base, packed, offs, scale, bias, 1.0, 0, out, kernel=kernel)
        np.testing.assert_allclose(out, want.numpy(), rtol=1e-6, atol=1e-5)
        u8 = np.empty((len(base), 16), np.uint8)
        _core.int8_layer(x, base, packed, offs, scale, bias, 1 / 64, 255, u8, kernel=kernel)
        np.testing.assert_array_equal(u8, np.clip(np.rint(out / 64), 0, 255).astype(np.uint8))
    with pytest.raises(ValueError, match="kernel must be"):
        _core.int8_layer(x, base, packed, offs, scale, bias, 1.0, 0, out, kernel="sse9")
    for kernel in {"avx512_vnni", "avx2"} - set(_core.int8_layer_kernels()):
        with pytest.raises(ValueError, match="does not run on this CPU"):
            _core.int8_layer(x, base, packed, offs, scale, bias, 1.0, 0, out, kernel=kernel)
    with pytest.raises(ValueError, match="reach outside x"):
        _core.int8_layer(x, base + 1, packed, offs, scale, bias, 1.0, 0, out)
    with pytest.raises(ValueError, match="out must be"):
        _core.int8_layer(x, base, packed, offs, scale, bias, 1.0, 0, np.empty((len(base), 32), np.float32))
    with pytest.raises(ValueError, match="multiple of 16"):
        int8.int8_blocks(runs[:, :8])
    with pytest.raises(ValueError, match=r"expected w \[OC / 16, J, 64\]"):
        _core.int8_layer(x, base, runs, offs, scale, bias, 1.0, 0, out)  # not in blocks
    with pytest.raises(ValueError, match="scale and bias"):
        _core.int8_layer(x, base, np.concatenate([packed, packed]), offs, scale, bias, 1.0, 0, out)
    # base + offs past int64: the check used to wrap and let the kernel read anywhere.
    one = np.empty((1, 16), np.float32)
    for b, o in ((np.iinfo(np.int64).max - 2, 0), (np.iinfo(np.int64).min, -1)):
        with pytest.raises(ValueError, match="reach outside x"):
            _core.int8_layer(x, np.array([b], np.int64), packed[:, :1].copy(), np.array([o], np.int32), scale, bias, 1.0, 0, one)
    # More than 16,579 runs of 4 could overflow the int32 sums of 255 x 127 products.
    J = 16580
    with pytest.raises(ValueError, match="int32 sums"):
        _core.int8_layer(np.zeros(4 * J, np.uint8), np.zeros(1, np.int64), np.zeros((1, J, 64), np.int8),
                         np.arange(0, 4 * J, 4, dtype=np.int32), scale, bias, 1.0, 0, one)
    # The dtype, not the dtype object: np.longlong is int64 (and an unpickled array's dtype is a copy).
    out2 = np.empty((len(base), 16), np.float32)
    _core.int8_layer(x, base.astype(np.longlong), packed, offs, scale, bias, 1.0, 0, out2)
    np.testing.assert_allclose(out2, want.numpy(), rtol=1e-6, atol=1e-5)


@pytest.mark.skipif("avx512_vnni" not in _core.int8_layer_kernels(), reason="needs a CPU with AVX-512 VNNI")
def test_the_vnni_kernel_is_exact_for_the_whole_int8_range():
    # Bright pixels and weights of +-127: pairs of products past int16, which the AVX2 kernel
    # saturates; the VNNI kernel sums them in int32 like the portable loop.
    rng = np.random.default_rng(6)
    P, J, OC = 21, 40, 32  # 21 positions: two whole tiles of 8 and a short one
    x = rng.integers(200, 256, 4 * J * P, dtype=np.uint8)
    base = np.arange(P, dtype=np.int64) * 4 * J
    offs = np.arange(0, 4 * J, 4, dtype=np.int32)
    w = rng.choice(np.array([-128, -127, 127], np.int8), (J, OC, 4))
    scale, bias = np.ones(OC, np.float32), np.full(OC, 2.0**23, np.float32)
    want = (x.reshape(P, 4 * J).astype(np.int64) @ w.transpose(0, 2, 1).reshape(4 * J, OC).astype(np.int64)) + 2**23
    assert 0 < want.min() and want.max() < 2**24  # positive (the ReLU leaves it) and exact in float32
    got = {}
    for kernel in ("avx512_vnni", "portable", "avx2"):
        got[kernel] = np.empty((P, OC), np.float32)
        _core.int8_layer(x, base, int8.int8_blocks(w), offs, scale, bias, 1.0, 0, got[kernel], kernel=kernel)
    np.testing.assert_array_equal(got["avx512_vnni"], want.astype(np.float32))
    np.testing.assert_array_equal(got["portable"], want.astype(np.float32))
    assert not np.array_equal(got["avx2"], want.astype(np.float32))  # (why the AVX2 kernel takes weights of 63)


@needs_int8
def test_int8_torso_acts_like_the_float_policy():
    model = pong_model(dtype=torch.bfloat16)
    reference = pong_model()
    assert int8_torso.use_int8_torso(model) and model.pi_torso.int8_torso is not None
    x = frames(16, seed=3)
    with torch.inference_mode():
        p = torch.log_softmax(model.policy_float(x), -1)
        q = torch.log_softmax(reference.policy_float(x), -1)
    kl = (q.exp() * (q - p)).sum(-1)
    assert kl.max() < 1e-3, kl


@needs_int8
def test_an_int8_actors_act_runs_without_torch_and_follows_the_weights(monkeypatch):
    # ImpalaPolicy.act with a native Int8Torso: the torso's features and the head in numpy
    # (ActorCritic.int8_logits), the same policy as the torch path, and the head's fp32 copy
    # renewed whenever the weights change (through the parameters or the flat buffer).
    from zrl.algorithms.impala.algorithm import ImpalaEvalPolicy, ImpalaPolicy

    model = pong_model(dtype=torch.bfloat16)
    if _core.int8_layer_kernels()[0] != "avx512_vnni":
        monkeypatch.setattr(int8, "int8_weight_max", lambda: 63)  # the range zrl's AVX2 kernel takes
    model.pi_torso.int8_torso = int8_torso.Int8Torso(model.pi_torso)
    model.pi_torso.int8_torso._native = True  # zrl's kernel wherever the test runs
    flat = flatten_parameters(model)
    with torch.no_grad():
        model.head.linear.weight.normal_(0, 0.05)  # (the orthogonal init's 0.01 leaves logits near 0)
    x = frames(16, seed=3)
    with torch.inference_mode():
        want = torch.log_softmax(model.policy_float(x), -1).numpy()
    logits = model.int8_logits(x.numpy())
    assert logits.dtype == np.float32 and logits.shape == (16, 6)
    got = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    kl = (np.exp(want) * (want - got)).sum(-1)
    assert kl.max() < 1e-3, kl  # each call calibrates anew (warm-up): the two paths' scales differ a little

    greedy, extras = ImpalaEvalPolicy(model, greedy=True).act(x.numpy())  # evaluation: the mode, nothing recorded
    with torch.inference_mode():
        np.testing.assert_array_equal(greedy, model.policy_float(x).argmax(-1).numpy())
    assert extras == {}
    policy = ImpalaPolicy(model)
    monkeypatch.setattr(model, "policy_float", lambda obs: pytest.fail("act() took the torch path"))
    torch.manual_seed(1)
    a1, e1 = policy.act(x.numpy())
    torch.manual_seed(1)
    a2, e2 = policy.act(x.numpy())
    np.testing.assert_array_equal(a1, a2)  # the uniforms come from torch's generator
    assert a1.dtype == np.int64 and e1["behaviour_logp"].dtype == np.float32 and (e1["behaviour_logp"] <= 0).all()

    def head(feats):
        w, b = model.head.linear.weight.detach().float().numpy(), model.head.linear.bias.detach().float().numpy()
        return feats @ w.T + b

    with torch.no_grad():
        model.head.linear.bias[2] += 3.0  # in place through the parameter
    feats = model.pi_torso.int8_torso.features(x.numpy())
    np.testing.assert_allclose(model.int8_logits(x.numpy()), head(feats), rtol=1e-4, atol=1e-4)
    generation = model.pi_torso.int8_torso.generation
    flat.mul_(1.5)  # what LearnerLink does to apply new weights: a copy into the flat buffer
    logits = model.int8_logits(x.numpy())
    assert model.pi_torso.int8_torso.generation == generation + 1  # requantized, and the head copied again
    np.testing.assert_allclose(logits, head(model.pi_torso.int8_torso.features(x.numpy())), rtol=1e-3, atol=1e-3)
    assert model.int8_logits(x.numpy().astype(np.float32)) is None  # not uint8 frames: the torch path


def int8_pong(warmup: int):
    """Pong's policy with its int8 torso (calibrating on each of its first `warmup` calls): the
    model, its flat parameter buffer (as LearnerLink writes weights) and the torso."""
    model = pong_model()
    flat = flatten_parameters(model)
    assert int8_torso.use_int8_torso(model)
    q = model.pi_torso.int8_torso
    q.warmup = warmup
    return model, flat, q


@needs_int8
def test_int8_torso_requantizes_when_the_weights_change_and_recalibrates():
    model, flat, q = int8_pong(warmup=0)  # (calibrating on every one of the first calls is a test below)
    q.recalibrate_every = 2
    x, y = frames(4), frames(4, seed=9)
    with torch.inference_mode():
        before = model.policy(x)
        packed, fc, scales = q._packed, q._fc_q, q._x_scales
        assert torch.equal(model.policy(x), before) and q._packed is packed and q._fc_q is fc  # nothing changed
        assert q._x_scales is scales
        model.policy(y)  # two calls since calibrating: recalibrated, on y
        assert q._x_scales is not scales and q._packed is packed
        flat.mul_(1.5)  # what LearnerLink does to apply new weights: a copy into the flat buffer
        scales = q._x_scales
        after = model.policy(x)  # new weights: requantized and recalibrated at once
        assert q._packed is not packed and q._fc_q is not fc and q._x_scales[1] > scales[1]
        feats = model.pi_torso(x)
        model.pi_torso.int8_torso = None
        reference = model.pi_torso(x)
        ref_policy = model.policy(x)
    assert (feats - reference).abs().max() <= 0.05 * reference.abs().max()
    assert torch.allclose(torch.softmax(after, -1), torch.softmax(ref_policy, -1), atol=1e-3)


def reset_frames(n, seed=0):
    """What an actor's first batch looks like: of the 4 stacked frames only the newest is not black."""
    x = frames(n, seed).clone()
    x[:, :3] = 0
    return x


@needs_int8
@pytest.mark.parametrize("warmup", [8, 0])
def test_a_dark_first_batch_does_not_set_the_scales_for_later_ones(warmup):
    model, _, q = int8_pong(warmup)
    dark, bright = reset_frames(4), frames(4, seed=3)
    with torch.inference_mode():
        model.pi_torso(dark)  # quantizes and calibrates on black stacks
        if not warmup:  # the next calibration is a periodic one: the maxima only grow
            q.recalibrate_every = 1
            model.pi_torso(bright)
            scales = list(q._x_scales)
            model.pi_torso(dark)
            assert q._x_scales == scales  # a darker batch, the same weights: the scales stay
        got = model.pi_torso(bright)
        model.pi_torso.int8_torso = None
        want = model.pi_torso(bright)
    assert (got - want).abs().max() <= 0.05 * want.abs().max()


@needs_int8
def test_int8_torso_carries_its_maxima_across_a_weights_change():
    model, flat, q = int8_pong(warmup=0)
    with torch.inference_mode():
        model.pi_torso(frames(4, seed=3))
        largest = list(q._largest)
        flat.mul_(1.0001)  # new weights, nearly the same
        model.pi_torso(reset_frames(4))  # recalibrated at once, on a dark batch
    assert all(np.isclose(now, q.carry * before, rtol=1e-6) or now > q.carry * before for now, before in zip(q._largest, largest))
    assert q._largest[0] < largest[0]  # the old maximum decays: it does not hold for good


@needs_int8
def test_int8_torso_saturates_instead_of_wrapping():
    model, _, _ = int8_pong(warmup=0)  # no second calibration
    with torch.inference_mode():
        model.policy(torch.zeros(2, 4, 84, 84, dtype=torch.uint8))  # calibrated on black frames: tiny scales
        feats = model.pi_torso(frames(3))
        model.pi_torso.int8_torso = None
        reference = model.pi_torso(frames(3))
    # Every activation is clipped to the top of its range, never wrapped to a negative int8.
    assert torch.isfinite(feats).all() and (feats >= 0).all()
    assert feats.max() < reference.max()


@needs_int8
def test_int8_torso_fits_the_shallow_cnn_only_and_acts_only():
    deep = pong_model("impala_deep")
    assert not int8_torso.Int8Torso.fits(deep.pi_torso) and int8_torso.use_int8_torso(deep) is False
    model = pong_model()
    reference = copy.deepcopy(model)
    assert int8_torso.use_int8_torso(model)
    x = frames(2)
    out, ref = model.policy(x), reference.policy(x)  # gradients on: the float path, exactly
    assert out.requires_grad and torch.equal(out, ref)
    with torch.inference_mode():
        acting = model.policy(x)
    twin = copy.deepcopy(model)
    assert twin.pi_torso.int8_torso is not model.pi_torso.int8_torso and twin.pi_torso.int8_torso.fc is twin.pi_torso.fc
    assert twin.pi_torso.int8_torso.convs[1] is twin.pi_torso.convs[2]
    with torch.inference_mode():
        assert torch.equal(twin.policy(x), acting)


@needs_int8
def test_non_finite_weights_raise_in_the_int8_torso():
    model = pong_model()
    assert int8_torso.use_int8_torso(model)
    with torch.no_grad():
        model.pi_torso.fc.weight[5, 7] = float("inf")
    with torch.inference_mode(), pytest.raises(ValueError, match="weights are not finite"):
        model.policy(frames(2))


def test_int8_torso_setting(monkeypatch, caplog):
    with pytest.raises(ConfigError, match="actor.int8_torso"):
        load_config(PONG_CONFIG, ["actor.int8_torso=sometimes"])
    assert load_config(PONG_CONFIG, []).actor.int8_torso == "auto"
    monkeypatch.setattr(int8, "_INT8_CONV", False)  # a CPU (or PyTorch) without int8 convolutions
    with pytest.raises(ValueError, match="actor.int8_torso: true, but this is not an x86 CPU"):
        actor_mod.use_int8(True, pong_model(), torso=True)
    assert actor_mod.use_int8("auto", pong_model(), torso=True) is False
    monkeypatch.setattr(int8, "_INT8_CONV", True)
    with caplog.at_level("WARNING", logger="zrl.actor"):
        assert actor_mod.use_int8(True, pong_model("impala_deep"), torso=True) is False
    assert "no shallow CNN torso" in caplog.text


# -- the categorical draw


def test_sample_categorical_is_the_inverse_cdf():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    n = 10_000
    u = (np.arange(n) + 0.5) / n  # an even grid: each action gets exactly its share
    logits = np.tile(np.log(p).astype(np.float32) + 3.0, (n, 1))
    actions, logp = _core.sample_categorical(logits, u)
    assert actions.dtype == np.int64 and logp.dtype == np.float32
    np.testing.assert_array_equal(np.bincount(actions, minlength=4), (p * n).round().astype(int))
    np.testing.assert_allclose(logp, np.log(p)[actions], rtol=1e-5)


def test_the_policy_head_samples_from_the_softmax():
    head = pong_model().head
    params = torch.tensor([[0.0, 1.0, -1.0, 2.0, 0.5, -3.0]]).repeat(60_000, 1)
    torch.manual_seed(3)
    actions, logp = head.sample_with_log_prob(params)
    freq = np.bincount(actions, minlength=6) / len(actions)
    want = torch.softmax(params[0], -1).numpy()
    assert np.abs(freq - want).max() < 0.01  # 60k draws: std of each share < 0.002
    np.testing.assert_allclose(logp, torch.log_softmax(params, -1).gather(-1, torch.from_numpy(actions)[:, None])[:, 0].numpy(), rtol=1e-5, atol=1e-6)
    torch.manual_seed(3)
    again, _ = head.sample_with_log_prob(params)
    np.testing.assert_array_equal(actions, again)  # torch.manual_seed fixes the draws


@pytest.mark.parametrize(
    "logits, u, match",
    [
        (np.zeros((2, 3), np.float64), np.zeros(2), "logits: expected dtype float32"),
        (np.zeros((2, 3), np.float32), np.zeros(3), "u: expected 2 draws"),
        (np.zeros((2, 3), np.float32), np.zeros(2, np.float32), "u: expected a float64"),
        (np.array([[0.0, 1.0], [np.nan, 0.0]], np.float32), np.zeros(2), "row 1 has a NaN"),
        (np.full((1, 2), -np.inf, np.float32), np.zeros(1), "row 0"),
        (np.zeros((2, 0), np.float32), np.zeros(2), "at least one action"),
        (np.zeros((2, 3), np.float32), np.array([0.5, 1.0]), r"u: draws must be in \[0, 1\)"),
        (np.zeros((1, 3), np.float32), np.array([np.nan]), r"u: draws must be in \[0, 1\)"),
        (np.frombuffer(bytearray(1 + 24), np.float32, 6, 1).reshape(2, 3), np.zeros(2), "logits: array is not aligned"),
        (np.zeros((2, 3), np.float32), np.frombuffer(bytearray(1 + 16), np.float64, 2, 1), "u: array is not aligned"),
    ],
    ids=["logits-dtype", "u-count", "u-dtype", "nan", "all-masked", "no-actions", "u-one", "u-nan", "logits-misaligned", "u-misaligned"],
)
def test_sample_categorical_refuses_what_it_cannot_draw_from(logits, u, match):
    with pytest.raises(ValueError, match=match):
        _core.sample_categorical(logits, u)
