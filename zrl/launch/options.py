"""What `zrl run` was asked to do: the options the supervisor and the summary read. The
config is the run's own (the children read it from LOGDIR/config.yaml)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from zrl.typed_config import ConfigError


def check_something_feeds_the_learner(cfg) -> None:
    """A run with no actors and no agent server would only wait for its time limit: ConfigError."""
    if cfg.run.num_actors == 0 and not cfg.run.agent_server:
        raise ConfigError("nothing would feed the learner: run.num_actors is 0 (--actors 0) and run.agent_server is false. "
                          "Give --actors N (N > 0), or -o run.agent_server=true to train on the clients of an agent server "
                          "(as configs/cartpole_serve.yaml does)")
    n = cfg.learner.num_learners
    if n > 1 and cfg.run.num_actors < n:
        raise ConfigError(f"learner.num_learners is {n} but run.num_actors is {cfg.run.num_actors}: zrl run gives each learner "
                          f"actors of its own (actor i feeds learner i mod {n}), and a learner without any would hold the group up")


@dataclass
class RunOptions:
    num_actors: int
    seed: int
    logdir: str
    bind: str | None = None
    stop_at_return: float | None = None
    max_seconds: float | None = None
    max_env_steps: int | None = None
    resume: bool = False
    t_start: float = field(default_factory=time.time)
    max_restarts: int = 10  # per actor
    fork: bool = hasattr(os, "fork")  # children forked from this process (fast start) or exec'd
    restart_backoff_s: tuple[float, float] = (0.5, 30.0)  # first delay, cap (doubling)
    # The children's output through this process (zrl.launch.relay); None: when stdout is a
    # terminal, which then shows a live status line.
    relay: bool | None = None
    live: bool = True  # the live status line, where stdout is a terminal
