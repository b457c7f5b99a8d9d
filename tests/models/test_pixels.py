"""The C++ relayout of uint8 image batches into channels_last float32/bfloat16 (zrl._core) and its face in the CNN."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from zrl import _core
from zrl.models.cnn import conv_input

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_input_is_the_cast_in_channels_last(channels, dtype):
    obs = torch.randint(0, 256, (3, channels, 9, 7), dtype=torch.uint8)
    obs[0, 0, 0, 0], obs[0, -1, -1, -1] = 0, 255  # both ends of the range
    x = conv_input(obs, dtype)
    assert x.dtype == dtype and x.shape == obs.shape
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(x, obs.to(dtype))  # exact: 0..255 are exact in bfloat16 too


def test_conv_input_of_a_non_contiguous_batch():
    big = torch.randint(0, 256, (6, 4, 10, 10), dtype=torch.uint8)
    obs = big[::2]  # every other frame stack: not contiguous
    assert torch.equal(conv_input(obs, torch.bfloat16), obs.to(torch.bfloat16))


def test_conv_input_of_an_empty_batch_a_channels_last_batch_and_under_inference_mode():
    empty = torch.zeros((0, 4, 84, 84), dtype=torch.uint8)
    assert conv_input(empty, torch.float32).shape == (0, 4, 84, 84)
    obs = torch.randint(0, 256, (2, 4, 6, 6), dtype=torch.uint8)
    assert torch.equal(conv_input(obs.contiguous(memory_format=torch.channels_last), torch.float32), obs.float())
    with torch.inference_mode():  # how actors and the agent server call the model
        x = conv_input(torch.from_numpy(obs.numpy()), torch.bfloat16)
    assert torch.equal(x, obs.to(torch.bfloat16)) and x.is_contiguous(memory_format=torch.channels_last)


def test_conv_input_leaves_other_dtypes_to_torch():
    obs = torch.randint(0, 256, (2, 4, 5, 5), dtype=torch.uint8)
    x = conv_input(obs, torch.float16)
    assert x.dtype == torch.float16 and x.is_contiguous() and torch.equal(x, obs.to(torch.float16))
    flat = torch.randint(0, 256, (2, 16), dtype=torch.uint8)  # not an image batch
    assert torch.equal(conv_input(flat, torch.float32), flat.float())
    floats = torch.rand(2, 4, 5, 5)  # not uint8
    assert torch.equal(conv_input(floats, torch.bfloat16), floats.to(torch.bfloat16))


def test_kernel_writes_bfloat16_bits_into_2_byte_ints():
    src = np.arange(256, dtype=np.uint8).reshape(1, 1, 16, 16)
    out = np.empty((1, 16, 16, 1), np.uint16)
    _core.pixels_to_channels_last(src, out)
    as_float = (out.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(as_float.ravel(), np.arange(256, dtype=np.float32))


@pytest.mark.parametrize(
    "src, out, match",
    [
        (np.zeros((1, 4, 3, 3), np.float32), np.zeros((1, 3, 3, 4), np.float32), "src: expected dtype uint8"),
        (np.zeros((1, 4, 3, 3), np.uint8), np.zeros((1, 4, 3, 3), np.float32), r"out: expected shape \(1, 3, 3, 4\)"),
        (np.zeros((4, 3, 3), np.uint8), np.zeros((3, 3, 4), np.float32), "expected 4 dimensions"),
        (np.zeros((1, 4, 3, 3), np.uint8), np.zeros((1, 3, 3, 4), np.float64), "out: expected float32, uint8, or int16/uint16"),
        (np.zeros((1, 4, 3, 3), np.uint8), np.zeros((1, 3, 3, 8), np.float32)[..., ::2], "out: expected a C-contiguous"),
        (np.zeros((1, 3, 4, 3), np.uint8).transpose(0, 2, 1, 3), np.zeros((1, 3, 3, 4), np.float32), "src: expected a C-contiguous"),
        (np.zeros((1, 4, 3, 3), np.uint8), np.frombuffer(bytearray(1 + 36 * 4), np.float32, 36, 1).reshape(1, 3, 3, 4), "out: array is not aligned"),
        (np.zeros((1, 4, 3, 3), np.uint8), [0.0], "numpy arrays"),
    ],
    ids=["src-dtype", "out-shape", "ndim", "out-dtype", "out-strides", "src-strides", "out-misaligned", "not-array"],
)
def test_kernel_refuses_what_it_cannot_write(src, out, match):
    with pytest.raises(ValueError, match=match):
        _core.pixels_to_channels_last(src, out)


def test_kernel_refuses_a_read_only_output():
    out = np.zeros((1, 3, 3, 4), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _core.pixels_to_channels_last(np.zeros((1, 4, 3, 3), np.uint8), out)
