"""The observation and action specs a run trains for, known from its config alone.

`server.observation_space` and `server.action_space` where the config sets them
(a simulator behind the agent server need not be a Gymnasium env), else the
specs of `env.id`, read from one env made and closed. The learner builds its
model from these before any peer connects, and the agent server checks its
clients against them.
"""
from __future__ import annotations

from zrl import spaces
from zrl.config import Config
from zrl.envs.make import probe_specs
from zrl.typed_config import ConfigError


def config_specs(config: Config) -> tuple[spaces.Spec, spaces.Spec]:
    """(obs, action) specs of a config; ConfigError if neither the server.* specs nor env.id give them."""
    sc = config.server
    obs = spaces.from_json(sc.observation_space) if sc.observation_space is not None else None
    act = spaces.from_json(sc.action_space) if sc.action_space is not None else None
    if obs is None or act is None:
        env_obs, env_act = _env_specs(config)
        obs, act = obs or env_obs, act or env_act
    return obs, act


def _env_specs(config: Config) -> tuple[spaces.Spec, spaces.Spec]:
    try:
        return probe_specs(config.env)
    except Exception as e:  # noqa: BLE001 - gymnasium's errors are many: name the key either way
        raise ConfigError(f"env.id: cannot make {config.env.id!r} to read its observation and action specs ({type(e).__name__}: {e}); "
                          "install it, or set server.observation_space and server.action_space") from None
