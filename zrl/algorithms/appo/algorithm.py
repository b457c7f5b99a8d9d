"""APPO: PPO's clipped surrogate on V-trace targets, on IMPALA's asynchronous stream.

Actors and chunks are IMPALA's. The learner keeps a target network, a copy of
its own that follows it every `target_update_period` updates (as RLlib's APPO
does). V-trace's importance weights are taken against the target policy; the
policy loss is PPO's clipped surrogate of the ratio pi / pi_target, scaled by
the (clipped) importance weight pi_target / mu of the behaviour policy that
acted:

    adv = V-trace pg advantages (with log rho = log pi_target - log mu)
    w   = min(pi_target / mu, is_ratio_clip)
    r   = pi / pi_target
    L   = -mean(w * min(r * adv, clip(r, 1 - eps, 1 + eps) * adv))

With `normalize_returns` the value head predicts standardised values: they are
turned back into returns for V-trace, and its targets are standardised with the
running statistics (updated from each batch's targets) for the value loss.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from zrl.algorithms.appo import APPOConfig
from zrl.algorithms.impala.algorithm import Impala, vtrace_on_host
from zrl.models import ActorCritic, flatten_parameters
from zrl.models.normalizer import RunningMeanStd


class APPO(Impala):
    name = "appo"
    config_class = APPOConfig

    def setup(self, device: torch.device, env_steps: int = 0) -> None:
        super().setup(device, env_steps)
        self.target = copy.deepcopy(self.model).requires_grad_(False)
        self.target_flat = flatten_parameters(self.target)
        self.updates = 0
        self.returns = RunningMeanStd(()).to(device) if self.hp.normalize_returns else None

    def loss(self, model: ActorCritic, batch: dict[str, torch.Tensor]):
        hp = self.hp
        params_t, values_all, final_values = self.forward(model, batch)
        with torch.no_grad():
            target_params = self.forward(self.target, batch)[0]
        T = params_t.shape[0]
        head_values = values_all[:T]  # what the value head predicts: returns, or standardised ones
        if self.returns is not None:  # the value head predicts standardised returns
            values_all = self.returns.denormalize(values_all)
            final_values = self.returns.denormalize(final_values) if final_values is not None else None
        values_t, bootstrap = values_all[:T], values_all[T]
        rewards, discounts = self._rewards_and_discounts(batch, final_values)

        head = model.head
        logp = head.log_prob(params_t, batch["action"])
        target_logp = head.log_prob(target_params, batch["action"])
        log_rhos = target_logp - batch["behaviour_logp"]
        vt = vtrace_on_host(log_rhos, discounts, rewards, values_t.detach(), bootstrap.detach(), hp)
        adv = vt.pg_advantages
        if hp.normalize_advantages:
            adv = (adv - adv.mean()) / (adv.std(correction=0) + 1e-8)
        is_ratio = log_rhos.exp().clamp(max=hp.is_ratio_clip)
        ratio = (logp - target_logp).exp()
        surrogate = torch.min(ratio * adv, ratio.clamp(1.0 - hp.clip_range, 1.0 + hp.clip_range) * adv)
        pg_loss = -(is_ratio * surrogate).mean()
        baseline_loss = 0.5 * (head_values - self._value_target(vt.vs)).pow(2).mean()
        entropy = head.entropy(params_t).mean()
        loss = pg_loss + hp.baseline_cost * baseline_loss - hp.entropy_cost * entropy
        stats = {
            "loss/policy": pg_loss.detach(),
            "loss/baseline": baseline_loss.detach(),
            "policy/entropy": entropy.detach(),
            "vtrace/mean_rho": is_ratio.mean(),
            "vtrace/mean_vs": vt.vs.mean(),
            "appo/clip_frac": ((ratio.detach() - 1).abs() > hp.clip_range).float().mean(),
        }
        return loss, stats

    def _value_target(self, vs: torch.Tensor) -> torch.Tensor:
        """V-trace's targets as the value head predicts them: standardised with the running
        statistics (which take them in first) when normalize_returns is on."""
        if self.returns is None:
            return vs
        self.returns.update(vs)
        return self.returns(vs).detach()

    def after_update(self, model, batch, info) -> None:
        self.updates += 1
        if self.updates % self.hp.target_update_period == 0:
            with torch.no_grad():
                self.target_flat.copy_(self.flat)

    def state_dict(self) -> dict[str, Any]:
        state = {"target": self.target.state_dict(), "updates": self.updates}
        if self.returns is not None:
            state["returns"] = self.returns.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "target" in state:
            self.target.load_state_dict(state["target"])
        self.updates = int(state.get("updates", 0))
        if self.returns is not None and "returns" in state:
            self.returns.load_state_dict(state["returns"])


ALGORITHM = APPO
