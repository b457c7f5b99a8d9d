"""Environments, stepped K at a time, with the same-step autoreset zrl needs.

`make_vector_env` returns a `VectorEnv`: `reset()` gives [K, *obs] and
`step(actions)` gives a `Step` whose `obs` already holds the first
observation of a new episode wherever one ended, with the ended episode's
last observation in `final_obs` for the envs that were truncated (so the
learner can bootstrap them; terminated ones need no bootstrap).
"""
from __future__ import annotations

from zrl.envs.make import make_vector_env, probe_specs
from zrl.envs.vector import GymnasiumVectorEnv, Step, VectorEnv

__all__ = ["Step", "VectorEnv", "GymnasiumVectorEnv", "make_vector_env", "probe_specs"]
