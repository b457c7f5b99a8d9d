"""The algorithm seam: what an algorithm must provide to the actor and learner pipelines."""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import numpy as np
import torch

from zrl import spaces, wire
from zrl.config import Config
from zrl.cpu import cpu_flags
from zrl.envs import Step

# Builds the header and returns the frame for a message an actor algorithm
# filled: (OutMessage | None, fallback arrays | None, rows) -> frame bytes.
FrameFn = Callable[..., Any]


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


class Sender:
    """Frames an actor's messages: its sender id and a running sequence number.

    With a `link` (the actor's LearnerLink, or anything whose `pusher` is a
    transport.Pusher), `finish` also sends the message through the link's current
    pusher if it can go without waiting, and then returns None; else it returns
    the frame, for the caller to send (and wait, or drop) as any other.
    """

    def __init__(self, sender_id: int, link=None):
        self.sender_id = sender_id
        self.seq = 0
        self.link = link

    def finish(self, msg: wire.OutMessage, policy_version: int, rows: "wire.Cut | dict[str, int] | None" = None):
        self.seq += 1
        if self.link is not None:
            return self.link.pusher.send(msg, self.sender_id, self.seq, policy_version, rows)
        return msg.finish(sender_id=self.sender_id, seq=self.seq, policy_version=policy_version, rows=rows)

    def encode(self, kind: wire.Kind, arrays, policy_version: int, meta=None) -> bytearray:
        self.seq += 1
        return wire.encode(kind, arrays, meta, sender_id=self.sender_id, seq=self.seq, policy_version=policy_version)


class RejectedChunks(Exception):
    """Raised by `Algorithm.collate` when chunks broke a rule it checks as it copies them
    (`checked_at_join`): `errors` maps the index of each such message to its WireError.
    The learner counts and drops those and makes the batch again from the rest."""

    def __init__(self, errors: dict[int, wire.WireError]):
        super().__init__(f"{len(errors)} chunk(s) rejected at the join: " + "; ".join(str(e) for e in errors.values()))
        self.errors = errors


class Algorithm:
    name: ClassVar[str]
    uses_replay: ClassVar[bool] = False
    # Arrays whose per-element rules (finite floats, `value_bounds`) `collate` checks as it
    # copies each element into the batch (raising RejectedChunks), so that the learner's
    # gate need not read them on the receiving thread: a second read of every value, on
    # another core than the one whose I/O thread wrote it (bench/TRANSPORT.md). Marks
    # (`value_marks`) stay at the gate. Empty: the gate checks everything. The learner
    # reads it through `join_checks`.
    checked_at_join: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, config: Config, obs_spec: spaces.Spec, action_spec: spaces.Spec):
        self.config = config
        self.obs_spec = obs_spec
        self.action_spec = action_spec

    # -- both sides
    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def trajectory_schema(self, max_columns: int) -> wire.Schema:
        """What a TRAJECTORY message must carry; checked by the learner on receive."""
        raise NotImplementedError

    # -- actor side (actors and the agent server)
    def make_policy(self, model: torch.nn.Module, *, actor_index: int, num_actors: int, seed: int) -> Policy:
        raise NotImplementedError

    def make_recorder(self, model: torch.nn.Module, *, num_envs: int, sender: Sender) -> Recorder:
        """A recorder for one stream of `num_envs` envs; `model` is the acting copy (some score data with it)."""
        raise NotImplementedError

    def make_actor(self, model: torch.nn.Module, *, num_envs: int, actor_index: int, num_actors: int, seed: int, sender: Sender) -> ActorAlgo:
        policy = self.make_policy(model, actor_index=actor_index, num_actors=num_actors, seed=seed)
        return ActorAlgo(policy, self.make_recorder(model, num_envs=num_envs, sender=sender))

    def make_eval_policy(self, model: torch.nn.Module, greedy: bool = True) -> Policy:
        """A policy for evaluation: greedy, or sampled (records nothing)."""
        raise NotImplementedError

    # -- learner side
    def waiting_for(self) -> str | None:
        """What the learner waits for while it cannot update (its console line says it), or None for data."""
        return None

    # -- learner side, stream mode
    def columns(self, msg: wire.Message, bindings: dict[str, int]) -> int:
        """How many batch columns a message fills."""
        raise NotImplementedError

    def env_steps(self, msg: wire.Message, bindings: dict[str, int]) -> int:
        raise NotImplementedError

    def check_values(self, msg: wire.Message, bindings: dict[str, int]) -> None:
        """Content checks a schema cannot express (index ranges, action bounds); raise wire.WireError.
        By default, `value_bounds` then `value_marks`. An algorithm that checks more overrides
        this, and its frames then stay on the learner's Python path (`gate_rules`)."""
        bounds, marks = self.value_rules(bindings)
        if bounds:
            wire.check_bounds(msg, bounds)
        if marks:
            wire.check_marks(msg, marks)

    def value_bounds(self, bindings: dict[str, int]) -> dict[str, int] | None:
        """{integer array: bound}: every element, read as unsigned, must be < bound."""
        return None

    def value_marks(self, bindings: dict[str, int]) -> list[tuple[str, str, str]] | None:
        """[(index, marked, excluded)]: `index` lists exactly where `marked` is set, in order,
        and `excluded` is not set there (wire.check_marks). Checked after the bounds."""
        return None

    def value_rules(self, bindings: dict[str, int]):
        """(value_bounds, value_marks): what the default check_values checks."""
        return self.value_bounds(bindings), self.value_marks(bindings)

    def join_checks(self) -> frozenset[str]:
        """`checked_at_join` for the learner's gate, if the `collate` this class runs is the
        one that declared them; else nothing (the gate checks everything): a subclass that
        overrides collate must declare what its own join checks."""
        for klass in type(self).__mro__:
            if "checked_at_join" in vars(klass):
                return self.checked_at_join if getattr(klass, "collate", None) is type(self).collate else frozenset()
        return frozenset()

    def gate_rules(self):
        """`value_rules` for the learner's C++ gate (wire.Gate) if those rules are all that
        check_values checks (it is not overridden), else None: the gate then never vouches."""
        return self.value_rules if type(self).check_values is Algorithm.check_values else None

    def collate(self, msgs: list[wire.Message], device: torch.device) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """Runs the network's forward passes inside `self.autocast(device)` and casts their outputs to float32."""
        raise NotImplementedError

    def autocast(self, device: torch.device):
        """The learner's forward-pass precision (`learner.precision`): bf16 autocast, or nothing."""
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=resolve_precision(self.config.learner.precision, device) == "bf16")

    # -- learner side, replay mode (see apex_dqn)
    def ingest(self, msg: wire.Message, bindings: dict[str, int]) -> None:
        raise NotImplementedError

    def sample(self, device: torch.device) -> dict[str, torch.Tensor] | None:
        raise NotImplementedError

    def after_update(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], info: dict[str, Any]) -> None:
        """Called after each optimiser step (priority updates, target syncs)."""

    def state_dict(self) -> dict[str, Any]:
        """Extra learner state to checkpoint (target network, replay, ...)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
