"""What a learner's run came to (learner_final.json, which `zrl run` summarises), and its whole-run rates."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass
class LearnerResult:
    env_steps: int
    updates: int
    episodes: int
    train_seconds: float
    final_mean_return: float | None
    reached: bool
    stop_reason: str
    return_source: str = "train"  # "eval": the greedy evaluation actor's episodes
    perf: dict | None = None  # whole-run rates from the first batch on (RunPerf.as_dict)
    reached_after_s: float | None = None  # seconds into run() when the target was reached
    reached_at_unix: float | None = None  # wall clock then (zrl run measures from its own start)
    resumed_env_steps: int = 0  # env_steps counts these, from the checkpoint resumed

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class RunPerf:
    """Whole-run rates from the first batch on (start-up excluded), for the final report
    (`zrl bench pipeline` reads them): time waiting for data and training, samples, lag."""

    def __init__(self):
        self.first_batch_at: float | None = None
        self.env_steps_at_first_batch = 0
        self.wait_s = 0.0
        self.train_s = 0.0
        self.samples = 0

    def got_batch(self, t_wait: float, t_got: float, env_steps: int) -> None:
        if self.first_batch_at is None:
            self.first_batch_at = t_got
            self.env_steps_at_first_batch = env_steps
        else:
            self.wait_s += t_got - t_wait

    def waited(self, t_wait: float) -> float:
        """Seconds since t_wait, a wait for data that brought no batch; counted in the run's total."""
        dt = time.perf_counter() - t_wait
        if self.first_batch_at is not None:
            self.wait_s += dt
        return dt

    def as_dict(self, env_steps: int, run_lag) -> dict:
        if self.first_batch_at is None:
            return {}
        span = max(time.perf_counter() - self.first_batch_at, 1e-9)
        return {
            "seconds": round(span, 3),
            "env_steps_per_s": round((env_steps - self.env_steps_at_first_batch) / span, 1),
            "learner_samples_per_s": round(self.samples / span, 1),
            "train_samples_per_s": round(self.samples / self.train_s, 1) if self.train_s else None,
            "wait_for_data_frac": round(self.wait_s / span, 4),
            "policy_lag_mean": round(run_lag.sum / run_lag.n, 3) if run_lag.n else None,
            "policy_lag_max": run_lag.max if run_lag.n else None,
        }
