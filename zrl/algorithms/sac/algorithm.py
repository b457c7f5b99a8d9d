"""SAC (Haarnoja et al. 2018, with the learned temperature of "SAC: Algorithms and Applications").

Actors sample from a tanh-squashed Gaussian policy, rescaled to the Box's bounds, and send
IMPALA's chunks (`ImpalaRecorder`: T steps x K envs, T+1 observations, and the final
observation of each truncated episode). Until weights from the learner's first update
reach them (policy version 0: the weights' `trained` flag is still 0) they act uniformly
at random; the learner makes no update before `learning_starts` env steps have arrived,
so those steps, and the few acted before the first weights land, are random ones.

The learner turns each chunk into transitions (obs, action, reward, next_obs, discount)
as it arrives (`ingest`, on the receiver thread) and adds them to a C++ uniform replay: a
terminated step gets discount 0, a truncated one bootstraps from the episode's final
observation with discount gamma. Each update samples a batch and takes one step of each
of: the temperature (log alpha towards the target entropy), the twin Q-networks (soft
Bellman targets from Polyak-averaged target networks, the smaller of the two), and the
policy (alpha log pi - min Q on reparameterised actions); then the targets move by tau.

The replay ratio is held: `sample` returns None while the updates are at
updates_per_step x (env steps received - learning_starts), and the learner's replay
source stops reading chunks while the steps received run ahead of that
(zrl.learner.batches.ReplayBatches), so ZeroMQ holds the actors back.

`model`, the network actors get and the learner publishes, is the policy alone; the
critics, their targets and log alpha are the learner's own state (`state_dict`), and one
optimiser steps all three. The replay is not checkpointed: a resumed run refills it
(from a trained policy: `trained` is in the checkpoint).
"""
from __future__ import annotations

import copy
import math
import threading

import numpy as np
import torch

from zrl import spaces, wire
from zrl.algorithms.base import Algorithm, Policy
from zrl.algorithms.impala.algorithm import ImpalaRecorder
from zrl.algorithms.optim import EnvStepSchedule, make_optimizer, zero_nonfinite_grads
from zrl.algorithms.sac import SACConfig
from zrl.algorithms.sac.networks import SquashedGaussianPolicy, TwinQ
from zrl.config import Config
from zrl.models import flatten_parameters
from zrl.models.deterministic import SquashedMean
from zrl.replay import UniformReplay


def check_action_spec(action_spec: spaces.Spec) -> spaces.BoxSpec:
    """The action spec, if SAC can act in it (a float Box with finite bounds, per element or
    not); else ValueError."""
    if not isinstance(action_spec, spaces.BoxSpec):
        raise ValueError(f"sac needs a Box action space (continuous actions), got {action_spec.to_json()}")
    low, high = action_spec.bound_array("low"), action_spec.bound_array("high")
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise ValueError(f"sac squashes its actions into the Box's bounds, and this Box lacks one for some element: "
                         f"{action_spec.to_json()}")
    if not (low < high).all():
        raise ValueError(f"sac needs low < high for every element of the action Box, got {action_spec.to_json()}")
    if np.dtype(action_spec.dtype).kind != "f":
        raise ValueError(f"sac needs float actions, got a Box of {action_spec.dtype}")
    return action_spec


def _replay_dtype(obs_dtype: np.dtype) -> np.dtype:
    """How observations are kept in the replay: uint8 images as they are, the rest as float32."""
    return np.dtype(np.uint8) if obs_dtype == np.uint8 else np.dtype(np.float32)


class SACPolicy(Policy):
    """Samples from the squashed Gaussian; uniform over the Box while the weights have not been
    trained (version 0). Records the draw's log-density in [-1, 1]^A as behaviour_logp."""

    def __init__(self, model: SquashedGaussianPolicy, seed: int):
        self.model = model
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray, state=None):
        m = self.model
        if not m.trained:
            a = self.rng.uniform(-1.0, 1.0, (len(obs), m.action_dim)).astype(np.float32)
            logp = np.full(len(obs), -m.action_dim * math.log(2.0), np.float32)  # uniform on [-1, 1]^A
            return m.to_bounds(torch.from_numpy(a)).numpy(), {"behaviour_logp": logp}
        with torch.inference_mode():
            a, logp = m.sample(torch.from_numpy(obs))
            return m.to_bounds(a).numpy(), {"behaviour_logp": logp.numpy()}


class SACEvalPolicy(Policy):
    """Greedy (tanh of the mean, rescaled) or sampled actions for evaluation; nothing recorded."""

    def __init__(self, model: SquashedGaussianPolicy, greedy: bool):
        self.model = model
        self.greedy = greedy

    def act(self, obs: np.ndarray, state=None):
        with torch.inference_mode():
            x = torch.from_numpy(obs)
            a = self.model.greedy(x) if self.greedy else self.model.sample(x)[0]
            return self.model.to_bounds(a).numpy(), {}


class SAC(Algorithm):
    name = "sac"

    def __init__(self, config: Config, obs_spec: spaces.Spec, action_spec: spaces.Spec):
        super().__init__(config, obs_spec, action_spec)
        if not isinstance(config.algo, SACConfig):
            raise ValueError("SAC needs a SACConfig in config.algo")
        check_action_spec(action_spec)
        if not isinstance(obs_spec, spaces.BoxSpec):
            raise ValueError(f"sac needs Box observations, got {obs_spec.to_json()}")
        if config.model.network != "mlp":
            raise ValueError(f"sac builds MLPs (model.network: mlp), not {config.model.network}")
        if config.model.normalize_obs:
            raise ValueError("model.normalize_obs: not with algo.name sac (its networks take observations as they come)")
        self.hp: SACConfig = config.algo
        self.obs_dim = math.prod(obs_spec.shape)
        self.action_dim = math.prod(action_spec.shape)
        self.target_entropy = float(-self.action_dim if self.hp.target_entropy is None else self.hp.target_entropy)
        self.replay: UniformReplay | None = None  # learner side only, made on first use
        self._replay_lock = threading.Lock()  # the receiver's ingest and the trainer's sample both make it
        self.ingested = 0  # env steps added to the replay by this process (the receiver thread writes it)
        self.updates = 0  # updates by this process: with `ingested`, the replay ratio

    def build_model(self) -> SquashedGaussianPolicy:
        m = self.config.model
        spec = self.action_spec
        low, high = (spec.bound_array("low"), spec.bound_array("high")) if spec.per_element else (spec.low, spec.high)
        return SquashedGaussianPolicy(self.obs_dim, tuple(spec.shape), m.hidden_sizes, m.activation, low, high)

    def trajectory_schema(self, max_columns: int) -> wire.Schema:
        """IMPALA's chunk (see Impala.trajectory_schema), all of it checked at the gate: the
        replay copies what arrives, there is no later join to leave checks to."""
        obs_shape, obs_dtype = tuple(self.obs_spec.shape), np.dtype(self.obs_spec.dtype)
        F = wire.Field
        T = self.config.actor.unroll_length
        K = max(max_columns, self.config.actor.num_envs)
        return wire.Schema(
            [
                F("obs", obs_dtype, ("T+1", "K", *obs_shape)),
                F("action", np.float32, ("T", "K", *self.action_spec.shape)),
                F("reward", np.float32, ("T", "K")),
                F("terminated", np.bool_, ("T", "K"), bound=2),
                F("truncated", np.bool_, ("T", "K"), bound=2),
                F("behaviour_logp", np.float32, ("T", "K")),
                F("final_index", np.int32, ("M",), bound="T*K"),
                F("final_obs", obs_dtype, ("M", *obs_shape)),
            ],
            fixed={"T": T},
            bounds={"K": (1, K), "M": (0, T * K)},
            marks=[wire.Mark("final_index", "truncated", "terminated")],
        )

    # -- actor side
    def make_policy(self, model, *, actor_index, num_actors, seed) -> SACPolicy:
        return SACPolicy(model, seed)

    def make_recorder(self, model, *, num_envs, sender) -> ImpalaRecorder:
        return ImpalaRecorder(self, num_envs, sender)

    def make_eval_policy(self, model: SquashedGaussianPolicy, greedy: bool = True) -> Policy:
        return SACEvalPolicy(model, greedy)

    def deterministic_policy(self, model: SquashedGaussianPolicy) -> torch.nn.Module:
        return SquashedMean(model)

    # -- learner: state
    def setup(self, device: torch.device, env_steps: int = 0) -> None:
        """The policy (`model`, published), the twin critics and their targets, log alpha, and
        one optimiser over all three (learner.optimizer's settings, its LR schedule): one step
        per update, not three; gradients are clipped per network (`groups`)."""
        self.device = device
        self.model = self.build_model().to(device)
        self.flat = flatten_parameters(self.model)  # the buffer publishing reads, before the optimiser
        lc, m = self.config.learner, self.config.model
        self.critic = TwinQ(self.obs_dim, self.action_dim, m.hidden_sizes, m.activation).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.nn.Parameter(torch.tensor(math.log(self.hp.init_alpha), device=device))
        policy = [p for p in self.model.parameters() if p.requires_grad]  # (not the `trained` flag)
        self.groups = {"policy": policy, "critic": list(self.critic.parameters()), "alpha": [self.log_alpha]}
        self.params = [p for group in self.groups.values() for p in group]
        self.optimizer = make_optimizer(lc, self.params)
        self.schedule = EnvStepSchedule(self.optimizer, lc, env_steps)

    def state_dict(self) -> dict:
        """The critics, their targets and log alpha (`checkpoint_state` has the policy and the optimiser)."""
        return {"critic": self.critic.state_dict(), "critic_target": self.critic_target.state_dict(),
                "log_alpha": self.log_alpha.detach().clone()}

    def load_state_dict(self, state: dict) -> None:
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])

    # -- learner: replay
    def env_steps(self, msg: wire.Message, bindings: dict[str, int]) -> int:
        return bindings["T"] * bindings["K"]

    def _ensure_replay(self) -> UniformReplay:
        if self.replay is not None:
            return self.replay
        with self._replay_lock:
            if self.replay is None:
                obs = (tuple(self.obs_spec.shape), _replay_dtype(np.dtype(self.obs_spec.dtype)))
                fields = {
                    "obs": obs,
                    "action": (tuple(self.action_spec.shape), np.float32),
                    "reward": ((), np.float32),
                    "discount": ((), np.float32),
                    "next_obs": obs,
                    "version": ((), np.int64),
                }
                self.replay = UniformReplay(self.hp.replay_capacity, fields, seed=self.config.run.seed)
            return self.replay

    def ingest(self, msg: wire.Message, bindings: dict[str, int]) -> None:
        """A chunk's T x K steps as transitions into the replay: next_obs is the next row of
        obs, or the final observation where an episode was truncated; discount is gamma, or 0
        where one terminated (its next_obs, the next episode's first, is then unused)."""
        replay = self._ensure_replay()
        replay.add(chunk_transitions(msg.arrays, bindings, self.hp.discount, replay.fields["obs"][1], msg.policy_version))
        self.ingested += bindings["T"] * bindings["K"]

    def updates_allowed(self) -> float:
        """The updates the env steps received so far allow (updates_per_step x steps past learning_starts)."""
        return self.hp.updates_per_step * (self.ingested - self.hp.learning_starts)

    def waiting_for(self) -> str | None:
        if self.ingested < self.hp.learning_starts:
            return f"{self.ingested:,}/{self.hp.learning_starts:,} env steps (algo.learning_starts) before learning starts"
        if self.updates >= self.updates_allowed():
            return f"env steps: {self.updates:,} updates for {self.ingested:,} received (algo.updates_per_step {self.hp.updates_per_step:g})"
        return None

    def sample(self, device: torch.device):
        if self.replay is None or len(self.replay) == 0 or self.updates >= self.updates_allowed():
            return None
        batch = self.replay.sample(self.hp.batch_size)
        versions = batch.pop("version")
        out = {k: torch.from_numpy(v) for k, v in batch.items()}
        if device.type != "cpu":
            out = {k: v.pin_memory().to(device, non_blocking=True) for k, v in out.items()}
        out["_policy_version"] = versions
        return out

    # -- learner: the update
    def update(self, batch: dict[str, torch.Tensor], env_steps: int) -> dict[str, torch.Tensor]:
        """One step of each of: log alpha (towards the target entropy), the critics (soft
        Bellman targets from the target critics, the smaller of the two) and the policy
        (alpha log pi - min Q of its reparameterised actions), from one backward pass: no loss
        reaches another's parameters. Then the target critics move by tau. Every loss takes
        alpha as it was before this step (as SB3), and the policy the critics before theirs."""
        self.schedule.advance(env_steps)
        policy, critic = self.model, self.critic
        obs = batch["obs"]
        with self.autocast(obs.device):
            action_pi, logp_pi = policy.sample(obs)
            alpha = self.log_alpha.detach().exp()
            target = self._soft_target(batch, alpha)
            q1, q2 = critic(obs, policy.from_bounds(batch["action"]))
            critic.requires_grad_(False)  # the policy's loss reaches the critics' input, not their weights
            try:
                q1_pi, q2_pi = critic(obs, action_pi)
            finally:
                critic.requires_grad_(True)
        critic_loss = 0.5 * ((q1 - target).pow(2).mean() + (q2 - target).pow(2).mean())
        actor_loss = (alpha * logp_pi - torch.minimum(q1_pi, q2_pi)).mean()
        alpha_loss = -(self.log_alpha * (logp_pi.detach() + self.target_entropy)).mean()
        stats = self._step(critic_loss + actor_loss + alpha_loss)
        with torch.no_grad():
            torch._foreach_lerp_(list(self.critic_target.parameters()), self.groups["critic"], self.hp.tau)
            if self.updates == 0:
                policy.trained.fill_(1.0)  # actors with these weights act with the policy
        self.updates += 1
        stats.update({
            "loss/critic": critic_loss.detach(),
            "loss/actor": actor_loss.detach(),
            "loss/alpha": alpha_loss.detach(),
            "alpha": alpha,
            "policy/entropy": -logp_pi.detach().mean(),  # (an estimate: -mean log pi of the sampled actions)
            "q/mean": (0.5 * (q1 + q2)).detach().mean(),
        })
        return stats

    def _soft_target(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor) -> torch.Tensor:
        """r + discount * (min of the target critics - alpha log pi) at the next observation, a
        next action drawn from the policy."""
        with torch.no_grad():
            next_obs = batch["next_obs"]
            next_action, next_logp = self.model.sample(next_obs)
            q1_next, q2_next = self.critic_target(next_obs, next_action)
            return batch["reward"] + batch["discount"] * (torch.minimum(q1_next, q2_next) - alpha * next_logp)

    def _step(self, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        """Backward, then per parameter group what `gradient_step` does to all: clip to
        learner.max_grad_norm and zero non-finite gradients; then one optimiser step.
        Returns grad_norm (the policy's), grad_norm/critic and nonfinite_grads (any group), unread."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norms, nonfinite = {}, []
        for name, params in self.groups.items():
            norms[name] = torch.nn.utils.clip_grad_norm_(params, self.config.learner.max_grad_norm)
            nonfinite.append(zero_nonfinite_grads(params, norms[name]))
        self.optimizer.step()
        finite = {name: torch.nan_to_num(n.detach(), 0.0, 0.0, 0.0) for name, n in norms.items()}
        return {"grad_norm": finite["policy"], "grad_norm/critic": finite["critic"], "nonfinite_grads": torch.stack(nonfinite).amax()}


def chunk_transitions(arrays: dict[str, np.ndarray], bindings: dict[str, int], discount: float,
                      obs_dtype: np.dtype, version: int) -> dict[str, np.ndarray]:
    """An IMPALA chunk's T x K steps as replay transitions, in step-major order (t * K + k)."""
    T, K = bindings["T"], bindings["K"]
    n = T * K
    obs = arrays["obs"]
    shape = obs.shape[2:]
    next_obs = obs[1:].reshape(n, *shape)
    final_index = arrays["final_index"]
    if len(final_index) or next_obs.dtype != obs_dtype:
        next_obs = next_obs.astype(obs_dtype)  # a copy, which the final observations go into
        next_obs[final_index.astype(np.int64)] = arrays["final_obs"]
    not_terminated = ~arrays["terminated"].reshape(n)
    return {
        "obs": np.ascontiguousarray(obs[:-1].reshape(n, *shape), obs_dtype),
        "action": arrays["action"].reshape(n, *arrays["action"].shape[2:]),
        "reward": arrays["reward"].reshape(n),
        "discount": (discount * not_terminated).astype(np.float32),
        "next_obs": next_obs,
        "version": np.full(n, version, np.int64),
    }


ALGORITHM = SAC
