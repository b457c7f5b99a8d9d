"""HostWeights: the learner's weights on the host for publishing, without a blocking copy."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from zrl.learner.learner import HostWeights

pytestmark = pytest.mark.timeout(60)


def test_cpu_weights_are_ready_at_once_and_are_the_buffer():
    flat = torch.arange(6, dtype=torch.float32)
    hw = HostWeights(flat)
    assert hw.ready() is None  # nothing started
    hw.start(3)
    version, params = hw.ready()
    assert version == 3 and params.dtype == np.float32
    np.testing.assert_array_equal(params, np.arange(6, dtype=np.float32))
    assert np.shares_memory(params, flat.numpy())  # no copy on CPU
    assert hw.ready() is None  # handed over once
    flat.add_(1.0)
    hw.start(4)
    version, params = hw.ready()
    assert version == 4 and params[0] == 1.0


def test_cpu_bf16_weights_are_published_as_float32():
    flat = torch.tensor([0.5, -2.0, 3.0], dtype=torch.bfloat16)
    hw = HostWeights(flat)
    hw.start(1)
    _, params = hw.ready()
    assert params.dtype == np.float32
    np.testing.assert_array_equal(params, [0.5, -2.0, 3.0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_copy_lands_in_stream_order_and_skips_while_in_flight():
    flat = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    hw = HostWeights(flat)
    hw.start(1)
    flat.add_(1.0)  # queued after the copy: the copy must not see it
    hw.start(2)  # a copy is in flight: skipped, version 1 stays the one pending
    torch.cuda.synchronize()
    version, params = hw.ready()
    assert version == 1
    np.testing.assert_array_equal(params[:4], [0.0, 1.0, 2.0, 3.0])
    assert hw.ready() is None
    hw.start(3)
    torch.cuda.synchronize()
    version, params = hw.ready()
    assert version == 3 and params[0] == 1.0
