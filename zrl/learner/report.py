"""The learner's progress as people and tools read it: a console line and TensorBoard scalars.

`Report.training` logs a stretch of training (the console line keeps its
`steps N` field, which tools read); `Report.waiting` says what the learner waits
for while no update runs. `Report.hyperparameters` and `Report.final_return` fill
TensorBoard's HPARAMS tab: the config as training starts, the mean return as it ends.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import torch

from zrl.learner.progress import Progress, StatsSum
from zrl.metrics import MetricsWriter, Rate

FINAL_RETURN_TAG = "hparams/final_mean_return"


class Report:
    def __init__(self, progress: Progress, metrics: MetricsWriter, queue_fill: Callable[[], tuple[int, int]], endpoint: str = "",
                 optimizer: torch.optim.Optimizer | None = None, group_env_steps: Callable[[], int] | None = None):
        self.progress = progress
        self.group_env_steps = group_env_steps  # a group's first learner reports the group's env steps
        self.optimizer = optimizer  # its learning rate is logged (after any decay)
        self.metrics = metrics
        self.queue_fill = queue_fill  # () -> (chunks queued, queue size)
        self.endpoint = endpoint  # where actors say hello, for the line of a learner no actor has reached

    def training(self, elapsed: float, env_rate: Rate, sample_rate: Rate, samples: int, wait_frac: float, stats: StatsSum) -> None:
        s = self.progress.snapshot()
        env_steps = self.group_env_steps() if self.group_env_steps is not None else s["env_steps"]
        fps = env_rate.read(env_steps)
        queued, size = self.queue_fill()
        scalars = stats.means()
        scalars.update({
            "perf/env_steps_per_s": fps,
            "perf/learner_samples_per_s": sample_rate.read(samples),
            "perf/wait_for_data_frac": wait_frac,
            "perf/queue_depth": queued,
            "actors/connected": s["connected"],
            "policy_lag/mean": s["lag_mean"],
            "policy_lag/max": s["lag_max"],
            "episode/return": s["mean_return"],
            "eval/return": s["eval_return"],
            "episode/length": s["mean_length"],
            "episode/count": s["episodes"],
            "updates": s["updates"],
            "learner/learning_rate": self._learning_rate(),
        })
        scalars.update({f"rejected/{k}": float(v) for k, v in s["rejected"].items()})
        scalars.update({f"discarded/{k}": float(v) for k, v in s["discarded"].items()})
        scalars.update({f"custom/{k}": v for k, v in s["custom"].items()})
        self.metrics.scalars(scalars, env_steps)
        self.metrics.progress({"elapsed_s": round(elapsed, 3), "env_steps": env_steps, "steps_per_s": round(fps, 1), "updates": s["updates"],
                               "mean_return": s["mean_return"], "eval_return": s["eval_return"], "return_source": self.progress.return_source,
                               "episodes": s["episodes"], "actors": s["connected"]})
        self.metrics.line(
            f"{elapsed:6.1f}s  steps {env_steps:,}  {fps:,.0f} steps/s  updates {s['updates']:,}  return {self._returns(s)}  "
            f"lag {self._lag(s)}{self._queue(queued, size)}  actors {s['connected']}" + self._rejected(s) + self._discarded(s) + self._backpressure(s)
        )

    def waiting(self, elapsed: float, what: str | None) -> None:
        """The line of a learner without data; rejections keep going to TensorBoard meanwhile."""
        p = self.progress
        with p.lock:
            env_steps, updates, rejected = p.env_steps, p.updates, dict(p.rejected)
            connected = p.connected(time.monotonic())
        if connected == 0 and self.endpoint:
            what = f"actors to connect to {self.endpoint}"
        queued, size = self.queue_fill()
        self.metrics.scalars({f"rejected/{k}": float(v) for k, v in rejected.items()} | {"actors/connected": connected}, env_steps)
        self.metrics.progress({"elapsed_s": round(elapsed, 3), "env_steps": env_steps, "updates": updates, "actors": connected,
                               "waiting_for": what or "data"})
        n = sum(rejected.values())
        self.metrics.line(
            f"{elapsed:6.1f}s  steps {env_steps:,}  updates {updates:,}  waiting for {what or 'data'}"
            f"{self._queue(queued, size)}  actors {connected}" + (f"  rejected {n}" if n else "")
        )

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        """The config (`Config.to_dict()`) for TensorBoard's HPARAMS tab, once as training
        starts; its metrics are the final mean return and the return curves."""
        tags = [FINAL_RETURN_TAG, "episode/return"] + (["eval/return"] if self.progress.return_source == "eval" else [])
        self.metrics.hparams(flat_hparams(config), tags)

    def final_return(self) -> None:
        """The run's final mean return (the one that reached the target where it did): the
        HPARAMS tab's metric."""
        p = self.progress
        self.metrics.scalars({FINAL_RETURN_TAG: p.reached_mean if p.target_reached() else p.mean_return()}, p.env_steps)

    def _learning_rate(self) -> float | None:
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else None

    def _returns(self, s: dict) -> str:
        ret = f"{s['mean_return']:.1f} ({s['n_returns']} eps)" if s["mean_return"] is not None else "-"
        if self.progress.return_source == "eval":
            ret += f"  eval {s['eval_return']:.1f} ({s['n_eval']} eps)" if s["eval_return"] is not None else "  eval -"
        return ret

    @staticmethod
    def _queue(queued: int, size: int) -> str:
        return f"  queue {queued}/{size}" if size else ""  # (a replay learner has no queue)

    @staticmethod
    def _lag(s: dict) -> str:
        return f"{s['lag_mean']:.1f}/{s['lag_max']}" if s["lag_mean"] is not None else "-"

    @staticmethod
    def _rejected(s: dict) -> str:
        n = sum(s["rejected"].values())
        return f"  rejected {n}" if n else ""

    @staticmethod
    def _discarded(s: dict) -> str:
        n = sum(s["discarded"].values())
        return f"  discarded {n}" if n else ""

    @staticmethod
    def _backpressure(s: dict) -> str:
        custom = s["custom"]
        blocked = sum(v for k, v in custom.items() if k.endswith("/blocked_s"))
        dropped = sum(v for k, v in custom.items() if k.endswith("/dropped_chunks"))
        return f"  backpressure: blocked {blocked:.1f}s dropped {dropped:,.0f}" if blocked >= 0.5 or dropped else ""


def flat_hparams(section: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config dict flattened to dotted keys (learner.learning_rate) with values TensorBoard's
    hparams take: numbers, strings and bools as they are, lists as text; None is left out."""
    flat: dict[str, Any] = {}
    for key, value in section.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_hparams(value, name + "."))
        elif isinstance(value, (list, tuple)):
            flat[name] = str(list(value))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
    return flat
