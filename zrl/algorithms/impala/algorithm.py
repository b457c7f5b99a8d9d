"""IMPALA (Espeholt et al. 2018): actor-critic with V-trace off-policy correction.

Actors sample from their copy of the policy and send chunks of T steps x K
envs: T+1 observations (the last bootstraps the chunk), actions, rewards,
terminated / truncated flags and `behaviour_logp` (log mu(a|x)), plus, for
steps where an episode was truncated, that episode's final observation, so
the learner bootstraps it with its own value function: the step's reward
becomes r + gamma * V(final_obs) and its discount 0. Terminated steps get
discount 0 and no bootstrap.

The learner concatenates chunks along the env axis into [T, B] batches and
minimises  -mean(pg_adv * log pi) + baseline_cost * 0.5 * mean((vs - V)^2)
- entropy_cost * mean(entropy), with vs and pg_adv from the C++ V-trace.
"""
from __future__ import annotations

import numpy as np
import torch

from zrl import _core, spaces, wire
from zrl.algorithms.base import Algorithm, Policy, Recorder, RejectedChunks
from zrl.algorithms.impala import ImpalaConfig
from zrl.config import Config
from zrl.envs import Step
from zrl.algorithms.vtrace import from_importance_weights
from zrl.models import ActorCritic, build_actor_critic


def _core_fields(algo, K) -> list:
    """The LSTM state a chunk starts from (none without an LSTM core)."""
    H = algo.config.model.lstm_size
    return [("core_h0", np.float32, (K, H)), ("core_c0", np.float32, (K, H))] if H else []


def _action_layout(action_spec: spaces.Spec) -> tuple[np.dtype, tuple[int, ...]]:
    if isinstance(action_spec, spaces.DiscreteSpec):
        return np.dtype(np.int64), ()
    return np.dtype(np.float32), tuple(action_spec.shape)


class ImpalaPolicy(Policy):
    """Samples from the policy; records log mu(a|x) for V-trace (and the core state it acted from)."""

    def __init__(self, model: ActorCritic):
        self.model = model

    def initial_state(self, n: int):
        if not self.model.recurrent:
            return None
        return tuple(x.numpy() for x in self.model.initial_state(n))

    def _forward(self, obs: np.ndarray, state):
        """Policy parameters, and the next core state (None without a core); call under inference_mode."""
        x = torch.from_numpy(obs)
        if not self.model.recurrent:
            return self.model.policy_float(x), None  # float32 even for a bf16 actor
        dtype = self.model.dtype
        params, _, new = self.model.step(x, tuple(torch.from_numpy(s).to(dtype) for s in state))
        return params.float(), tuple(s.float().numpy() for s in new)

    def act(self, obs: np.ndarray, state=None):
        if state is None:
            logits = self.model.int8_logits(obs)  # an int8 actor's path without torch ops (else None)
            if logits is not None:
                # As CategoricalHead.sample_with_log_prob: uniforms from torch's generator.
                u = torch.rand(logits.shape[0], dtype=torch.float64)
                action, logp = _core.sample_categorical(logits, u.numpy())
                return action, {"behaviour_logp": logp}
        with torch.inference_mode():
            params, new = self._forward(obs, state)
            action, logp = self.model.head.sample_with_log_prob(params)
        extras = {"behaviour_logp": logp}
        if new is not None:
            extras.update(state=new, core_h=state[0], core_c=state[1])
        return action, extras


class ImpalaEvalPolicy(ImpalaPolicy):
    """Greedy (the mode) or sampled actions for evaluation; nothing recorded."""

    def __init__(self, model: ActorCritic, greedy: bool):
        super().__init__(model)
        self.greedy = greedy

    def act(self, obs: np.ndarray, state=None):
        with torch.inference_mode():
            params, new = self._forward(obs, state)
            head = self.model.head
            action = head.mode(params) if self.greedy else head.sample(params)
        return action.numpy(), ({"state": new} if new is not None else {})


class ImpalaRecorder(Recorder):
    """Writes T steps x K envs straight into a trajectory frame (no copy at send)."""

    def __init__(self, algo: "Impala", num_envs: int, sender):
        self.sender = sender
        self.T = algo.config.actor.unroll_length
        self.K = num_envs
        obs_dtype = np.dtype(algo.obs_spec.dtype)
        obs_shape = tuple(algo.obs_spec.shape)
        act_dtype, act_shape = _action_layout(algo.action_spec)
        T, K = self.T, self.K
        self.fields = [
            ("obs", obs_dtype, (T + 1, K, *obs_shape)),
            ("action", act_dtype, (T, K, *act_shape)),
            ("reward", np.float32, (T, K)),
            ("terminated", np.bool_, (T, K)),
            ("truncated", np.bool_, (T, K)),
            ("behaviour_logp", np.float32, (T, K)),
            *_core_fields(algo, K),
            # Variable rows last: final_obs, the largest, is cut at the used rows.
            ("final_index", np.int32, (K,)),
            ("final_obs", obs_dtype, (K, *obs_shape)),
        ]
        self.recurrent = algo.config.model.lstm_size > 0
        self.layout = wire.Layout(wire.Kind.TRAJECTORY, self.fields)
        # The frame for m truncated episodes (m final observations), m = 0..K, made when first needed.
        self.cuts: list[wire.Cut | None] = [None] * (K + 1)
        self.cut0 = self.cuts[0] = self.layout.cut({"final_index": 0, "final_obs": 0})  # (the usual one)
        self.msg = self.layout.allocate()
        self.chunks = sender.chunk_sender(("obs", 0, self.T))  # the next chunk's first observation is this one's last
        self.t = 0
        self.finals: list[tuple[int, np.ndarray]] = []
        self.chunk_version = 0
        self._next_obs: np.ndarray | None = None  # obs_buffer()'s view, filled by the caller

    def begin(self, obs: np.ndarray) -> None:
        self.msg.arrays["obs"][0] = obs
        self.chunk_version = self.policy_version

    def record(self, actions: np.ndarray, extras: dict[str, np.ndarray]) -> None:
        a = self.msg.arrays
        a["action"][self.t] = actions
        a["behaviour_logp"][self.t] = extras["behaviour_logp"]
        if self.recurrent and self.t == 0:  # the state the chunk starts from: the learner unrolls from it
            a["core_h0"][:] = extras["core_h"]
            a["core_c0"][:] = extras["core_c"]

    def observe(self, step: Step) -> list:
        a, t = self.msg.arrays, self.t
        a["reward"][t] = step.reward
        a["terminated"][t] = step.terminated
        a["truncated"][t] = step.truncated
        for k in sorted(step.final_obs):  # final_index in increasing order, as the learner checks
            self.finals.append((t * self.K + k, step.final_obs[k]))
        if step.obs is not self._next_obs:
            a["obs"][t + 1] = step.obs
        self._next_obs = None
        self.t += 1
        if self.t < self.T:
            return []
        return self.end_chunk()

    def end_chunk(self) -> list:
        """Finishes the chunk (its T steps recorded) and starts the next one from its
        last observation. Returns the frame for the caller to send, if the sender did
        not send it already."""
        msg = self.msg
        if not self.finals:
            frame, carried = self.chunks.send(msg, self.chunk_version, self.cut0)
        elif len(self.finals) > self.K:
            frame, carried = self._encode_copy(), self.sender.carry_row(msg, self.chunks.carry)
        else:
            frame, carried = self.chunks.send(msg, self.chunk_version, self._final_rows())
        if not carried:
            self.msg = self.layout.allocate()
            self.msg.arrays["obs"][0] = msg.arrays["obs"][self.T]
        self.t = 0
        if self.finals:
            self.finals = []
        self.chunk_version = self.policy_version
        return [] if frame is None else [frame]

    def step_rows(self) -> tuple[np.ndarray, ...] | None:
        if self.recurrent or self.K != 1:
            return None
        a = self.msg.arrays
        return a["obs"], a["action"], a["reward"], a["terminated"], a["truncated"], a["behaviour_logp"]

    def obs_buffer(self) -> np.ndarray:
        self._next_obs = self.msg.arrays["obs"][self.t + 1]
        return self._next_obs

    def _final_rows(self) -> wire.Cut:
        """Writes the truncated episodes' final observations into the frame; the cut that sends them."""
        m = len(self.finals)
        a = self.msg.arrays
        for i, (idx, o) in enumerate(self.finals):
            a["final_index"][i] = idx
            a["final_obs"][i] = o
        cut = self.cuts[m]
        if cut is None:
            cut = self.cuts[m] = self.layout.cut({"final_index": m, "final_obs": m})
        return cut

    def _encode_copy(self):
        """More truncations than the frame holds (very short episodes): the chunk copied once."""
        arrays = {name: self.msg.arrays[name] for name, _, _ in self.fields[:-2]}
        arrays["final_index"] = np.array([i for i, _ in self.finals], np.int32)
        arrays["final_obs"] = np.stack([o for _, o in self.finals])
        return self.sender.encode(wire.Kind.TRAJECTORY, arrays, self.chunk_version)


class Impala(Algorithm):
    name = "impala"
    config_class: type = ImpalaConfig  # what config.algo must be (a subclass's own config)

    def __init__(self, config: Config, obs_spec: spaces.Spec, action_spec: spaces.Spec):
        super().__init__(config, obs_spec, action_spec)
        if not isinstance(config.algo, self.config_class):
            raise ValueError(f"{type(self).__name__} needs a {self.config_class.__name__} in config.algo")
        self.hp = config.algo
        self._joined_schema: wire.Schema | None = None  # the rules collate checks

    def build_model(self) -> ActorCritic:
        return build_actor_critic(self.config.model, self.obs_spec, self.action_spec)

    def trajectory_schema(self, max_columns: int) -> wire.Schema:
        """collate joins every field but final_index (a few entries), which keeps its bound at
        the gate, with the mark that ties it to truncated and terminated: it names each
        truncated step once, in order (t * K + k), and no truncated step is also terminated,
        so the loss bootstraps from a final observation exactly there. Bounds are unsigned,
        so they check both ends: a negative index or action reads as a huge one."""
        obs_shape = tuple(self.obs_spec.shape)
        obs_dtype = np.dtype(self.obs_spec.dtype)
        act_dtype, act_shape = _action_layout(self.action_spec)
        n_actions = self.action_spec.n if isinstance(self.action_spec, spaces.DiscreteSpec) else None
        F = wire.Field
        T = self.config.actor.unroll_length
        return wire.Schema(
            [
                F("obs", obs_dtype, ("T+1", "K", *obs_shape), at_join=True),
                F("action", act_dtype, ("T", "K", *act_shape), bound=n_actions, at_join=True),
                F("reward", np.float32, ("T", "K"), at_join=True),
                F("terminated", np.bool_, ("T", "K"), bound=2, at_join=True),  # flags 0 or 1
                F("truncated", np.bool_, ("T", "K"), bound=2, at_join=True),
                F("behaviour_logp", np.float32, ("T", "K"), at_join=True),
                *(F(name, dt, ("K", *shape[1:]), at_join=True) for name, dt, shape in _core_fields(self, 1)),
                F("final_index", np.int32, ("M",), bound="T*K"),
                F("final_obs", obs_dtype, ("M", *obs_shape), at_join=True),
            ],
            fixed={"T": T},
            bounds={"K": (1, max_columns), "M": (0, T * max_columns)},
            marks=[wire.Mark("final_index", "truncated", "terminated")],
        )

    def _schema(self) -> wire.Schema:
        if self._joined_schema is None:
            self._joined_schema = self.trajectory_schema(self.config.learner.batch_size)
        return self._joined_schema

    def make_policy(self, model, *, actor_index, num_actors, seed) -> ImpalaPolicy:
        return ImpalaPolicy(model)

    def make_recorder(self, model, *, num_envs, sender) -> ImpalaRecorder:
        return ImpalaRecorder(self, num_envs, sender)

    def make_eval_policy(self, model: ActorCritic, greedy: bool = True) -> Policy:
        return ImpalaEvalPolicy(model, greedy)

    # -- learner
    def columns(self, msg: wire.Message, bindings: dict[str, int]) -> int:
        return bindings["K"]

    def env_steps(self, msg: wire.Message, bindings: dict[str, int]) -> int:
        return bindings["T"] * bindings["K"]

    def collate(self, msgs: list[wire.Message], device: torch.device) -> dict[str, torch.Tensor]:
        """The batch of these chunks on device. Every element of the schema's `at_join` fields
        is checked as it is copied (finite floats, the action and flag bounds); chunks that
        break a rule raise RejectedChunks, whatever the gate checked before."""
        arrays = [m.arrays for m in msgs]
        obs0 = arrays[0]["obs"]
        bounds = self._schema().element_bounds({"T": obs0.shape[0] - 1, "K": obs0.shape[1]})
        errors: dict[int, wire.WireError] = {}

        def join(name: str, axis: int, owners: list[int] | None = None) -> torch.Tensor:
            parts = [a[name] for a in arrays] if owners is None else [arrays[i][name] for i in owners]
            t, bad = _join(parts, axis, device, bounds.get(name))
            for i in bad:
                errors.setdefault(i if owners is None else owners[i], _broken(name, parts[i].dtype, bounds.get(name)))
            return t

        batch = {}
        for name in ("obs", "action", "reward", "terminated", "truncated", "behaviour_logp"):
            batch[name] = join(name, 1)
        for name in ("core_h0", "core_c0"):
            if name in arrays[0]:
                batch[name] = join(name, 0)
        T1, B = batch["obs"].shape[:2]
        # final_index is t * K + k within its chunk; in the batch it is t * B + (column offset + k).
        idx, owners, col = [], [], 0
        for i, a in enumerate(arrays):
            K = a["obs"].shape[1]
            fi = a["final_index"].astype(np.int64)
            if fi.size:
                idx.append((fi // K) * B + col + fi % K)
                owners.append(i)
            col += K
        batch["final_index"] = _to_device(np.concatenate(idx) if idx else np.zeros(0, np.int64), device)
        if owners:
            batch["final_obs"] = join("final_obs", 0, owners)
        else:
            batch["final_obs"] = _to_device(np.zeros((0, *batch["obs"].shape[2:]), obs0.dtype), device)
        if errors:
            raise RejectedChunks(errors)
        return batch

    def forward(self, model: ActorCritic, batch: dict[str, torch.Tensor]):
        """The network over a batch, in float32: policy parameters [T, B, P], values [T + 1, B]
        (the last row bootstraps) and the values of truncated episodes' final observations
        [M] (None when there are none)."""
        obs, final_obs = batch["obs"], batch["final_obs"]
        T1, B = obs.shape[:2]
        T = T1 - 1
        M = final_obs.shape[0]
        if model.recurrent:
            # obs[t + 1] starts an episode where step t ended one: the core state resets there.
            first = torch.zeros((T1, B), dtype=torch.bool, device=obs.device)
            first[1:] = batch["terminated"] | batch["truncated"]
            with self.autocast(obs.device):
                params_all, values_all, (h_all, c_all) = model.unroll(obs, (batch["core_h0"], batch["core_c0"]), first)
                final_values = None
                if M:
                    # A truncated episode's final observation continues from the state after its last step.
                    idx = batch["final_index"]
                    state = (h_all[:T].reshape(T * B, -1)[idx], c_all[:T].reshape(T * B, -1)[idx])
                    final_values = model.value_after(final_obs, state).float()
            return params_all[:T].float(), values_all.float(), final_values
        flat = obs.reshape(T1 * B, *obs.shape[2:])
        if M:
            flat = torch.cat([flat, final_obs], 0)
        with self.autocast(obs.device):
            params, values = model(flat)
        params, values = params.float(), values.float()
        return params[: T * B].reshape(T, B, -1), values[: T1 * B].reshape(T1, B), (values[T1 * B :] if M else None)

    def loss(self, model: ActorCritic, batch: dict[str, torch.Tensor]):
        hp = self.hp
        params_t, values_all, final_values = self.forward(model, batch)
        T = params_t.shape[0]
        values_t, bootstrap = values_all[:T], values_all[T]
        rewards, discounts = self._rewards_and_discounts(batch, final_values)

        head = model.head
        target_logp = head.log_prob(params_t, batch["action"])
        log_rhos = target_logp.detach() - batch["behaviour_logp"]
        vt = vtrace_on_host(log_rhos, discounts, rewards, values_t.detach(), bootstrap.detach(), hp)
        pg_adv = vt.pg_advantages
        if hp.normalize_advantages:
            pg_adv = (pg_adv - pg_adv.mean()) / (pg_adv.std(correction=0) + 1e-8)  # (correction=0: one step is NaN-free)
        pg_loss = -(pg_adv * target_logp).mean()
        baseline_loss = 0.5 * (vt.vs - values_t).pow(2).mean()
        entropy = head.entropy(params_t).mean()
        loss = pg_loss + hp.baseline_cost * baseline_loss - hp.entropy_cost * entropy
        stats = {
            "loss/policy": pg_loss.detach(),
            "loss/baseline": baseline_loss.detach(),
            "policy/entropy": entropy.detach(),
            "vtrace/mean_rho": log_rhos.exp().mean(),
            "vtrace/mean_vs": vt.vs.mean(),
        }
        return loss, stats

    def shape_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        """The rewards the loss sees: clipped (algo.reward_clip), then scaled (algo.reward_scale)."""
        hp = self.hp
        if hp.reward_clip is not None:
            rewards = rewards.clamp(-hp.reward_clip, hp.reward_clip)
        if hp.reward_scale != 1.0:
            rewards = rewards * hp.reward_scale
        return rewards

    def _rewards_and_discounts(self, batch: dict[str, torch.Tensor], final_values: torch.Tensor | None):
        """V-trace's rewards (clipped, scaled) and discounts, [T, B]: terminated steps get
        discount 0; truncated ones bootstrap from V(final_obs) here, then cut the trace."""
        hp = self.hp
        rewards = self.shape_rewards(batch["reward"].float())
        discounts = hp.discount * (~batch["terminated"]).float()
        if final_values is not None:
            shape = rewards.shape
            rewards = rewards.reshape(-1).index_add(0, batch["final_index"], hp.discount * final_values.detach()).reshape(shape)
            discounts = discounts.masked_fill(batch["truncated"], 0.0)
        return rewards, discounts


def vtrace_on_host(log_rhos, discounts, rewards, values, bootstrap, hp: ImpalaConfig):
    """Runs the C++ V-trace on CPU tensors; on CUDA, one round trip through pinned memory."""
    device = values.device
    args = [log_rhos, discounts, rewards, values, bootstrap]
    if device.type != "cpu":
        host = [torch.empty(a.shape, dtype=torch.float32, pin_memory=True) for a in args]
        for h, a in zip(host, args):
            h.copy_(a, non_blocking=True)
        torch.cuda.current_stream(device).synchronize()
        args = host
    else:
        args = [a.contiguous() for a in args]
    vt = from_importance_weights(
        *args,
        clip_rho_threshold=hp.clip_rho_threshold,
        clip_pg_rho_threshold=hp.clip_pg_rho_threshold,
        clip_c_threshold=hp.clip_c_threshold,
        lambda_=hp.vtrace_lambda,
    )
    if device.type != "cpu":
        return type(vt)(*(x.pin_memory().to(device, non_blocking=True) for x in vt))
    return vt


def _join(parts: list[np.ndarray], axis: int, device: torch.device, bound: int | None = None) -> tuple[torch.Tensor, list[int]]:
    """The chunks' arrays joined along axis into one tensor on device, and the indices of the
    parts that broke their rule as they were copied (`_core.join_checked`): floats must be
    finite, and with a bound every element, read as unsigned, must be below it. For a GPU
    they are written straight into pinned memory (one host copy, where joining and then
    pinning made two: a Pong batch of 32 columns is 19 MB) and sent without waiting for
    the copy. The checked copy costs what numpy's join does (bench/TRANSPORT.md)."""
    shape = list(parts[0].shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    dtype = parts[0].dtype
    rule = "finite" if dtype.kind == "f" else "none" if bound is None else "bound"
    if device.type == "cpu":
        out = np.empty(shape, dtype)
        return torch.from_numpy(out), _core.join_checked(parts, axis, out, rule, bound or 0)
    host = torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype, pin_memory=True)  # (the parts are read-only views of frames)
    bad = _core.join_checked(parts, axis, host.numpy(), rule, bound or 0)
    return host.to(device, non_blocking=True), bad


def _broken(name: str, dtype: np.dtype, bound: int | None) -> wire.WireError:
    """The error of a chunk whose `name` broke its rule at the join (as wire's checks word it)."""
    what = "holds a NaN or an infinity" if dtype.kind == "f" else f"outside [0, {bound})"
    return wire.WireError(wire.Reason.BAD_VALUE, f"{name} {what} (checked at the batch join)")


def _to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """CPU: the batch array itself. GPU: through pinned memory, without waiting for the copy."""
    t = torch.from_numpy(a)
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


ALGORITHM = Impala
