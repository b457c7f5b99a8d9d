"""`zrl bench pong`: a short IMPALA run on Pong, to see the return curve move.

Runs `zrl run --config configs/pong_impala.yaml` for a few minutes (10 by
default; `--quick`: 90 s; `--seconds` sets it), then reads the learner's
TensorBoard scalars and reports the mean episode return (game score,
unclipped) over time, env frames/s (a step is 4 emulator frames), learner
samples/s and the learner's share of time waiting for data, and the minute
the return first stands a point above the first minute's; writes
DIR/pong.png with the curve. Random play scores about -20.5; the curve
starting to rise is the point, not a solved game, on a CPU learner. On 2
AVX2-only cores it starts after ~13 minutes (bench/README.md).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from zrl.algorithms.base import resolve_precision
from zrl.bench.harness import BenchOptions, BenchResult, run_group
from zrl.config import load_config

ROOT = Path(__file__).resolve().parents[2]


RISE = 1.0  # points above the first minute's mean return that count as the curve moving


def rise_minute(rows: list[dict]) -> int | None:
    """The first minute whose mean return is RISE or more above the first minute's, or None."""
    if not rows:
        return None
    first = rows[0]["mean_return"]
    return next((r["minute"] for r in rows if r["mean_return"] >= first + RISE), None)


def rise_note(rows: list[dict]) -> str:
    first, last = rows[0], rows[-1]
    m = rise_minute(rows)
    if m is not None:
        return (f"The return first stood {RISE:g} point or more above the first minute's ({first['mean_return']:.2f}) "
                f"at minute {m}; {last['mean_return']:.2f} at minute {last['minute']}.")
    return (f"The return stayed within {RISE:g} point of the first minute's ({first['mean_return']:.2f} -> "
            f"{last['mean_return']:.2f}): no rise yet. On a slower CPU it rises later (bench/README.md, pong); "
            "`--seconds` gives the run longer.")


def run(opts: BenchOptions) -> BenchResult:
    seconds = opts.seconds or (90.0 if opts.quick else 600.0)
    result = BenchResult(
        name="pong",
        title=f"Pong (IMPALA, shallow CNN, CPU learner): mean episode return over a {seconds:.0f} s run",
        columns=["minute", "env_frames", "mean_return", "env_frames/s"],
    )
    with tempfile.TemporaryDirectory(prefix="zrl-pong-") as d:
        argv = [sys.executable, "-m", "zrl", "run", "--config", str(ROOT / "configs" / "pong_impala.yaml"), "--logdir", d,
                "--max-seconds", str(seconds), "-o", "learner.checkpoint_interval_s=1e6"]
        code = run_group(argv, ROOT, timeout=seconds + 300)
        if code != 0:  # a failed run's curve is not a measurement
            raise RuntimeError(f"zrl run on Pong exited with {code}")
        final = json.loads((Path(d) / "learner_final.json").read_text())
        ea = EventAccumulator(d, size_guidance={"scalars": 0})
        ea.Reload()
        ret = ea.Scalars("episode/return") if "episode/return" in ea.Tags()["scalars"] else []
        fps = {e.step: e.value for e in ea.Scalars("perf/env_steps_per_s")} if "perf/env_steps_per_s" in ea.Tags()["scalars"] else {}
    if ret:
        t0 = ret[0].wall_time
        per_minute: dict[int, list] = {}
        for e in ret:
            per_minute.setdefault(int((e.wall_time - t0) // 60), []).append(e)
        for minute, es in sorted(per_minute.items()):
            last = es[-1]
            result.add(minute=minute + 1, env_frames=last.step * 4, mean_return=last.value, **{"env_frames/s": 4 * fps.get(last.step, 0.0)})
        result.notes.append(rise_note(result.rows))
        result.extra["rise_minute"] = rise_minute(result.rows)
        try:
            import matplotlib  # lazy: optional (the bench extra)

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt  # lazy: optional, and only after choosing the Agg backend

            fig, ax = plt.subplots(figsize=(6, 3.5))
            ax.plot([(e.wall_time - t0) / 60 for e in ret], [e.value for e in ret])
            ax.set_xlabel("minutes")
            ax.set_ylabel("mean return (last 100 episodes)")
            ax.set_title(f"zrl IMPALA on Pong, CPU learner, {os.cpu_count()} cores")
            ax.grid(alpha=0.3)
            opts.out.mkdir(parents=True, exist_ok=True)
            fig.tight_layout()
            fig.savefig(opts.out / "pong.png", dpi=100)
            result.notes.append("Curve: pong.png (beside this table)")
        except ImportError:
            result.notes.append("matplotlib is not installed: no plot (pip install -e .[bench]).")
    perf = final.get("perf") or {}
    cfg = load_config(ROOT / "configs" / "pong_impala.yaml")
    result.notes.append(f"Learner precision: {resolve_precision(cfg.learner.precision, torch.device('cpu'))} (learner.precision: {cfg.learner.precision}).")
    result.notes.append(
        f"{final['env_steps']:,} env steps = {4 * final['env_steps']:,} frames in {final['train_seconds']:.0f} s; "
        f"env {4 * perf.get('env_steps_per_s', 0):,.0f} frames/s, learner {4 * perf.get('learner_samples_per_s', 0):,.0f} frames/s, "
        f"learner waiting for data {100 * perf.get('wait_for_data_frac', 0):.0f}% of the time, policy lag {perf.get('policy_lag_mean')}."
    )
    result.extra["final"] = final
    return result
