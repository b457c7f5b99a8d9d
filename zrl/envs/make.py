"""Making envs from the config: `make_vector_env` imports env.packages (modules that register
a user's own envs), then picks the backend for env.id (Atari ids through zrl.envs.atari,
others gymnasium); `probe_specs` reads an env's specs. Every process makes its envs here, so
env.packages reaches the learner, the actors, the agent server and eval alike."""
from __future__ import annotations

import importlib

from zrl import env_ids, spaces
from zrl.config import ConfigError, EnvConfig
from zrl.envs.vector import GymnasiumVectorEnv, VectorEnv

__all__ = ["import_env_packages", "make_vector_env", "probe_specs"]


def import_env_packages(packages) -> None:
    """Imports each module (env.packages, --env-package) so that the envs it registers can be made."""
    for name in packages:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ConfigError(f"env.packages: cannot import {name!r}: {e} (it must be importable in every zrl process: "
                              "install it, e.g. pip install -e ., or put its folder on PYTHONPATH)") from None


def make_vector_env(cfg: EnvConfig, num_envs: int, seed: int) -> VectorEnv:
    """K envs of cfg.id: Atari ids through zrl.envs.atari (cfg.backend picks C++ or gymnasium), others gymnasium."""
    import_env_packages(cfg.packages)
    if env_ids.needs_ale_py(cfg.id):
        raise ConfigError(f"env.id {cfg.id!r}: {env_ids.ATARI_INSTALL}")
    from zrl.envs.atari import is_atari, make_atari_env  # lazy: it loads gymnasium, which only env-making needs

    if is_atari(cfg.id):
        return make_atari_env(cfg, num_envs, seed)
    if cfg.backend == "ale_vector":
        raise ConfigError(f"env.backend ale_vector runs Atari games only, and {cfg.id!r} is not one")
    try:
        return GymnasiumVectorEnv(cfg, num_envs, seed)
    except ImportError as e:  # env.id's `module:` part (a custom env) cannot be imported
        raise ConfigError(f"env.id: cannot make {cfg.id!r}: {e}") from None


def probe_specs(cfg: EnvConfig) -> tuple[spaces.Spec, spaces.Spec]:
    """The observation and action specs of the configured env (makes and closes one)."""
    env = make_vector_env(cfg, 1, 0)
    try:
        return env.observation_spec, env.action_spec
    finally:
        env.close()
