"""What `zrl run` was asked to do: the options the supervisor and the summary read. The
config is the run's own (the children read it from LOGDIR/config.yaml)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field


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
