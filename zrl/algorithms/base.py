"""The algorithm seam: what an algorithm provides to the actor and learner pipelines.

An actor (or the agent server) asks an algorithm for a batched `Policy` and one
`Recorder` per stream of envs; the recorder writes what was done into frames
of the algorithm's schema and hands them to its `Sender`, which sends them.
The learner asks it for its schema (checked on receipt), its batch source
(`batch_source`: fresh chunks joined by `collate`, or a replay filled by
`ingest` and drawn by `sample`), and `update(batch)`, which owns the networks,
optimisers, schedules and target nets and takes any number of optimiser steps.
Algorithms never send anything themselves.
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import numpy as np
import torch

from zrl import spaces, wire
from zrl.algorithms.optim import EnvStepSchedule, gradient_step, make_optimizer, restore_optimizer
from zrl.config import Config
from zrl.cpu import cpu_flags
from zrl.envs import Step
from zrl.models import flatten_parameters
from zrl.models.deterministic import actor_critic_mode


def _native_bf16(device_type: str) -> bool:
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type != "cpu":
        return False
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


_NATIVE_BF16: dict[tuple[str, int | None], bool] = {}


def resolve_precision(setting: str, device: torch.device) -> str:
    """`learner.precision` for a device: fp32 or bf16 (auto: bf16 where the hardware does it natively)."""
    if setting != "auto":
        return setting
    key = (device.type, device.index)
    if key not in _NATIVE_BF16:
        _NATIVE_BF16[key] = _native_bf16(device.type)
    return "bf16" if _NATIVE_BF16[key] else "fp32"


class Policy:
    """Acting, batched: the part of an algorithm that turns observations into actions.

    `act(obs[N], state) -> (actions[N], extras)` where extras are per-row
    arrays a recorder needs (IMPALA: behaviour_logp; Ape-X: the chosen
    action's Q). One policy serves an actor's K envs, or all of the agent
    server's clients in one forward pass.

    A recurrent policy also takes the core state of the N rows (a tuple of
    [N, ...] arrays, from `initial_state` at first), returns the next one as
    extras["state"], and the state it acted from as extras["core_h"] /
    extras["core_c"] for the recorder. Whoever steps the envs owns the state:
    it keeps extras["state"] for the next call and resets the rows of envs
    whose episode ended (`reset_rows`). Feed-forward policies use None.
    """

    def initial_state(self, n: int):
        return None

    def act(self, obs: np.ndarray, state=None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        raise NotImplementedError


def reset_rows(state, done: np.ndarray):
    """Zeroes the core state of the rows whose episode ended (a copy; None stays None)."""
    if state is None or not done.any():
        return state
    out = tuple(np.array(x) for x in state)
    for x in out:
        x[done] = 0.0
    return out


class Recorder:
    """Recording, per stream of K envs: cuts what was done into messages.

    `begin(obs)` once, then per step `record(actions, extras)` followed by
    `observe(step) -> [frames]`. `policy_version` is the version acting now;
    the pipeline sets it when new weights are applied.
    """

    policy_version: int = 0

    def begin(self, obs: np.ndarray) -> None:
        raise NotImplementedError

    def record(self, actions: np.ndarray, extras: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def observe(self, step: Step) -> list[Any]:
        raise NotImplementedError

    def version_needed(self) -> int | None:
        """The oldest policy version the next act may use (a synchronous algorithm's recorder
        asks for a newer one after each chunk; the actor waits for it), or None: any."""
        return None

    def step_rows(self) -> tuple[np.ndarray, ...] | None:
        """For one env (K = 1): the arrays of the chunk being written, (obs [T + 1, ...],
        action [T, ...], reward, terminated, truncated, behaviour_logp [T]), where the agent
        server's C++ loop (zrl.server.fast_path) writes routine steps as observe() and
        record() would, with `t` the row of the next reward; None (the default) where the
        recorder writes anything else, so every step goes through observe() and record().
        Once the loop has written a chunk's last step (t == T), `end_chunk()` sends it."""
        return None

    def end_chunk(self) -> list[Any]:
        """(A recorder with step_rows.) Sends the chunk whose T steps were written and starts
        the next from its last observation; returns the frames left for the caller to send."""
        raise NotImplementedError

    def obs_buffer(self) -> np.ndarray | None:
        """Where the next observe() stores step.obs ([K, *obs]), or None if nowhere. A caller
        that assembles the observations row by row (zrl.actors.streams) writes them there and
        passes that same array as step.obs, and the recorder skips its copy."""
        return None


class NullRecorder(Recorder):
    """Records nothing: for evaluation, where only episode returns matter."""

    def begin(self, obs: np.ndarray) -> None:
        pass

    def record(self, actions, extras) -> None:
        pass

    def observe(self, step: Step) -> list[Any]:
        return []


class ActorAlgo:
    """One stream of K envs: a policy (possibly shared with other streams), its
    recurrent state for these envs, and their recorder.

    `begin(obs)` once, then per step `act(obs) -> actions` and
    `observe(step) -> [frames]` (which also resets the state of envs whose
    episode ended). Actors run one per env group; `zrl eval` runs one with a
    NullRecorder.
    """

    def __init__(self, policy: Policy, recorder: Recorder):
        self.policy = policy
        self.recorder = recorder

    @property
    def policy_version(self) -> int:
        return self.recorder.policy_version

    @policy_version.setter
    def policy_version(self, v: int) -> None:
        self.recorder.policy_version = v

    def begin(self, obs: np.ndarray) -> None:
        self.recorder.begin(obs)
        self.state = self.policy.initial_state(len(obs))

    def act(self, obs: np.ndarray) -> np.ndarray:
        actions, extras = self.policy.act(obs, self.state)
        self.state = extras.pop("state", None)
        self.recorder.record(actions, extras)
        return actions

    def observe(self, step: Step) -> list[Any]:
        self.state = reset_rows(self.state, step.terminated | step.truncated)
        return self.recorder.observe(step)


class RejectedChunks(Exception):
    """Raised by `Algorithm.collate` when chunks broke a rule it checks as it copies them
    (the schema's `at_join` fields): `errors` maps the index of each such message to its WireError.
    The learner counts and drops those and makes the batch again from the rest."""

    def __init__(self, errors: dict[int, wire.WireError]):
        super().__init__(f"{len(errors)} chunk(s) rejected at the join: " + "; ".join(str(e) for e in errors.values()))
        self.errors = errors


class Algorithm:
    """One algorithm for agreed observation and action specs.

    Both sides: `build_model`, `trajectory_schema`. Actor side: `make_policy`,
    `make_recorder`, `make_eval_policy`. Learner side: `setup(device)` builds
    the learner's state (the published network `model`, `optimizer`, schedules,
    target nets), then per batch `update(batch) -> metrics`; `checkpoint_state`
    and `restore` carry that state across runs. The batch source is the config's
    `batch_source`: "stream" (fresh chunks: `columns`, `collate`) or "replay"
    (`ingest` from the receiver thread, `sample` from the training loop).
    """

    name: ClassVar[str]

    def __init__(self, config: Config, obs_spec: spaces.Spec, action_spec: spaces.Spec):
        self.config = config
        self.obs_spec = obs_spec
        self.action_spec = action_spec
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        # Several learners as one (zrl.learner.group): the group's gradient mean, applied between
        # backward and the optimiser step of every gradient_step this algorithm takes.
        self.gradient_reduce: Callable[[list[torch.Tensor]], None] | None = None

    @property
    def batch_source(self) -> str:
        return self.config.algo.batch_source

    # -- both sides
    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def trajectory_schema(self, max_columns: int) -> wire.Schema:
        """What a TRAJECTORY message must carry, as data: fields, dtypes, shapes and their
        per-element rules (wire.Field, wire.Mark), checked by the learner on receipt.
        Fields marked `at_join` are a promise that `collate` checks their rules as it
        copies them (a stream learner's gate then leaves them to it)."""
        raise NotImplementedError

    def gradient_schema(self) -> wire.Schema | None:
        """What a GRADIENT message must carry (an algorithm whose actors compute gradients,
        A3C: the gradient, with its norm bound, and what it covers), checked by the learner's
        gate on receipt like a trajectory; None (the default): the algorithm takes none."""
        return None

    # -- actor side (actors and the agent server)
    def make_policy(self, model: torch.nn.Module, *, actor_index: int, num_actors: int, seed: int) -> Policy:
        raise NotImplementedError

    def make_recorder(self, model: torch.nn.Module, *, num_envs: int, sender) -> Recorder:
        """A recorder for one stream of `num_envs` envs that hands its frames to `sender`
        (zrl.actors.sender.Sender); `model` is the acting copy (some score data with it)."""
        raise NotImplementedError

    def make_actor(self, model: torch.nn.Module, *, num_envs: int, actor_index: int, num_actors: int, seed: int, sender) -> ActorAlgo:
        policy = self.make_policy(model, actor_index=actor_index, num_actors=num_actors, seed=seed)
        return ActorAlgo(policy, self.make_recorder(model, num_envs=num_envs, sender=sender))

    def make_eval_policy(self, model: torch.nn.Module, greedy: bool = True) -> Policy:
        """A policy for evaluation: greedy, or sampled (records nothing)."""
        raise NotImplementedError

    def deterministic_policy(self, model: torch.nn.Module) -> torch.nn.Module:
        """The policy's deterministic action as one module (zrl.models.deterministic): obs
        [B, *obs] in the env's dtype -> actions [B, *action], normalisation and bounds inside;
        (obs, h, c) -> (action, h, c) for an LSTM core. `zrl.load` acts with it, `zrl export`
        writes it. This default is an actor-critic's mode."""
        return actor_critic_mode(model, self.action_spec)

    # -- learner side: state and update
    def setup(self, device: torch.device, env_steps: int = 0) -> None:
        """Builds the learner's state on `device`: the network actors get (`model`, its
        parameters views of one buffer, `flat`), its optimiser and learning-rate schedule. An algorithm with more (target nets, other
        optimisers) extends this."""
        self.device = device
        self.model = self.build_model().to(device)
        self.flat = flatten_parameters(self.model)  # the buffer publishing reads, before the optimiser
        # (Statistics such as an observation normaliser's are parameters that take no gradient.)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.config.learner, self.params)
        self.schedule = EnvStepSchedule(self.optimizer, self.config.learner, env_steps)

    def update(self, batch: dict[str, torch.Tensor], env_steps: int) -> dict[str, torch.Tensor]:
        """Trains on one batch; returns its metrics as tensors (read only when logged).
        `env_steps`, the steps received so far, drives the learning-rate schedule."""
        self.schedule.advance(env_steps)
        loss, stats = self.loss(self.model, batch)
        stats.update(gradient_step(self.optimizer, self.params, loss, self.config.learner.max_grad_norm, self.gradient_reduce))
        self.after_update(self.model, batch, stats)
        self.observe_inputs(batch)
        return stats

    def observe_inputs(self, batch: dict[str, torch.Tensor]) -> None:
        """After an update: the model's observation normaliser (model.normalize_obs) takes in
        the batch's observations, so the next update, and the actors with the next weights,
        see the new statistics."""
        norm = getattr(self.model, "obs_norm", None)
        if norm is not None and "obs" in batch:
            obs = batch["obs"]
            norm.update(obs.reshape(-1, norm.mean.numel()))

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Runs the network's forward passes inside `self.autocast(device)` and casts their outputs to float32."""
        raise NotImplementedError

    def after_update(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], info: dict[str, Any]) -> None:
        """Called after each optimiser step (priority updates, target syncs)."""

    def autocast(self, device: torch.device):
        """The learner's forward-pass precision (`learner.precision`): bf16 autocast, or nothing."""
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=resolve_precision(self.config.learner.precision, device) == "bf16")

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the learner's state: `model`, `optimizer`, and the
        algorithm's own extras under `algo`."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "algo": self.state_dict()}

    def restore(self, state: dict[str, Any], optimizer_matches: bool) -> None:
        """Loads a checkpoint's `checkpoint_state`; the optimiser's moments only where it was
        the same optimiser (its settings stay the config's). Raises on a state that does not fit."""
        self.model.load_state_dict(state["model"])
        if optimizer_matches:
            restore_optimizer(self.optimizer, state["optimizer"], self.config.learner)
        self.load_state_dict(state.get("algo", {}))

    def state_dict(self) -> dict[str, Any]:
        """Extra learner state to checkpoint (target network, replay, ...)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def waiting_for(self) -> str | None:
        """What the learner waits for while it cannot update (its console line says it), or None for data."""
        return None

    # -- learner side: what arrives
    def env_steps(self, msg: wire.Message, bindings: dict[str, int]) -> int:
        raise NotImplementedError

    # -- learner side: batch_source "stream"
    def columns(self, msg: wire.Message, bindings: dict[str, int]) -> int:
        """How many batch columns a message fills."""
        raise NotImplementedError

    def collate(self, msgs: list[wire.Message], device: torch.device) -> dict[str, torch.Tensor]:
        """The batch of these chunks on device; RejectedChunks for chunks whose `at_join`
        fields broke their schema's rules as they were copied."""
        raise NotImplementedError

    def joins_schema_checks(self) -> bool:
        """Whether the `collate` this class runs is the one its schema's `at_join` fields were
        declared for: the class that defines trajectory_schema defines collate too, or
        derives from the one that does. A subclass that joins its own way must declare its
        schema again; until it does, the learner's gate keeps every check."""
        def owner(name: str) -> type:
            return next(k for k in type(self).__mro__ if name in vars(k))

        return issubclass(owner("trajectory_schema"), owner("collate"))

    # -- learner side: batch_source "replay" (see apex_dqn)
    def ingest(self, msg: wire.Message, bindings: dict[str, int]) -> None:
        raise NotImplementedError

    def sample(self, device: torch.device) -> dict[str, torch.Tensor] | None:
        raise NotImplementedError
