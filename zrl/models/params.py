"""A model's parameters as views of one flat buffer, so that weights travel between learner
and actors as a single contiguous array."""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["flatten_parameters"]


def flatten_parameters(model: nn.Module) -> torch.Tensor:
    """Moves every parameter into one contiguous buffer and returns it; the parameters
    become views of it. Publishing weights then reads the buffer without a copy of its
    own, and applying received weights is one copy into it. Call before making an
    optimiser (it keeps the same Parameter objects, only their storage changes)."""
    params = list(model.parameters())
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        offset = 0
        for p in params:
            n = p.numel()
            p.data = flat[offset : offset + n].view_as(p)
            offset += n
    return flat
