"""Running mean and variance (`RunningMeanStd`): observation normalisation inside a model
(`model.normalize_obs`) and return normalisation in a learner (`algo.normalize_returns`).

The statistics are parameters that take no gradient: inside a model they are part
of its flat buffer, so they travel with the weights actors receive and with every
checkpoint. Only the learner updates them, merging the moments of each batch it
trains on, or those an actor computed on its rollout (A3C's learner sees no
observations), with Chan et al.'s parallel update, after the update, so a
synchronous update sees the statistics its actors acted with.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["RunningMeanStd"]


class RunningMeanStd(nn.Module):
    """Per-element running mean and variance of a stream of [N, *shape] batches."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.mean = nn.Parameter(torch.zeros(shape), requires_grad=False)
        self.var = nn.Parameter(torch.ones(shape), requires_grad=False)
        # A float count: the flat weight buffer is one float32 tensor (exact to 2**24 batches'
        # worth of rows; beyond that the statistics barely move anyway).
        self.count = nn.Parameter(torch.zeros(()), requires_grad=False)
        self.clip = clip
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x standardised, clipped to [-clip, clip], in x's dtype."""
        mean, var = self.mean.to(x.dtype), self.var.to(x.dtype)
        return ((x - mean) / torch.sqrt(var + self.eps)).clamp(-self.clip, self.clip)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sqrt(self.var + self.eps) + self.mean

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        """Merges the moments of `batch` ([N, *shape], any float dtype) into the statistics."""
        x = batch.detach().reshape(-1, *self.mean.shape).to(self.mean.device, torch.float64)
        if x.shape[0] == 0:
            return
        self.merge(x.shape[0], x.mean(0), x.var(0, correction=0))

    @torch.no_grad()
    def merge(self, n, mean: torch.Tensor, var: torch.Tensor) -> None:
        """Merges the moments of n more rows (their mean and population variance; n an int or
        a tensor) into the statistics: an actor's per-chunk moments, or a batch's."""
        b_mean = mean.to(self.mean.device, torch.float64)
        b_var = var.to(self.mean.device, torch.float64)
        n = torch.as_tensor(n, dtype=torch.float64, device=self.mean.device)
        count = self.count.double()  # (a tensor: a learner on a GPU reads nothing back here)
        total = count + n
        delta = b_mean - self.mean.double()
        mean = self.mean.double() + delta * (n / total)
        m2 = self.var.double() * count + b_var * n + delta.pow(2) * (count * n / total)
        self.mean.copy_(mean)
        self.var.copy_(m2 / total)
        self.count.copy_(total)
