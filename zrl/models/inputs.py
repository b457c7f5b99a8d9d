"""How observations enter a model: in their wire dtype, turned into the model's dtype on its
device (uint8 images scaled to [0, 1]). The CNN torsos' own first-conv input path is
`zrl.models.cnn.conv_input`."""
from __future__ import annotations

import torch

__all__ = ["preprocess"]


def preprocess(obs: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Observations arrive in their wire dtype; uint8 images are scaled to [0, 1] here, on the
    model's device, in the model's dtype (float32, or bfloat16 for a bf16 actor)."""
    if obs.dtype == torch.uint8:
        return obs.to(dtype).mul_(1.0 / 255.0)
    return obs.to(dtype)
