"""Recording envs that are served in batches of whichever finished first.

An actor's K envs are recorded as G fixed groups of W = K / G envs, one
recorder per group, each chunk W columns wide (see zrl.actors.actor). In
ale_py's asynchronous mode (`AleVectorEnv` with a batch_size of W) the policy
instead acts on the first W envs to finish a step, whichever group they are
in, so the emulator threads never wait for the slowest env of a fixed group.
`ReadyStreams` turns those batches back into the groups' steps:

- `act(ids, obs)` runs the policy on a batch (the rows of a recurrent state
  gathered for the batch's envs, and scattered back after) and keeps each
  env's action and extras until its step comes back.
- `observe(step)` files each row under its env (a row of an env that was
  given no action yet is its first observation), and whenever every env of a
  group has a finished step queued, hands the group's recorder that step, as
  record(actions, extras) then observe(Step), the calls a fixed group makes.

The recorders see exactly what a fixed group would have given them; only the
order in which the envs were stepped differs. Envs drift apart by a few steps
at most (the emulator threads serve them first come, first served), so the
queues stay short; each queued step keeps its batch's observation array
alive, not a copy of its row.
"""
from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from zrl.algorithms.base import Policy, Recorder
from zrl.envs import Step


class ReadyStreams:
    """K envs, recorded as len(recorders) fixed groups of envs [g * W, (g + 1) * W), acted on in
    batches of any envs. Not thread-safe: the actor's loop owns it.

    Batches are a few envs, so the bookkeeping is per env in plain Python (numpy's per-call
    cost would dominate it); each group step is assembled into arrays once, for its recorder."""

    def __init__(self, policy: Policy, recorders: list[Recorder], width: int):
        self.policy = policy
        self.recorders = recorders
        self.width = width
        self.num_envs = n = width * len(recorders)
        self.state = policy.initial_state(n)  # None, or a tuple of [K, ...] arrays
        self._acting: list[tuple | None] = [None] * n  # env k's step in flight: (action, extras values)
        self._done: list[deque] = [deque() for _ in range(n)]  # finished steps, oldest first
        self._first: list[np.ndarray | None] = [None] * n  # first observations of groups not yet begun
        self._begun = [False] * len(recorders)
        self._layout: tuple | None = None  # (action dtype, [(extra's name, dtype)]), from the first act

    @property
    def policy_version(self) -> int:
        return self.recorders[0].policy_version

    @policy_version.setter
    def policy_version(self, v: int) -> None:
        for r in self.recorders:
            r.policy_version = v

    def version_needed(self) -> int | None:
        """The newest version any group's recorder needs before the next act (None: any)."""
        needs = [v for v in (r.version_needed() for r in self.recorders) if v is not None]
        return max(needs) if needs else None

    def act(self, ids: np.ndarray, obs: np.ndarray) -> np.ndarray:
        """Actions for the envs `ids` ([B]) from their observations `obs` ([B, ...])."""
        state = None if self.state is None else tuple(x[ids] for x in self.state)
        actions, extras = self.policy.act(obs, state)
        new_state = extras.pop("state", None)
        if self.state is not None:
            for x, y in zip(self.state, new_state):
                x[ids] = y
        if self._layout is None:
            self._layout = (actions.dtype, [(name, v.dtype) for name, v in extras.items()])
        # Per row: Python values for 1-d arrays (cheap to gather again), row views for the others.
        columns = [v.tolist() if v.ndim == 1 else list(v) for v in (actions, *extras.values())]
        for k, values in zip(ids.tolist(), zip(*columns)):
            self._acting[k] = values
        return actions

    def observe(self, step: Step) -> tuple[list[Any], np.ndarray]:
        """Files a batch's rows under their envs; returns (the frames the groups' recorders cut
        from the steps that completed, a [B] mask of the rows that were steps, not first
        observations)."""
        ids = step.env_ids
        if self.state is not None:
            done = step.terminated | step.truncated
            if done.any():
                for x in self.state:
                    x[ids[done]] = 0.0
        stepped = np.ones(len(ids), np.bool_)
        touched = set()
        reward, terminated, truncated = step.reward.tolist(), step.terminated.tolist(), step.truncated.tolist()
        finals, obs, W = step.final_obs, step.obs, self.width
        for i, k in enumerate(ids.tolist()):
            acting = self._acting[k]
            if acting is None:  # env k's first observation
                stepped[i] = False
                self._first[k] = obs[i]
            else:
                self._acting[k] = None
                self._done[k].append((acting, reward[i], terminated[i], truncated[i], obs[i], finals.get(i) if finals else None))
            touched.add(k // W)
        frames: list[Any] = []
        for g in sorted(touched):
            frames += self._flush(g)
        return frames, stepped

    def begin(self, ids: np.ndarray, obs: np.ndarray) -> None:
        """The first batch (from reset): the first observations of its envs."""
        for i, k in enumerate(ids.tolist()):
            self._first[k] = obs[i]

    def _flush(self, g: int) -> list[Any]:
        """Hands group g's recorder every step all its envs have finished."""
        envs = range(g * self.width, (g + 1) * self.width)
        rec = self.recorders[g]
        if not self._begun[g]:
            if any(self._first[k] is None for k in envs):
                return []
            rec.begin(np.stack([self._first[k] for k in envs]))
            for k in envs:
                self._first[k] = None
            self._begun[g] = True
        queues = [self._done[k] for k in envs]
        ready = min(len(q) for q in queues)
        if not ready:
            return []
        action_dtype, extras = self._layout
        frames: list[Any] = []
        for _ in range(ready):
            rows = [q.popleft() for q in queues]
            acted = [r[0] for r in rows]
            rec.record(np.array([a[0] for a in acted], action_dtype),
                       {name: np.array([a[j] for a in acted], dtype) for j, (name, dtype) in enumerate(extras, 1)})
            final = {c: r[5] for c, r in enumerate(rows) if r[5] is not None}
            obs = rec.obs_buffer()  # the rows go straight where the recorder keeps them
            if obs is None:
                obs = np.stack([r[4] for r in rows])
            else:
                for c, r in enumerate(rows):
                    obs[c] = r[4]
            step = Step(obs, np.array([r[1] for r in rows], np.float32),
                        np.array([r[2] for r in rows], np.bool_), np.array([r[3] for r in rows], np.bool_), final)
            frames += rec.observe(step)
        return frames
