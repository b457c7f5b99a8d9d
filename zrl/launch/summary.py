"""LOGDIR/summary.json, written when `zrl run` ends: what the run did (from the learner's
learner_final.json and the run's options), its one-line report, and the exit code the
learner's own implies. A learner that did not finish cleanly (killed, crashed) wrote no
learner_final.json: the summary then takes the counters of its newest checkpoint, and says so.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from zrl.launch.options import RunOptions
from zrl.launch.roles import EXIT_CONFIG


def summarise(final_path: Path, logdir: Path, opts: RunOptions, t_end: float, learner_code: int | None, stop_reason: str | None = None,
              actors_crashed: bool = False, resumed_env_steps: int = 0) -> int:
    """Writes LOGDIR/summary.json and prints its line; returns the run's exit code.
    resumed_env_steps: the env steps of the checkpoint a --resume started from."""
    final = read_final(final_path) or from_checkpoint(logdir, learner_code, resumed_env_steps)
    summary = build_summary(final, opts, t_end, learner_code, stop_reason)
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


def from_checkpoint(logdir: Path, learner_code: int | None, resumed_env_steps: int) -> dict:
    """What the newest checkpoint knows, in learner_final.json's form, for a learner that wrote
    none; its stop reason says how the learner ended."""
    final = {"stop_reason": _how_the_learner_ended(learner_code), "learner_finished": False,
             "resumed_env_steps": resumed_env_steps, "env_steps": resumed_env_steps, "counters_from": None}
    ckdir = logdir / "checkpoints"
    if not ckdir.is_dir():
        return final
    from zrl import checkpoint  # lazy: imports torch, which only a failed learner's summary needs here

    found = checkpoint.load_latest(ckdir)
    if found is None:
        return final
    path, state = found
    c = state["counters"]
    returns, source = (c.get("recent_eval_returns"), "eval") if c.get("recent_eval_returns") else (c.get("recent_returns"), "train")
    final.update(env_steps=c.get("env_steps", 0), updates=c.get("updates"), episodes=c.get("episodes"), return_source=source,
                 final_mean_return=sum(returns) / len(returns) if returns else None, counters_from=str(path))
    final["stop_reason"] += f"; counters from its newest checkpoint, {path.name}"
    return final


def _how_the_learner_ended(code: int | None) -> str:
    if code == EXIT_CONFIG:
        return "the learner cannot run with this config (exit code 2, its error above)"
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"learner killed by {name}: it did not finish cleanly"
    return f"learner failed{f' (exit code {code})' if code is not None else ''}: it did not finish cleanly"


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
        "learner_finished": final.get("learner_finished", True),  # False: it wrote no learner_final.json
        "counters_from": final.get("counters_from", "learner_final.json"),
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
