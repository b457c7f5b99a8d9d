"""What an algorithm's update is made of: its optimiser, learning-rate schedule and gradient step.

`make_optimizer` builds `learner.optimizer` with the config's settings;
`restore_optimizer` loads a checkpoint's moments but keeps the config's settings;
`EnvStepSchedule` is torch's own LambdaLR over env steps (learner.lr_decay_env_steps);
`gradient_step` is backward, clip, the non-finite guard and the step, as every
gradient-based algorithm takes it.
"""
from __future__ import annotations

from typing import Callable, Iterable

import warnings

import torch

from zrl.config import LearnerConfig


def optimizer_settings(lc: LearnerConfig) -> dict:
    """The keyword settings of `lc.optimizer` (what a resumed run takes from its config)."""
    if lc.optimizer == "adam":
        return {"lr": lc.learning_rate, "betas": tuple(lc.adam_betas), "eps": lc.adam_eps}
    return {"lr": lc.learning_rate, "alpha": lc.rmsprop_alpha, "eps": lc.rmsprop_eps, "momentum": lc.rmsprop_momentum}


def make_optimizer(lc: LearnerConfig, params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
    params = list(params)
    if lc.optimizer == "adam":
        # The fused kernel: one call for all parameters, where the default path runs several
        # ops per tensor (on small networks most of an update's optimiser time).
        return torch.optim.Adam(params, fused=_fusable(params), **optimizer_settings(lc))
    return torch.optim.RMSprop(params, **optimizer_settings(lc))


def _fusable(params: list[torch.Tensor]) -> bool:
    return bool(params) and all(p.dtype == torch.float32 and p.device.type in ("cpu", "cuda") for p in params)


def restore_optimizer(opt: torch.optim.Optimizer, state: dict, lc: LearnerConfig) -> None:
    """Loads a checkpoint's optimiser state (its moments) and puts back the config's settings,
    which load_state_dict would otherwise take from the checkpoint (learning rate, eps, betas)."""
    fused = [group.get("fused") for group in opt.param_groups]
    opt.load_state_dict(state)
    settings = optimizer_settings(lc)
    for group, f in zip(opt.param_groups, fused):
        if f is not None:
            group["fused"] = f  # how this process steps, not how the checkpoint's did
    for group in opt.param_groups:
        group.update(settings)
        if "initial_lr" in group:  # what a LambdaLR scales: the config's rate, not the checkpoint's
            group["initial_lr"] = settings["lr"]
        if group.get("momentum", 0) > 0:  # RMSprop given momentum now: its buffers start at zero
            for p in group["params"]:
                st = opt.state[p]
                if st and "momentum_buffer" not in st:
                    st["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


class EnvStepSchedule:
    """learner.lr_decay_env_steps as torch's LambdaLR: the rate falls linearly with the env
    steps received, from learning_rate to learning_rate * lr_final_scale, and stays there.
    `advance(env_steps)` before each optimiser step sets that step's rate (a resumed run's
    first step too)."""

    def __init__(self, opt: torch.optim.Optimizer, lc: LearnerConfig, env_steps: int = 0):
        self.lc = lc
        self.env_steps = env_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(opt, self._scale) if lc.lr_decay_env_steps else None

    def _scale(self, _epoch: int) -> float:
        progress = min(1.0, self.env_steps / self.lc.lr_decay_env_steps)
        return 1.0 - progress * (1.0 - self.lc.lr_final_scale)

    def advance(self, env_steps: int) -> None:
        if self.scheduler is None:
            return
        self.env_steps = env_steps
        if self.scheduler._step_count > 1:
            self.scheduler.step()
            return
        with warnings.catch_warnings():
            # The rate follows env steps, not steps taken: setting it before the first
            # optimiser step is what is meant, not the misuse torch warns of (once).
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            self.scheduler.step()


def zero_nonfinite_grads(params: list[torch.Tensor], grad_norm: torch.Tensor) -> torch.Tensor:
    """Zeroes every gradient if their norm is not finite (a loss that overflowed on huge but
    finite inputs, a diverging learning rate), so that the step cannot write NaN into the
    weights and every actor's copy of them; returns 1.0 where it did, else 0.0 (a tensor, so
    no read: on a GPU a branch on it would wait for the backward pass). The optimiser still
    steps, on zero gradients."""
    ok = torch.isfinite(grad_norm)
    bad = ~ok
    for p in params:
        g = p.grad
        if g is None:
            continue
        if g.numel() < 65536:  # (a masked fill costs least on small tensors, two passes on large ones)
            g.masked_fill_(bad, 0.0)
        else:
            torch.nan_to_num_(g, 0.0, 0.0, 0.0).mul_(ok)
    return bad.float()


def gradient_step(opt: torch.optim.Optimizer, params: list[torch.Tensor], loss: torch.Tensor,
                  max_grad_norm: float, reduce: Callable[[list[torch.Tensor]], None] | None = None) -> dict[str, torch.Tensor]:
    """Backward, `reduce` (a learner group's gradient mean, zrl.learner.group), clip to
    max_grad_norm, the non-finite guard, step. Returns `grad_norm` and `nonfinite_grads`
    (1.0 where the gradients were zeroed) as tensors, unread."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if reduce is not None:
        reduce(params)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    nonfinite = zero_nonfinite_grads(params, grad_norm)
    opt.step()
    return {"grad_norm": torch.nan_to_num(grad_norm.detach(), 0.0, 0.0, 0.0), "nonfinite_grads": nonfinite}


