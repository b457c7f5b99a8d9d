"""Making envs from the config: `make_vector_env` picks the backend for env.id (Atari ids
through zrl.envs.atari, others gymnasium), and `probe_specs` reads an env's specs."""
from __future__ import annotations

from zrl import spaces
from zrl.config import ConfigError, EnvConfig
from zrl.envs.vector import GymnasiumVectorEnv, VectorEnv

__all__ = ["make_vector_env", "probe_specs"]


def make_vector_env(cfg: EnvConfig, num_envs: int, seed: int) -> VectorEnv:
    """K envs of cfg.id: Atari ids through zrl.envs.atari (cfg.backend picks C++ or gymnasium), others gymnasium."""
    from zrl.envs.atari import is_atari, make_atari_env  # lazy: it loads gymnasium, which only env-making needs

    if is_atari(cfg.id):
        return make_atari_env(cfg, num_envs, seed)
    if cfg.backend == "ale_vector":
        raise ConfigError(f"env.backend ale_vector runs Atari games only, and {cfg.id!r} is not one")
    return GymnasiumVectorEnv(cfg, num_envs, seed)


def probe_specs(cfg: EnvConfig) -> tuple[spaces.Spec, spaces.Spec]:
    """The observation and action specs of the configured env (makes and closes one)."""
    env = make_vector_env(cfg, 1, 0)
    try:
        return env.observation_spec, env.action_spec
    finally:
        env.close()
