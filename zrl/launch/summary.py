"""LOGDIR/summary.json, written when `zrl run` ends: what the run did (from the learner's
learner_final.json and the run's options), its one-line report, and the exit code the
learner's own implies.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from zrl.launch.options import RunOptions


def summarise(final_path: Path, logdir: Path, opts: RunOptions, t_end: float, learner_code: int | None, stop_reason: str | None = None,
              actors_crashed: bool = False) -> int:
    """Writes LOGDIR/summary.json and prints its line; returns the run's exit code."""
    summary = build_summary(read_final(final_path), opts, t_end, learner_code, stop_reason)
    tmp = logdir / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, logdir / "summary.json")
    print(summary_line(summary, t_end - opts.t_start, opts, logdir), flush=True)
    if learner_code is not None and learner_code < 0:  # killed by a signal
        return 128 - learner_code
    if learner_code == 0 and summary["stop_reason"] == "time limit" and summary["env_steps_this_run"] == 0 and actors_crashed:
        # Out of time with nothing trained, while actors crashed and were restarted: a failure.
        # (With none crashed: a limit shorter than the start-up, or no client of a serve-only run.)
        print("[zrl run] no env steps in this run: the actors kept failing (their errors are above)", file=sys.stderr, flush=True)
        return 1
    return 0 if learner_code == 0 else (learner_code or 1)


def read_final(final_path: Path) -> dict:
    """The learner's learner_final.json; empty when it wrote none (it failed) or a broken one."""
    if not final_path.exists():
        return {}
    try:
        return json.loads(final_path.read_text())
    except ValueError:
        return {}


def build_summary(final: dict, opts: RunOptions, t_end: float, learner_code: int | None, stop_reason: str | None) -> dict:
    wall = t_end - opts.t_start
    steps = int(final.get("env_steps", 0))
    run_steps = steps - int(final.get("resumed_env_steps", 0))  # this run's, after a --resume
    reached_unix = final.get("reached_at_unix")
    return {
        "started_at_unix": round(opts.t_start, 3),  # (wall_s and time_to_target_s count from here)
        "wall_s": round(wall, 3),
        "time_to_target_s": round(reached_unix - opts.t_start, 3) if reached_unix else None,
        "env_steps": steps,
        "env_steps_this_run": run_steps,
        "env_steps_per_s": round(run_steps / wall, 1) if wall > 0 else 0.0,
        "final_mean_return": final.get("final_mean_return"),
        "reached": bool(final.get("reached", False)),
        "stop_at_return": opts.stop_at_return,
        "updates": final.get("updates"),
        "episodes": final.get("episodes"),
        "stop_reason": stop_reason or final.get("stop_reason", "learner failed"),
        "return_source": final.get("return_source", "train"),
        "num_actors": opts.num_actors,
        "seed": opts.seed,
        "learner_exit_code": learner_code,
    }


def summary_line(summary: dict, wall: float, opts: RunOptions, logdir: Path) -> str:
    steps, run_steps = summary["env_steps"], summary["env_steps_this_run"]
    ret = summary["final_mean_return"]
    ret_s = f"{ret:.1f}" if isinstance(ret, (int, float)) else "-"
    if summary["return_source"] == "eval":
        ret_s += " (greedy evaluation actor)"
    target = f" (target {opts.stop_at_return:g}: {'reached' if summary['reached'] else 'not reached'})" if opts.stop_at_return is not None else ""
    return (f"[zrl run] {summary['stop_reason']}: {wall:.1f}s wall, {steps:,} env steps"
            f"{f' ({run_steps:,} in this run)' if run_steps != steps else ''} ({summary['env_steps_per_s']:,.0f}/s), "
            f"mean return {ret_s}{target}; summary in {logdir / 'summary.json'}")
