"""A3C (Mnih et al. 2016) with asynchronous gradients: the actors compute, the learner applies.

An actor acts with its CPU copy of the model and keeps its rollout: T steps x
K envs (T+1 observations, actions, rewards, terminated / truncated flags and
truncated episodes' final observations). At the rollout's end its recorder
computes the actor-critic gradient with that same model:

    R_t = r_t + gamma * R_{t+1}, from R_T = V(x_T)   (cut to r_t where an episode
          terminated; r_t + gamma * V(final_obs) where one was truncated)
    loss = -mean((R - V) * log pi(a|x)) + value_cost * 0.5 * mean((R - V)^2)
           - entropy_cost * mean(entropy)

and sends it as one GRADIENT message (`gradient_schema`): the flat float32
gradient in the order of the model's flat parameters, the env steps it covers,
and its loss terms; the header's policy_version is the version of the weights
it was computed at. Weights that arrive mid-rollout are acted with at once, so
a rollout's first steps may come from a slightly older policy than the one
whose gradient is sent, as in A3C's own asynchronous threads.

The learner is the parameter server: its gate checks each gradient (dtype,
shape, finite, norm below `algo.max_gradient_norm`), its "gradients" batch
source (zrl.learner.gradient_batches) drops those more than `max_staleness`
updates old, and `update` sets the parameters' gradients from the message and
steps the optimiser (clipped to `learner.max_grad_norm`, the non-finite guard).
"""
from __future__ import annotations

import numpy as np
import torch

from zrl import spaces, wire
from zrl.algorithms.a3c import A3CConfig
from zrl.algorithms.base import Algorithm, Policy, Recorder
from zrl.algorithms.impala.algorithm import ImpalaEvalPolicy, ImpalaPolicy
from zrl.algorithms.optim import zero_nonfinite_grads
from zrl.config import Config
from zrl.envs import Step
from zrl.models import ActorCritic, build_actor_critic

# The env steps one gradient may claim: a rollout of T steps of at most this many envs. A
# claim beyond any actor's envs is a bad message, not a count to add.
MAX_ENVS_PER_ROLLOUT = 1 << 16
LOSS_TERMS = ("loss/policy", "loss/value", "policy/entropy")  # the message's `loss`, in this order


def check_actor_precision(config: Config) -> None:
    """ValueError unless the actors act in fp32 with no int8 path: they compute gradients
    with their acting model, and a bf16 model's gradients are too coarse to apply (an
    int8 one has none)."""
    ac = config.actor
    if ac.precision != "fp32":
        raise ValueError(f"actor.precision: must be fp32 with algo.name a3c (actors compute gradients with their "
                         f"acting model; bf16 ones are too coarse to apply); got {ac.precision}")
    for key in ("int8_first_conv", "int8_torso"):
        if getattr(ac, key) is not False:
            raise ValueError(f"actor.{key}: must be false with algo.name a3c (actors compute gradients with their "
                             f"acting model, and an int8 layer has none); got {getattr(ac, key)}")


def _action_layout(action_spec: spaces.Spec) -> tuple[np.dtype, tuple[int, ...]]:
    if isinstance(action_spec, spaces.DiscreteSpec):
        return np.dtype(np.int64), ()
    return np.dtype(np.float32), tuple(action_spec.shape)


class A3CRecorder(Recorder):
    """Keeps one rollout of T steps x K envs; at its end computes the gradient with the acting
    model and returns the GRADIENT frame for the caller to send."""

    def __init__(self, algo: "A3C", model: ActorCritic, num_envs: int, sender):
        if model.dtype != torch.float32:
            raise ValueError(f"a3c computes gradients with the acting model, which must be float32, not {model.dtype}")
        self.algo = algo
        self.model = model
        self.sender = sender
        self.T = algo.config.actor.unroll_length
        self.K = num_envs
        T, K = self.T, self.K
        obs_shape = tuple(algo.obs_spec.shape)
        act_dtype, act_shape = _action_layout(algo.action_spec)
        self.obs = np.zeros((T + 1, K, *obs_shape), np.dtype(algo.obs_spec.dtype))
        self.action = np.zeros((T, K, *act_shape), act_dtype)
        self.reward = np.zeros((T, K), np.float32)
        self.terminated = np.zeros((T, K), np.bool_)
        self.truncated = np.zeros((T, K), np.bool_)
        self.finals: list[tuple[int, np.ndarray]] = []  # (t * K + k, final observation) of truncated steps
        self.t = 0

    def begin(self, obs: np.ndarray) -> None:
        self.obs[0] = obs

    def record(self, actions: np.ndarray, extras: dict[str, np.ndarray]) -> None:
        self.action[self.t] = actions

    def observe(self, step: Step) -> list:
        t = self.t
        self.reward[t] = step.reward
        self.terminated[t] = step.terminated
        self.truncated[t] = step.truncated
        for k in sorted(step.final_obs):
            self.finals.append((t * self.K + k, step.final_obs[k]))
        self.obs[t + 1] = step.obs
        self.t += 1
        if self.t < self.T:
            return []
        return [self.end_rollout()]

    def rollout(self) -> dict[str, torch.Tensor]:
        """The rollout as the loss takes it (tensors over this recorder's arrays)."""
        obs_shape = self.obs.shape[2:]
        final_obs = np.stack([o for _, o in self.finals]) if self.finals else np.zeros((0, *obs_shape), self.obs.dtype)
        return {
            "obs": torch.from_numpy(self.obs),
            "action": torch.from_numpy(self.action),
            "reward": torch.from_numpy(self.reward),
            "terminated": torch.from_numpy(self.terminated),
            "truncated": torch.from_numpy(self.truncated),
            "final_index": torch.tensor([i for i, _ in self.finals], dtype=torch.int64),
            "final_obs": torch.from_numpy(final_obs),
        }

    def end_rollout(self):
        """The GRADIENT frame of the finished rollout; the next rollout starts from its last observation."""
        with torch.inference_mode(False):  # (tensors made under an actor's inference mode cannot be saved for backward)
            gradient, losses = self.algo.rollout_gradient(self.model, self.rollout())
        arrays = {"gradient": gradient, "env_steps": np.array(self.T * self.K, np.int64), "loss": losses}
        if self.model.obs_norm is not None:  # the learner keeps the statistics: the moments of what was acted on
            acted = self.obs[: self.T].reshape(self.T * self.K, -1).astype(np.float64)
            arrays["obs_mean"] = acted.mean(0).astype(np.float32)
            arrays["obs_var"] = acted.var(0).astype(np.float32)
        frame = self.sender.encode(wire.Kind.GRADIENT, arrays, self.policy_version)
        self.obs[0] = self.obs[self.T]
        self.finals = []
        self.t = 0
        return frame


class A3C(Algorithm):
    name = "a3c"

    def __init__(self, config: Config, obs_spec: spaces.Spec, action_spec: spaces.Spec):
        super().__init__(config, obs_spec, action_spec)
        if not isinstance(config.algo, A3CConfig):
            raise ValueError(f"A3C needs an A3CConfig in config.algo, not {type(config.algo).__name__}")
        check_actor_precision(config)
        self.hp = config.algo
        self._n_params: int | None = None

    def build_model(self) -> ActorCritic:
        return build_actor_critic(self.config.model, self.obs_spec, self.action_spec)

    def n_params(self) -> int:
        """The model's parameter count (counted on the meta device: nothing allocated)."""
        if self._n_params is None:
            with torch.random.fork_rng(devices=[]), torch.device("meta"):
                self._n_params = sum(p.numel() for p in self.build_model().parameters())
        return self._n_params

    def trajectory_schema(self, max_columns: int) -> None:
        """None: A3C's actors send gradients, not trajectories (the gate refuses those)."""
        return None

    def gradient_schema(self) -> wire.Schema:
        """The gradient (float32, the model's flat parameters' length, finite, its norm at most
        algo.max_gradient_norm), the env steps of the rollout it was computed on, and the
        rollout's loss terms (policy, value, entropy)."""
        F = wire.Field
        max_norm = self.hp.max_gradient_norm
        fields = [
            F("gradient", np.float32, (self.n_params(),), max_norm=max_norm if np.isfinite(max_norm) else None),
            F("env_steps", np.int64, (), bound=self.config.actor.unroll_length * MAX_ENVS_PER_ROLLOUT + 1),
            F("loss", np.float32, (len(LOSS_TERMS),)),
        ]
        if self.config.model.normalize_obs:  # the rollout's observation moments, for the learner's statistics
            dim = int(np.prod(self.obs_spec.shape))
            fields += [F("obs_mean", np.float32, (dim,)), F("obs_var", np.float32, (dim,), low=0.0)]
        return wire.Schema(fields)

    # -- actor side
    def make_policy(self, model, *, actor_index, num_actors, seed) -> ImpalaPolicy:
        return ImpalaPolicy(model)

    def make_recorder(self, model, *, num_envs, sender) -> A3CRecorder:
        return A3CRecorder(self, model, num_envs, sender)

    def make_eval_policy(self, model: ActorCritic, greedy: bool = True) -> Policy:
        return ImpalaEvalPolicy(model, greedy)

    def rollout_gradient(self, model: ActorCritic, rollout: dict[str, torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
        """The loss's gradient on one rollout, flat float32 in the order of the model's
        parameters (zrl.models.flatten_parameters), and the loss terms (LOSS_TERMS). The
        actor's model acts under inference mode; this computes with autograd whatever the
        caller's mode, and leaves the parameters' .grad alone."""
        params = list(model.parameters())
        trained = [p for p in params if p.requires_grad]
        with torch.inference_mode(False), torch.enable_grad():
            loss, stats = self.loss(model, rollout)
            grads = dict(zip(map(id, trained), torch.autograd.grad(loss, trained, allow_unused=True)))
        parts = []
        for p in params:
            g = grads.get(id(p))  # None: a parameter that takes no gradient (statistics) or did not reach the loss
            parts.append((g if g is not None else torch.zeros_like(p)).reshape(-1))
        flat = torch.cat(parts)
        losses = torch.stack([stats[k] for k in LOSS_TERMS])
        return flat.numpy().astype(np.float32, copy=False), losses.numpy().astype(np.float32, copy=False)

    def loss(self, model: ActorCritic, rollout: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The n-step actor-critic loss of a rollout (obs [T+1, K, ...], action, reward,
        terminated, truncated [T, K], final_index [M] (t * K + k), final_obs [M, ...])."""
        hp = self.hp
        obs, final_obs = rollout["obs"], rollout["final_obs"]
        T1, K = obs.shape[:2]
        T, M = T1 - 1, final_obs.shape[0]
        flat = obs.reshape(T1 * K, *obs.shape[2:])
        if M:
            flat = torch.cat([flat, final_obs], 0)
        params, values = model(flat)
        params, values = params.float(), values.float()
        params_t = params[: T * K].reshape(T, K, -1)
        values_all = values[: T1 * K].reshape(T1, K)
        final_values = values[T1 * K :].detach() if M else None
        values_t = values_all[:T]
        returns = n_step_returns(*self.rewards_and_discounts(rollout, final_values), values_all[T].detach())
        adv = returns - values_t.detach()
        if hp.normalize_advantages:
            adv = (adv - adv.mean()) / (adv.std(correction=0) + 1e-8)  # (correction=0: one step is NaN-free)
        head = model.head
        pg_loss = -(adv * head.log_prob(params_t, rollout["action"])).mean()
        value_loss = 0.5 * (returns - values_t).pow(2).mean()
        entropy = head.entropy(params_t).mean()
        loss = pg_loss + hp.value_cost * value_loss - hp.entropy_cost * entropy
        return loss, {"loss/policy": pg_loss.detach(), "loss/value": value_loss.detach(), "policy/entropy": entropy.detach()}

    def rewards_and_discounts(self, rollout: dict[str, torch.Tensor], final_values: torch.Tensor | None):
        """Rewards (scaled) and discounts [T, K]: an episode's last step gets discount 0; a
        truncated one bootstraps from its final observation's value, added to its reward."""
        hp = self.hp
        rewards = rollout["reward"].float() * hp.reward_scale
        discounts = hp.discount * (~(rollout["terminated"] | rollout["truncated"])).float()
        if final_values is not None:
            shape = rewards.shape
            rewards = rewards.reshape(-1).index_add(0, rollout["final_index"], hp.discount * final_values).reshape(shape)
        return rewards, discounts

    # -- learner side
    def setup(self, device: torch.device, env_steps: int = 0) -> None:
        """The base state, and the parameters' gradients as views of one flat buffer, which
        an update fills from a message in one copy."""
        super().setup(device, env_steps)
        self.grad = torch.zeros_like(self.flat)
        offset = 0
        for p in self.model.parameters():  # (the flat buffer's order, parameters that take no gradient included)
            n = p.numel()
            if p.requires_grad:
                p.grad = self.grad[offset : offset + n].view_as(p)
            offset += n

    def env_steps(self, msg: wire.Message, bindings: dict[str, int]) -> int:
        return int(msg.arrays["env_steps"])

    def update(self, batch: dict[str, torch.Tensor], env_steps: int) -> dict[str, torch.Tensor]:
        """Applies one actor's gradient (batch["gradient"]): clipped to learner.max_grad_norm,
        zeroed if not finite, then one optimiser step; then merges the rollout's observation
        moments into the model's statistics (model.normalize_obs)."""
        self.schedule.advance(env_steps)
        self.grad.copy_(batch["gradient"])
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.config.learner.max_grad_norm)
        nonfinite = zero_nonfinite_grads(self.params, grad_norm)
        self.optimizer.step()
        norm = self.model.obs_norm
        if norm is not None:
            norm.merge(batch["env_steps"], batch["obs_mean"], batch["obs_var"])
        stats = {"grad_norm": torch.nan_to_num(grad_norm.detach(), 0.0, 0.0, 0.0), "nonfinite_grads": nonfinite}
        stats.update(zip(LOSS_TERMS, batch["loss"].float().unbind()))
        return stats


def n_step_returns(rewards: torch.Tensor, discounts: torch.Tensor, bootstrap: torch.Tensor) -> torch.Tensor:
    """R_t = rewards[t] + discounts[t] * R_{t+1} from R_T = bootstrap, for [T, K] rewards and
    discounts (0 where an episode ended) and a [K] bootstrap."""
    returns = torch.empty_like(rewards)
    R = bootstrap
    for t in range(rewards.shape[0] - 1, -1, -1):
        R = rewards[t] + discounts[t] * R
        returns[t] = R
    return returns


ALGORITHM = A3C
