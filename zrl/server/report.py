"""The agent server's periodic status: a console line, and TensorBoard scalars when it has a logdir.

The scalars are indexed by requests handled (not client steps): a flood of
requests that never step still moves the curves of what it was refused.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

from zrl.metrics import MetricsWriter, Rate
from zrl.server.stats import ROUTINE_DROPS, ServerStats


class StatusReport:
    def __init__(self, stats: ServerStats, logdir: str | Path | None, say: Callable[[str], None]):
        self.stats = stats
        self.say = say
        self.metrics = MetricsWriter(Path(logdir) if logdir is not None else None, prefix="server", console=False)
        self._rate = Rate(stats.steps)

    def write(self, clients: int, policy_version: int) -> None:
        s = self.stats
        rate = self._rate.read(s.steps)
        mean_batch = s.batch_sizes / max(s.batches, 1)
        self.metrics.scalars(self._scalars(clients, rate, mean_batch), s.requests)
        notable_drops = {k: v for k, v in s.session_drops.items() if k not in ROUTINE_DROPS}
        self.say(f"{clients} clients, {rate:,.0f} steps/s, mean batch {mean_batch:.1f}, policy version {policy_version}"
                 + self._counted("rejected", s.rejected) + self._counted("sessions dropped", notable_drops)
                 + (f", dropped {s.dropped_messages:,} chunks" if s.dropped_messages else ""))

    def _scalars(self, clients: int, rate: float, mean_batch: float) -> dict[str, float]:
        s = self.stats
        values = {
            "clients/live": float(clients),
            "clients/opened": float(s.sessions_opened),
            "perf/steps_per_s": rate,
            "perf/mean_batch": mean_batch,
            "perf/dropped_chunks": float(s.dropped_messages),
        }
        values.update({f"rejected/{k}": float(v) for k, v in s.rejected.items()})
        values.update({f"clients/dropped/{k}": float(v) for k, v in s.session_drops.items()})
        return values

    @staticmethod
    def _counted(what: str, counts: Mapping[str, int]) -> str:
        """', rejected 12 (hello_rate 10, pipelined 2)', or nothing when none."""
        n = sum(counts.values())
        if not n:
            return ""
        reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
        return f", {what} {n:,} ({reasons})"

    def close(self) -> None:
        self.metrics.close()
