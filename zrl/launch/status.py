"""The text of `zrl run`'s live status line, from one progress.jsonl record: elapsed time, env
steps (its `steps N` field, as in the learner's lines), steps/s, return, and an ETA when the
run has a time or env-step limit."""
from __future__ import annotations

from zrl.launch.options import RunOptions


def status_text(record: dict, opts: RunOptions) -> str:
    """The fields that matter most come first: a narrow terminal cuts the line's end."""
    parts = [f"{record.get('elapsed_s', 0.0):.1f}s", f"steps {record.get('env_steps', 0):,}"]
    waiting = "waiting_for" in record
    if not waiting:
        parts += [f"{record.get('steps_per_s', 0.0):,.0f} steps/s", _return(record)]
    eta = eta_seconds(record, opts)
    if eta is not None:
        parts.append(f"ETA {format_duration(eta)}")
    if opts.stop_at_return is not None:
        parts.append(f"target {opts.stop_at_return:g}")
    if waiting:
        parts.append(f"waiting for {record['waiting_for']}")
    parts += [f"updates {record.get('updates', 0):,}", f"actors {record.get('actors', 0)}"]
    return "[zrl run] " + "  ".join(parts)


def _return(record: dict) -> str:
    """The mean return that the run's target is checked against: the greedy evaluation actor's where it has one."""
    evaluating = record.get("return_source") == "eval"
    value = record.get("eval_return") if evaluating else record.get("mean_return")
    return ("eval return " if evaluating else "return ") + (f"{value:.1f}" if value is not None else "-")


def eta_seconds(record: dict, opts: RunOptions) -> float | None:
    """Seconds until the nearer of the run's limits (run.max_seconds, run.max_env_steps); None without one."""
    left = []
    if opts.max_seconds is not None:
        left.append(opts.max_seconds - record.get("elapsed_s", 0.0))
    rate = record.get("steps_per_s") or 0.0
    if opts.max_env_steps is not None and rate > 0:
        left.append((opts.max_env_steps - record.get("env_steps", 0)) / rate)
    return max(0.0, min(left)) if left else None


def format_duration(seconds: float) -> str:
    """1:05 (m:ss), or 1:02:03 (h:mm:ss) past an hour."""
    s = int(round(seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"
