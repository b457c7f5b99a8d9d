"""Several learners that train as one: a torch.distributed process group (gloo on CPU,
NCCL on GPUs) whose members each compute gradients on their share of a global batch and
average them before the optimiser steps, so every member takes the same step with the
same weights.

Each member is a whole learner with its own actors (`zrl run` spreads them): it
publishes the group's weights to them and trains in lockstep with the others (`agree`
before each update: whether any member stops, and the group's env steps, which drive
the schedules). Rank 0 also checkpoints and writes the summary. A member that dies
stops the others at their next collective, within learner.group_timeout_s.

Collectives carry tensors only. The rendezvous (`init_method`: a file:// path for one
machine, tcp://host:port across machines) trusts its network: use it only on a
trusted one.
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

__all__ = ["LearnerGroup"]


class LearnerGroup:
    """This process's membership in a group of `world_size` learners (rank 0 publishes)."""

    def __init__(self, rank: int, world_size: int, init_method: str, *, backend: str = "auto", timeout_s: float = 60.0):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside a group of {world_size}")
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"  # (NCCL: written, untested here: no two GPUs)
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        self.rank, self.world_size, self.backend = rank, world_size, backend
        # NCCL reduces tensors on the GPU only.
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def average_gradients(self, params: list[torch.Tensor]) -> None:
        """Replaces each parameter's gradient by the group's mean, in one collective over one
        flat buffer. A parameter without a gradient counts as zeros, so every member reduces
        buffers of the same layout."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world_size
        at = 0
        for p in params:
            mean = flat[at : at + p.numel()].view_as(p)
            at += p.numel()
            if p.grad is None:
                p.grad = mean.clone()
            else:
                p.grad.copy_(mean)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's `tensor` everywhere (the starting weights, a resumed checkpoint's)."""
        dist.broadcast(tensor, src=0)

    def agree(self, stop: bool, env_steps: int) -> tuple[bool, int]:
        """Before each update, in every member: whether any member stops, and the group's env steps."""
        t = torch.tensor([int(stop), env_steps], dtype=torch.int64, device=self.device)
        dist.all_reduce(t)
        return bool(t[0].item()), int(t[1].item())

    def total(self, value: int) -> int:
        """The sum of `value` over the group (env steps, samples)."""
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t)
        return int(t.item())

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
