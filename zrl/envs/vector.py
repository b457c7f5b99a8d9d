"""The vectorised env interface zrl steps: `VectorEnv` (K envs, same-step autoreset,
split-phase stepping), the `Step` it returns, and `GymnasiumVectorEnv`, K gymnasium
envs in a plain loop."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zrl import spaces
from zrl.config import ConfigError, EnvConfig

__all__ = ["Step", "VectorEnv", "GymnasiumVectorEnv"]


@dataclass
class Step:
    obs: np.ndarray  # [K, *obs]: next observations (reset ones where an episode ended)
    reward: np.ndarray  # [K] float32
    terminated: np.ndarray  # [K] bool
    truncated: np.ndarray  # [K] bool (and not terminated)
    final_obs: dict[int, np.ndarray]  # row -> last observation, for truncated envs
    env_ids: np.ndarray | None = None  # [B] int32: the env of each row, where the rows are a batch of
    # whichever envs finished first (AleVectorEnv with a batch_size); None: row k is env k


class VectorEnv:
    num_envs: int
    observation_spec: spaces.Spec
    action_spec: spaces.Spec

    def reset(self) -> np.ndarray:
        raise NotImplementedError

    def step(self, actions: np.ndarray) -> Step:
        raise NotImplementedError

    # Split-phase stepping, so an actor can run inference for one group of envs
    # while another steps. Backends that step in their own threads (ale_vector)
    # return from step_async at once; the default just steps in step_wait.
    def step_async(self, actions: np.ndarray) -> None:
        self._pending_actions = actions

    def step_wait(self) -> Step:
        return self.step(self._pending_actions)

    def close(self) -> None:
        pass


class GymnasiumVectorEnv(VectorEnv):
    """K gymnasium envs stepped in a plain loop, writing into preallocated arrays.

    Measured faster than gymnasium's SyncVectorEnv here (no info merging or
    per-step copies), and it gives same-step autoreset for any env.
    """

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int):
        self.envs = self._make_envs(cfg, num_envs)
        self.num_envs = num_envs
        self.seed = seed
        self.observation_spec = spaces.from_gym(self.envs[0].observation_space)
        self.action_spec = spaces.from_gym(self.envs[0].action_space, per_element_bounds=True)
        obs_dtype = np.dtype(self.observation_spec.dtype)
        self._obs = np.zeros((num_envs, *self.observation_spec.shape), obs_dtype)
        self._reward = np.zeros(num_envs, np.float32)
        self._term = np.zeros(num_envs, np.bool_)
        self._trunc = np.zeros(num_envs, np.bool_)
        self._discrete = isinstance(self.action_spec, spaces.DiscreteSpec)
        # A Gaussian policy's samples are unbounded: the env gets them clipped to its bounds
        # (the recorded action, which the loss scores, stays the sample).
        space = self.envs[0].action_space
        self._action_bounds = None if self._discrete else (np.asarray(space.low, np.float32), np.asarray(space.high, np.float32))

    def _make_envs(self, cfg: EnvConfig, num_envs: int) -> list:
        import gymnasium as gym  # lazy: slow to import, and only making envs needs it

        kwargs = dict(cfg.kwargs)
        if cfg.max_episode_steps is not None:
            kwargs["max_episode_steps"] = cfg.max_episode_steps
        try:
            return [gym.make(cfg.id, disable_env_checker=True, **kwargs) for _ in range(num_envs)]
        except gym.error.Error as e:
            raise ConfigError(f"env.id: cannot make {cfg.id!r}: {e}") from None
        except TypeError as e:  # a keyword the env does not take
            raise ConfigError(f"env.kwargs: cannot make {cfg.id!r} with {kwargs}: {e}") from None

    def _episode_over(self, terminated: bool, truncated: bool, info: dict) -> bool:
        """Whether the env must be reset (a subclass may keep a game going past a terminal life)."""
        return terminated or truncated

    def reset(self) -> np.ndarray:
        for k, env in enumerate(self.envs):
            self._obs[k], _ = env.reset(seed=self.seed + k)
        return self._obs.copy()

    def step(self, actions: np.ndarray) -> Step:
        obs, rew, term, trunc = self._obs, self._reward, self._term, self._trunc
        final: dict[int, np.ndarray] = {}
        acts = actions.tolist() if self._discrete else np.clip(actions, *self._action_bounds)
        for k, env in enumerate(self.envs):
            o, r, te, tr, info = env.step(acts[k])
            rew[k] = r
            term[k] = te
            trunc[k] = tr and not te
            if tr and not te:
                final[k] = np.array(o)  # a copy: wrappers may reuse their buffers
            if self._episode_over(te, tr, info):
                o, _ = env.reset()
            obs[k] = o
        return Step(obs.copy(), rew.copy(), term.copy(), trunc.copy(), final)

    def close(self) -> None:
        for env in self.envs:
            env.close()
