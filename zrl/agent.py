"""`zrl.load(path) -> Agent`: a trained policy acting from Python, on one observation or a batch.

The agent acts deterministically with its algorithm's `deterministic_policy` module (the
observation normalisation and the action's rescaling or clipping to bounds inside), which
is also what `zrl export` writes, so an exported file and the agent agree by construction.
Sampled actions come from the algorithm's evaluation policy, clipped to the same bounds.
docs/API.md describes what an agent takes and gives.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from zrl import algorithms, checkpoint, spaces
from zrl.algorithms.base import Algorithm, Policy
from zrl.checkpoint import CheckpointError
from zrl.config import Config, config_from_dict
from zrl.models.deterministic import ActionForm

__all__ = ["Agent", "Restored", "load", "restore"]


@dataclass(frozen=True)
class Restored:
    """A checkpoint's model, rebuilt: where it came from, its config, algorithm and weights (eval mode, CPU)."""

    path: Path
    config: Config
    algo: Algorithm
    model: torch.nn.Module


def restore(path: str | Path, best: bool = False) -> Restored:
    """The model a checkpoint holds (checkpoint.find: with `best`, a logdir's best.pt), rebuilt
    from its config and specs, its weights loaded."""
    p, state = checkpoint.find(path, best)
    if "obs_spec" not in state or "action_spec" not in state:
        raise CheckpointError(f"{p}: it names no observation and action specs, so its model cannot be rebuilt")
    cfg = config_from_dict(state["config"], source=str(p))
    specs = spaces.from_json(state["obs_spec"]), spaces.from_json(state["action_spec"])
    algo = algorithms.get(cfg.algo.name)(cfg, *specs)
    model = algo.build_model()
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:  # (torch lists every tensor that does not fit)
        raise CheckpointError(f"{p}: its weights do not fit the model its config describes "
                              f"(model: {cfg.to_dict()['model']}): {str(e).splitlines()[0]}") from None
    model.eval().requires_grad_(False)
    return Restored(p, cfg, algo, model)


def load(path: str | Path) -> "Agent":
    """An agent acting with the policy of a checkpoint: a .pt file, a checkpoints folder, a run's
    logdir or a folder of runs (the newest checkpoint of the newest run). FileNotFoundError or
    CheckpointError say what is amiss."""
    return Agent(restore(path))


class Agent:
    """A trained policy. `act(obs)` takes one observation of the env (as `gymnasium.make`
    gives it; Atari: zrl's preprocessed frames) or a batch [B, *obs], and gives one action in
    the env's form (int for Discrete, numpy array for Box) or a batch of them. A recurrent
    agent (`recurrent`) takes and returns its core state: `act(obs, state) -> (action, state)`."""

    def __init__(self, restored: Restored):
        self.checkpoint = restored.path
        self.config = restored.config
        self.obs_spec: spaces.BoxSpec = restored.algo.obs_spec
        self.action_spec: spaces.Spec = restored.algo.action_spec
        self.policy: torch.nn.Module = restored.algo.deterministic_policy(restored.model).eval()
        self.recurrent = bool(getattr(restored.model, "recurrent", False))
        self.lstm_size = self.config.model.lstm_size if self.recurrent else 0
        self._sampler: Policy = restored.algo.make_eval_policy(restored.model, greedy=False)
        self._form = ActionForm(self.action_spec)

    def __repr__(self) -> str:
        return (f"Agent({self.config.algo.name} on {self.config.env.id}, obs {self.obs_spec.to_json()}, "
                f"actions {self.action_spec.to_json()}, checkpoint {str(self.checkpoint)!r})")

    def initial_state(self, n: int = 1) -> tuple[np.ndarray, np.ndarray] | None:
        """The core state (h, c), float32 [n, lstm_size] each, zero, at an episode's start; None
        for a feed-forward agent. Start each episode from it again."""
        if not self.recurrent:
            return None
        return np.zeros((n, self.lstm_size), np.float32), np.zeros((n, self.lstm_size), np.float32)

    def act(self, obs, state=None, deterministic: bool = True):
        """One observation -> one action, a batch [B, *obs] -> a batch of actions; a recurrent
        agent returns (action, next state), from `state` (None: the initial state)."""
        batch, single = self._batch(obs)
        if self.recurrent:
            state = self._state(state, len(batch))
        elif state is not None:
            raise ValueError("this agent's policy is feed-forward: it takes no state")
        with torch.inference_mode():
            actions, state = (self._mode if deterministic else self._sample)(batch, state)
        action = _unbatch(actions, self.action_spec) if single else actions
        return (action, state) if self.recurrent else action

    def _mode(self, batch: np.ndarray, state):
        x = torch.from_numpy(batch)
        if not self.recurrent:
            return self.policy(x).numpy(), None
        a, h, c = self.policy(x, *(torch.from_numpy(s) for s in state))
        return a.numpy(), (h.numpy(), c.numpy())

    def _sample(self, batch: np.ndarray, state):
        actions, extras = self._sampler.act(batch, state)
        return self._form(torch.as_tensor(actions)).numpy(), extras.get("state")

    def _batch(self, obs) -> tuple[np.ndarray, bool]:
        """obs as a contiguous batch of the spec's dtype, and whether it was one observation."""
        x = np.asarray(obs)
        shape = tuple(self.obs_spec.shape)
        if x.shape == shape:
            single = True
        elif x.ndim == len(shape) + 1 and x.shape[1:] == shape:
            single = False
        else:
            raise ValueError(f"expected one observation of shape {shape} or a batch of shape (B, {', '.join(map(str, shape))}), "
                             f"got shape {x.shape}")
        dtype = self.obs_spec.np_dtype
        if dtype == np.uint8 and x.dtype.kind == "f":
            raise ValueError("this policy takes uint8 observations (image frames 0..255), got floats")
        batch = np.ascontiguousarray(x, dtype=dtype)
        return (batch[None] if single else batch), single

    def _state(self, state, n: int) -> tuple[np.ndarray, np.ndarray]:
        if state is None:
            return self.initial_state(n)
        h, c = (np.ascontiguousarray(s, dtype=np.float32) for s in state)
        want = (n, self.lstm_size)
        if h.shape != want or c.shape != want:
            raise ValueError(f"state: expected (h, c) of shape {want} each (agent.initial_state({n})), "
                             f"got {h.shape} and {c.shape}")
        return h, c


def _unbatch(actions: np.ndarray, action_spec: spaces.Spec):
    """The one action of a batch of one: a Python int for Discrete, an array for Box."""
    return int(actions[0]) if isinstance(action_spec, spaces.DiscreteSpec) else actions[0]
