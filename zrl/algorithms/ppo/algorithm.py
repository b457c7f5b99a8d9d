"""PPO (Schulman et al. 2017), synchronous, on IMPALA's chunks.

Actors act with policy version v, send one chunk of T steps x K envs (IMPALA's
layout: T+1 observations, actions, rewards, flags, behaviour_logp, truncated
episodes' final observations), then wait for v + 1 (`version_needed`). The
learner's "version" batch source hands over a rollout of chunks all acted by
v; `update` computes GAE(lambda) advantages with the network that acted,
takes `epochs x minibatches` optimiser steps on the clipped surrogate, and the
learner publishes v + 1.

Truncated episodes bootstrap as in IMPALA: the step's reward becomes
r + gamma * V(final_obs) and its discount 0; terminated steps get discount 0.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from zrl.algorithms.impala.algorithm import Impala, ImpalaRecorder
from zrl.algorithms.optim import gradient_step
from zrl.algorithms.ppo import PPOConfig
from zrl.models.normalizer import RunningMeanStd


class PPORecorder(ImpalaRecorder):
    """IMPALA's chunks, each tagged with the version that acted its first step; after a chunk
    the next act needs a newer version."""

    def __init__(self, algo: "PPO", num_envs: int, sender):
        super().__init__(algo, num_envs, sender)
        self.needed: int | None = None

    def record(self, actions: np.ndarray, extras: dict[str, np.ndarray]) -> None:
        if self.t == 0:
            self.chunk_version = self.policy_version
            self.needed = None  # (asked once, between a chunk's end and the next act)
        super().record(actions, extras)

    def end_chunk(self) -> list:
        version = self.chunk_version
        frames = super().end_chunk()
        self.needed = version + 1
        return frames

    def version_needed(self) -> int | None:
        return self.needed


class PPO(Impala):
    name = "ppo"
    config_class = PPOConfig

    def make_recorder(self, model, *, num_envs, sender) -> PPORecorder:
        return PPORecorder(self, num_envs, sender)

    def setup(self, device: torch.device, env_steps: int = 0) -> None:
        super().setup(device, env_steps)
        self.returns = RunningMeanStd(()).to(device) if self.hp.normalize_returns else None

    def shape_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        return rewards

    def state_dict(self) -> dict[str, Any]:
        return {"returns": self.returns.state_dict()} if self.returns is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.returns is not None and "returns" in state:
            self.returns.load_state_dict(state["returns"])

    def clip_range(self, env_steps: int) -> float:
        hp = self.hp
        span = hp.clip_decay_env_steps or self.config.learner.lr_decay_env_steps
        if hp.clip_range_final is None or not span:
            return hp.clip_range
        progress = min(1.0, env_steps / span)
        return hp.clip_range + progress * (hp.clip_range_final - hp.clip_range)

    def update(self, batch: dict[str, torch.Tensor], env_steps: int) -> dict[str, torch.Tensor]:
        hp = self.hp
        self.schedule.advance(env_steps)
        rollout = self.rollout(batch)
        n = rollout["adv"].shape[0]
        size = max(1, n // hp.minibatches)
        clip = self.clip_range(env_steps)
        steps = [(epoch, start) for epoch in range(hp.epochs) for start in range(0, n - size + 1, size)]
        for epoch, start in steps:
            if size == n:  # one minibatch: the whole rollout, in any order
                mb = rollout
            else:
                if start == 0:
                    order = torch.randperm(n, device=rollout["adv"].device)
                idx = order[start : start + size]
                mb = {k: v[idx] for k, v in rollout.items()}
            last = (epoch, start) == steps[-1]  # (stats of the last step only: they cost as much as the loss)
            loss, stats = self.minibatch_loss(mb, clip, with_stats=last)
            step_stats = gradient_step(self.optimizer, self.params, loss, self.config.learner.max_grad_norm, self.gradient_reduce)
        stats.update(step_stats)
        self.observe_inputs(batch)
        stats["ppo/clip_range"] = torch.tensor(clip)
        stats["ppo/value_target"] = rollout["ret"].mean()
        return stats

    def rollout(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The rollout as [T * B] samples: observations, actions, their log-probabilities and
        the value head's predictions when acted, GAE(lambda) advantages and the value targets
        (advantage + value; standardised with normalize_returns, as the head predicts them)."""
        hp = self.hp
        obs, final_obs = batch["obs"], batch["final_obs"]
        T1, B = obs.shape[:2]
        T = T1 - 1
        with torch.no_grad(), self.autocast(obs.device):
            flat = obs.reshape(T1 * B, *obs.shape[2:])
            if final_obs.shape[0]:
                flat = torch.cat([flat, final_obs], 0)
            values = self.model.value_only(flat).float()
        head_values = values[: T1 * B].reshape(T1, B)[:T]  # what the value head predicts
        if self.returns is not None:  # standardised returns: back to returns for GAE
            values = self.returns.denormalize(values)
        values_all = values[: T1 * B].reshape(T1, B)
        final_values = values[T1 * B :] if final_obs.shape[0] else None
        rewards, discounts = self._rewards_and_discounts(batch, final_values)
        adv = gae(rewards, discounts, values_all, hp.gae_lambda)
        ret = adv + values_all[:T]
        if self.returns is not None:
            self.returns.update(ret)
            ret = self.returns(ret)
        return {
            "obs": obs[:T].reshape(T * B, *obs.shape[2:]),
            "action": batch["action"].reshape(T * B, *batch["action"].shape[2:]),
            "logp": batch["behaviour_logp"].reshape(T * B),
            "value": head_values.reshape(T * B),
            "adv": adv.reshape(T * B),
            "ret": ret.reshape(T * B),
        }

    def minibatch_loss(self, mb: dict[str, torch.Tensor], clip: float, with_stats: bool = True):
        hp = self.hp
        with self.autocast(mb["obs"].device):
            params, value = self.model(mb["obs"])
        params, value = params.float(), value.float()
        head = self.model.head
        logp = head.log_prob(params, mb["action"])
        adv = mb["adv"]
        if hp.normalize_advantages and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        log_ratio = logp - mb["logp"]
        ratio = log_ratio.exp()
        pg_loss = -torch.min(adv * ratio, adv * ratio.clamp(1.0 - clip, 1.0 + clip)).mean()
        if hp.clip_range_vf is None:
            value_loss = 0.5 * (value - mb["ret"]).pow(2).mean()
        else:
            clipped = mb["value"] + (value - mb["value"]).clamp(-hp.clip_range_vf, hp.clip_range_vf)
            value_loss = 0.5 * torch.max((value - mb["ret"]).pow(2), (clipped - mb["ret"]).pow(2)).mean()
        entropy = head.entropy(params).mean()
        loss = pg_loss + hp.value_cost * value_loss - hp.entropy_cost * entropy
        if not with_stats:
            return loss, {}
        with torch.no_grad():
            stats = {
                "loss/policy": pg_loss.detach(),
                "loss/value": value_loss.detach(),
                "policy/entropy": entropy.detach(),
                "ppo/approx_kl": ((ratio - 1) - log_ratio).mean(),
                "ppo/clip_frac": ((ratio - 1).abs() > clip).float().mean(),
            }
        return loss, stats


def gae(rewards: torch.Tensor, discounts: torch.Tensor, values: torch.Tensor, lam: float) -> torch.Tensor:
    """GAE(lambda) advantages [T, B] from rewards and discounts [T, B] (gamma, or 0 where the
    trace is cut) and values [T + 1, B] (the last row bootstraps)."""
    T = rewards.shape[0]
    deltas = rewards + discounts * values[1:] - values[:-1]
    adv = torch.empty_like(deltas)
    last = torch.zeros_like(deltas[0])
    for t in range(T - 1, -1, -1):
        last = deltas[t] + discounts[t] * lam * last
        adv[t] = last
    return adv


ALGORITHM = PPO
