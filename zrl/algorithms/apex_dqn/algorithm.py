"""Ape-X DQN (Horgan et al. 2018): distributed prioritised experience replay.

Actors act epsilon-greedily with their copy of the Q-network (actor i of N
uses eps_i = eps_base ** (1 + eps_alpha * i / (N - 1))), compute n-step
transitions themselves, and send them with initial priorities: |TD error|
under the actor's own network, as in the paper, so the learner never has to
score new data before it can be sampled. A truncated episode's transitions
bootstrap from its final observation; a terminated one's do not.

The learner adds what arrives to a C++ prioritised replay from its receiver
thread (the GIL is released there, so this overlaps with training), samples
batches with importance weights, minimises the weighted Huber loss of double
DQN targets from a target network synced every K updates, and writes the new
|TD errors| back as priorities. Keys of items overwritten in the meantime are
ignored by the replay (its slots carry generations). On a GPU the priorities
reach the replay one update late (`HostPriorities`), so the host samples the
next batch while the GPU trains on this one.
"""
from __future__ import annotations

import copy
import logging
import math
import threading

import numpy as np
import torch

from zrl import spaces, wire
from zrl.algorithms.apex_dqn import ApexDQNConfig
from zrl.algorithms.apex_dqn.frames import FrameReplay, is_frame_stack, split_frames
from zrl.algorithms.base import Algorithm, Policy, Recorder
from zrl.config import Config
from zrl.envs import Step
from zrl.models import QNetwork
from zrl.models.deterministic import GreedyQ
from zrl.replay import PrioritizedReplay

log = logging.getLogger("zrl.learner")

FIELDS = ("obs", "action", "reward", "discount", "next_obs")


def actor_epsilon(hp: ApexDQNConfig, index: int, num_actors: int) -> float:
    if num_actors <= 1:
        return hp.eps_base
    return hp.eps_base ** (1.0 + hp.eps_alpha * index / (num_actors - 1))


class ApexPolicy(Policy):
    """Epsilon-greedy on the Q-network; records Q(s, a) for the initial priorities."""

    def __init__(self, model: QNetwork, epsilon: float, n_actions: int, seed: int):
        self.model = model
        self.epsilon = epsilon
        self.n_actions = n_actions
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray, state=None):
        with torch.inference_mode():
            q = self.model(torch.from_numpy(obs)).float().numpy()
        actions = q.argmax(1)
        explore = self.rng.random(len(actions)) < self.epsilon
        if explore.any():
            actions[explore] = self.rng.integers(0, self.n_actions, int(explore.sum()))
        return actions, {"q_sa": q[np.arange(len(actions)), actions]}


class ApexRecorder(Recorder):
    """n-step transitions for K envs at once, sent with their initial priorities.

    The last n steps of every env sit in ring buffers indexed by step; when
    an env has n pending steps its oldest becomes a transition bootstrapped
    from the current observation, and when its episode ends all pending
    steps are flushed (discount 0 if terminated, gamma^m towards the final
    observation if truncated). Priorities need max_a Q(s', a): the recorder
    scores next observations with the acting network when it sends.
    """

    def __init__(self, algo: "ApexDQN", model: QNetwork, num_envs: int, sender):
        self.model = model
        self.hp = algo.hp
        self.sender = sender
        self.K = num_envs
        self.n = self.hp.n_step
        self.every = algo.config.actor.unroll_length  # send after this many steps
        self.frames_once = algo.frames_once
        # With algo.updates_per_step, each message "costs" its share of the updates: this actor
        # waits for them, so data never queues up (stale) in the sockets while the learner
        # holds the actors back. Its share of min_replay_size it sends freely.
        self.num_actors = max(1, algo.config.run.num_actors)
        self.free_transitions = algo.hp.min_replay_size // self.num_actors
        self.sent = 0
        self.needed: int | None = None
        obs_shape, obs_dtype = tuple(algo.obs_spec.shape), np.dtype(algo.obs_spec.dtype)
        n, K = self.n, self.K
        self.obs_h = np.zeros((n, K, *obs_shape), obs_dtype)
        self.act_h = np.zeros((n, K), np.int64)
        self.rew_h = np.zeros((n, K), np.float32)
        self.qsa_h = np.zeros((n, K), np.float32)
        self.pending = np.zeros(K, np.int64)
        self.t = 0
        self.steps_since_send = 0
        self.out: dict[str, list[np.ndarray]] = {k: [] for k in (*FIELDS, "q_sa")}
        self.powers = self.hp.discount ** np.arange(n + 1, dtype=np.float64)
        self._obs = None

    def begin(self, obs: np.ndarray) -> None:
        self._obs = obs

    def record(self, actions: np.ndarray, extras: dict[str, np.ndarray]) -> None:
        self._actions = actions
        self._q_sa = extras["q_sa"]

    def _emit(self, obs, action, reward, discount, next_obs, q_sa) -> None:
        for k, v in zip((*FIELDS, "q_sa"), (obs, action, reward, discount, next_obs, q_sa)):
            self.out[k].append(v)

    def observe(self, step: Step) -> list:
        n, K, t = self.n, self.K, self.t
        slot = t % n
        self.obs_h[slot] = self._obs
        self.act_h[slot] = self._actions
        self.rew_h[slot] = step.reward
        self.qsa_h[slot] = self._q_sa
        self.pending = np.minimum(self.pending + 1, n)
        done = step.terminated | step.truncated
        full = (self.pending == n) & ~done
        if full.any():
            # The oldest pending step of these envs becomes an n-step transition to obs_{t+1}.
            ring = [(slot + 1 + i) % n for i in range(n)]  # oldest .. newest
            cols = np.flatnonzero(full)
            ret = sum(self.powers[i] * self.rew_h[ring[i], cols] for i in range(n))
            self._emit(
                self.obs_h[ring[0], cols].copy(),
                self.act_h[ring[0], cols].copy(),
                ret.astype(np.float32),
                np.full(len(cols), self.powers[n], np.float32),
                step.obs[cols].copy(),
                self.qsa_h[ring[0], cols].copy(),
            )
            self.pending[cols] = n - 1
        for k in np.flatnonzero(done):
            self._flush_episode(int(k), slot, step)
        self._obs = step.obs
        self.t += 1
        self.steps_since_send += 1
        if self.steps_since_send >= self.every or sum(len(a) for a in self.out["action"]) >= self.hp.max_transitions_per_message:
            self.steps_since_send = 0
            return self._message()
        return []

    def _flush_episode(self, k: int, slot: int, step: Step) -> None:
        m = int(self.pending[k])
        n = self.n
        idx = [(slot - m + 1 + j) % n for j in range(m)]  # the env's pending steps, oldest first
        truncated = bool(step.truncated[k])
        final = step.final_obs.get(k) if truncated else None
        for j in range(m):
            ret = sum(self.powers[i - j] * self.rew_h[idx[i], k] for i in range(j, m))
            steps_left = m - j
            discount = self.powers[steps_left] if truncated else 0.0
            next_obs = final if truncated else self.obs_h[idx[j], k]  # unused when discount is 0
            self._emit(
                self.obs_h[idx[j], k][None].copy(),
                np.array([self.act_h[idx[j], k]]),
                np.array([ret], np.float32),
                np.array([discount], np.float32),
                np.asarray(next_obs)[None].copy(),
                np.array([self.qsa_h[idx[j], k]], np.float32),
            )
        self.pending[k] = 0

    def version_needed(self) -> int | None:
        return self.needed

    def _pace(self, n: int) -> None:
        """After sending n transitions: the version (= updates) the next act waits for."""
        ratio = self.hp.updates_per_step
        self.sent += n
        if ratio is None or self.sent <= self.free_transitions:
            return
        self.needed = max(self.needed or 0, self.policy_version) + math.ceil(n * ratio * self.num_actors)

    def _message(self) -> list:
        if not self.out["action"]:
            return []
        arrays = {k: np.concatenate(v) for k, v in self.out.items()}
        self.out = {k: [] for k in self.out}
        # Initial priorities: |R + discount * max_a Q(s', a) - Q(s, a)| under this actor's net.
        with torch.inference_mode():
            q_next = self.model(torch.from_numpy(arrays["next_obs"])).max(1).values.float().numpy()
        td = arrays["reward"] * self.hp.reward_scale + arrays["discount"] * q_next - arrays.pop("q_sa")
        arrays["priority"] = (np.abs(td) + self.hp.priority_eps).astype(np.float32)
        if self.frames_once:
            arrays["frames"], arrays["obs_frames"], arrays["next_frames"] = split_frames(arrays.pop("obs"), arrays.pop("next_obs"))
        self._pace(len(arrays["action"]))
        return [self.sender.encode(wire.Kind.TRAJECTORY, arrays, self.policy_version)]


class HostPriorities:
    """New priorities on their way from the loss's device to the replay.

    On CPU `put` writes them at once. On a GPU it queues a copy into pinned memory
    behind the update, records an event and returns: the next `put` (or `flush`) waits
    for that event and writes them. By then the next update is queued behind it, so the
    GPU keeps training while the host waits, where a blocking `.cpu()` would leave it
    idle while the host samples the next batch. One update late costs nothing an
    asynchronous learner does not already accept: the batch after may sample an item
    before its priority is updated.
    """

    def __init__(self):
        self.pending: tuple[PrioritizedReplay, np.ndarray] | None = None
        self.host: torch.Tensor | None = None
        self.event = None
        self.stream = None

    def put(self, replay: PrioritizedReplay, keys: np.ndarray, prio: torch.Tensor) -> None:
        self.flush()
        if prio.device.type != "cuda":
            replay.update_priorities(keys, prio.numpy())
            return
        if self.host is None or self.host.shape != prio.shape:
            self.host = torch.empty(prio.shape, dtype=prio.dtype, pin_memory=True)
            self.event = torch.cuda.Event()
        self.stream = torch.cuda.current_stream(prio.device)  # the learner's, on its own GPU
        with torch.cuda.stream(self.stream):
            self.host.copy_(prio, non_blocking=True)
        self.event.record(self.stream)
        self.pending = (replay, keys)

    def flush(self) -> None:
        """Write priorities still in flight (before the next ones, and before a checkpoint)."""
        if self.pending is None:
            return
        (replay, keys), self.pending = self.pending, None
        self.event.synchronize()
        replay.update_priorities(keys, self.host.numpy())


class ApexDQN(Algorithm):
    name = "apex_dqn"

    def __init__(self, config: Config, obs_spec: spaces.Spec, action_spec: spaces.Spec):
        super().__init__(config, obs_spec, action_spec)
        if not isinstance(config.algo, ApexDQNConfig):
            raise ValueError("ApexDQN needs an ApexDQNConfig in config.algo")
        if not isinstance(action_spec, spaces.DiscreteSpec):
            raise ValueError(f"apex_dqn needs discrete actions, got {action_spec.to_json()}")
        self.hp: ApexDQNConfig = config.algo
        self.frames_once = self.hp.frames_once and is_frame_stack(obs_spec)
        self.replay: PrioritizedReplay | FrameReplay | None = None  # learner side only, made on first use
        self.target: QNetwork | None = None
        self._pending_target_state = None
        self._pending_replay_state = None
        self._replay_lock = threading.Lock()  # the receiver's ingest and the trainer's sample both make it
        self._keys: np.ndarray | None = None
        self._priorities = HostPriorities()
        self._updates = 0

    def build_model(self) -> QNetwork:
        return QNetwork(self.config.model, self.obs_spec, self.action_spec, dueling=self.hp.dueling)

    def trajectory_schema(self, max_columns: int) -> wire.Schema:
        obs_shape, obs_dtype = tuple(self.obs_spec.shape), np.dtype(self.obs_spec.dtype)
        F = wire.Field
        max_n = self.hp.max_transitions_per_message + self.hp.n_step * max(1, self.config.actor.num_envs)
        if self.frames_once:
            stack = obs_shape[0]
            observations = [F("frames", obs_dtype, ("M", *obs_shape[1:])), F("obs_frames", np.int64, ("N", stack), bound="M"),
                            F("next_frames", np.int64, ("N", stack), bound="M")]
        else:
            observations = [F("obs", obs_dtype, ("N", *obs_shape)), F("next_obs", obs_dtype, ("N", *obs_shape))]
        return wire.Schema(
            [
                *observations,
                F("action", np.int64, ("N",), bound=self.action_spec.n),
                F("reward", np.float32, ("N",)),
                F("discount", np.float32, ("N",), low=0.0, high=1.0),
                F("priority", np.float32, ("N",), low=0.0, low_open=True),
            ],
            bounds={"N": (1, max_n), "M": (1, 2 * max_n * (obs_shape[0] if self.frames_once else 1))},
        )

    def make_policy(self, model, *, actor_index, num_actors, seed) -> ApexPolicy:
        return ApexPolicy(model, actor_epsilon(self.hp, actor_index, num_actors), self.action_spec.n, seed)

    def make_recorder(self, model, *, num_envs, sender) -> ApexRecorder:
        return ApexRecorder(self, model, num_envs, sender)

    def make_eval_policy(self, model: QNetwork, greedy: bool = True) -> Policy:
        # Greedy, or the paper's evaluation epsilon of 0.001.
        return ApexPolicy(model, 0.0 if greedy else 0.001, self.action_spec.n, seed=12345)

    def deterministic_policy(self, model: QNetwork) -> torch.nn.Module:
        return GreedyQ(model)

    # -- learner: replay
    def env_steps(self, msg: wire.Message, bindings: dict[str, int]) -> int:
        return bindings["N"]

    def _ensure_replay(self) -> PrioritizedReplay:
        if self.replay is not None:
            return self.replay
        with self._replay_lock:
            if self.replay is not None:
                return self.replay
            replay = self._new_replay()
            saved = self._pending_replay_state
            if saved is not None:
                _restore(saved, replay)
            self.replay = replay  # published only once it holds the checkpoint's transitions
            self._pending_replay_state = None
            return replay

    def _new_replay(self) -> PrioritizedReplay | FrameReplay:
        fields = {"action": ((), np.int64), "reward": ((), np.float32), "discount": ((), np.float32), "version": ((), np.int64)}
        hp, shape = self.hp, tuple(self.obs_spec.shape)
        if self.frames_once:
            return FrameReplay(hp.replay_capacity, shape, fields, alpha=hp.priority_alpha, seed=self.config.run.seed)
        obs = (shape, np.dtype(self.obs_spec.dtype))
        return PrioritizedReplay(hp.replay_capacity, {"obs": obs, "next_obs": obs, **fields}, alpha=hp.priority_alpha, seed=self.config.run.seed)

    def ingest(self, msg: wire.Message, bindings: dict[str, int]) -> None:
        a = msg.arrays
        rest = {k: a[k] for k in ("action", "reward", "discount")}
        rest["version"] = np.full(bindings["N"], msg.policy_version, np.int64)
        replay = self._ensure_replay()
        if self.frames_once:
            replay.add(a["frames"], a["obs_frames"], a["next_frames"], rest, a["priority"])
        else:
            replay.add({"obs": a["obs"], "next_obs": a["next_obs"], **rest}, a["priority"])

    def waiting_for(self) -> str | None:
        n = len(self.replay) if self.replay is not None else 0
        if n >= self.hp.min_replay_size:
            return None
        return f"replay {n:,}/{self.hp.min_replay_size:,} transitions (algo.min_replay_size) before learning starts"

    def sample(self, device: torch.device):
        replay = self._ensure_replay()
        if len(replay) < self.hp.min_replay_size:
            return None
        keys, weights, batch = replay.sample(self.hp.batch_size, self.hp.priority_beta)
        if not len(keys):  # (a FrameReplay drew only transitions whose frames it no longer holds)
            return None
        self._keys = keys
        out = {k: torch.from_numpy(v) for k, v in batch.items() if k != "version"}
        out["weights"] = torch.from_numpy(weights)
        if device.type != "cpu":
            out = {k: v.pin_memory().to(device, non_blocking=True) for k, v in out.items()}
        out["_policy_version"] = batch["version"]
        return out

    def loss(self, model: QNetwork, batch: dict[str, torch.Tensor]):
        if self.target is None:
            self.target = copy.deepcopy(model)
            if self._pending_target_state is not None:
                self.target.load_state_dict(self._pending_target_state)
                self._pending_target_state = None
            self.target.requires_grad_(False)
        with self.autocast(batch["obs"].device):
            q = model(batch["obs"]).float().gather(1, batch["action"].unsqueeze(1)).squeeze(1)
            with torch.no_grad():
                if self.hp.double_q:
                    a_star = model(batch["next_obs"]).argmax(1, keepdim=True)
                    q_next = self.target(batch["next_obs"]).float().gather(1, a_star).squeeze(1)
                else:
                    q_next = self.target(batch["next_obs"]).float().max(1).values
        with torch.no_grad():
            target = batch["reward"] * self.hp.reward_scale + batch["discount"] * q_next
        td = target - q
        loss = (batch["weights"] * torch.nn.functional.huber_loss(q, target, reduction="none", delta=self.hp.huber_delta)).mean()
        self._td = td.detach()
        info = {"loss/td": loss.detach(), "q/mean": q.detach().mean(), "q/td_abs": td.detach().abs().mean()}
        if self.frames_once:  # transitions drawn whose frames had left the ring (0 for an Atari actor)
            info["replay/frames_lost"] = torch.tensor(float(self.replay.lost))
        return loss, info

    def after_update(self, model, batch, info) -> None:
        # A target that overflowed (huge but finite rewards or observations) gives an
        # infinite or NaN TD error: the largest finite priority instead, which the replay
        # takes (the update itself was guarded by the learner: no step on non-finite grads).
        td = torch.nan_to_num(self._td.abs(), nan=torch.finfo(self._td.dtype).max)
        self._priorities.put(self.replay, self._keys, td + self.hp.priority_eps)
        self._updates += 1
        if self._updates % self.hp.target_update_interval == 0:
            self.target.load_state_dict(model.state_dict())

    def state_dict(self) -> dict:
        # Until the first update after a resume, the target and replay are still the
        # checkpoint's (pending): a run that stops before then saves them as it found them.
        state = {"updates": self._updates}
        self._priorities.flush()
        if self.target is not None:
            state["target"] = self.target.state_dict()
        elif self._pending_target_state is not None:
            state["target"] = self._pending_target_state
        if self.hp.replay_checkpoint:
            with self._replay_lock:  # not while _ensure_replay is between the two
                live, replay = self.replay, self._pending_replay_state
            if live is not None:
                replay = live.state_dict()
            if replay is not None:
                state["replay"] = {k: torch.from_numpy(np.array(v)) for k, v in replay.items()}  # np.array keeps 0-d shapes
        return state

    def load_state_dict(self, state: dict) -> None:
        self._updates = int(state.get("updates", 0))
        if "target" in state:
            self._pending_target_state = state["target"]
        if "replay" in state:
            self._pending_replay_state = {k: v.numpy() for k, v in state["replay"].items()}


def _restore(saved: dict, replay: PrioritizedReplay | FrameReplay) -> None:
    """A checkpoint's replay into this run's (of the same kind: frames or whole stacks)."""
    if isinstance(replay, FrameReplay):
        saved, replay = replay.load_ring(saved), replay.replay
    elif any(k.startswith("ring/") for k in saved):
        raise ValueError("replay checkpoint: it holds frames (saved with algo.frames_once true), not whole stacks")
    if int(saved["capacity"]) == replay.capacity and float(saved["alpha"]) == replay.alpha:
        replay.load_state_dict(saved)
    else:
        _migrate(saved, replay)


def _migrate(saved: dict, replay: PrioritizedReplay) -> None:
    """Adds a checkpoint's replay (a state_dict of another capacity or priority_alpha)
    to `replay`, oldest first, with the raw priorities it had: a resumed run may grow or
    shrink its replay (the newest items are kept) or change alpha, and keeps its data."""
    size, cursor, capacity = int(saved["size"]), int(saved["cursor"]), int(saved["capacity"])
    order = np.arange(size) if size < capacity else (cursor + np.arange(size)) % capacity  # oldest first
    alpha = float(saved["alpha"])
    priorities = None  # alpha 0 kept no priorities: each item gets the largest one seen
    if size and alpha > 0:
        with np.errstate(over="ignore", under="ignore"):
            raw = np.asarray(saved["scaled_priorities"], np.float64)[order] ** (1.0 / alpha)
        priorities = np.clip(raw, np.finfo(np.float64).tiny, np.finfo(np.float64).max)  # finite and > 0
    if size:
        replay.add({name: np.asarray(saved[f"field/{name}"])[order] for name in replay.fields}, priorities)
    log.warning("replay from the checkpoint (capacity %d, priority_alpha %g) moved into this run's (capacity %d, "
                "priority_alpha %g): %d of its %d transitions kept", capacity, float(saved["alpha"]),
                replay.capacity, replay.alpha, min(size, replay.capacity), size)


ALGORITHM = ApexDQN
