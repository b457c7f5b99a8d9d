"""`zrl plot LOGDIR... --out FILE.png`: the return of one run or several side by side,
against env steps and against wall time, read from the runs' TensorBoard events.

Each LOGDIR is a run's logdir, holding the learner's events.out.tfevents.* files (a
resumed run's files together). One line per run, labelled by its directory; a row per
return scalar any run logged (episode/return, and eval/return where an evaluation actor ran).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["PlotError", "Curve", "RETURN_TAGS", "read_returns", "plot_returns"]

RETURN_TAGS = ("episode/return", "eval/return")
INSTALL_HINT = 'pip install "zrl[plot]"'
EVENTS_PREFIX = "events.out.tfevents."


class PlotError(RuntimeError):
    """Nothing to plot (a directory without events, runs without returns) or no matplotlib."""


@dataclass
class Curve:
    steps: list[int]  # env steps (the learner logs its scalars at them)
    seconds: list[float]  # wall time since the run's first scalar
    values: list[float]


def _has_events(d: Path) -> bool:
    return any(p.name.startswith(EVENTS_PREFIX) for p in d.iterdir() if p.is_file())


def _check_events(logdir: Path) -> None:
    """Refuses a directory without TensorBoard events, naming subdirectories that have some."""
    if not logdir.is_dir():
        raise PlotError(f"{logdir}: not a directory")
    if _has_events(logdir):
        return
    runs = sorted(str(d) for d in logdir.iterdir() if d.is_dir() and _has_events(d))
    hint = f"; these directories in it do, pass them instead: {' '.join(runs)}" if runs else ""
    raise PlotError(f"{logdir}: no TensorBoard events ({EVENTS_PREFIX}*) in it: not a run's logdir{hint}")


def read_returns(logdir: Path) -> dict[str, Curve]:
    """{tag: Curve} for each of RETURN_TAGS the run in `logdir` logged (empty if none)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # lazy: slow to import

    _check_events(logdir)
    ea = EventAccumulator(str(logdir), size_guidance={"scalars": 0})  # 0: every point, not a sample
    ea.Reload()
    tags = ea.Tags()["scalars"]
    events = {t: ea.Scalars(t) for t in RETURN_TAGS if t in tags}
    if not events:
        return {}
    t0 = min(e.wall_time for t in tags for e in ea.Scalars(t)[:1])
    return {t: Curve([int(e.step) for e in es], [e.wall_time - t0 for e in es], [float(e.value) for e in es])
            for t, es in events.items()}


def run_labels(logdirs: list[Path]) -> list[str]:
    """Each run's directory name, or the path as given where names repeat (run1/seed0, run2/seed0)."""
    names = [d.resolve().name or str(d) for d in logdirs]
    return [n if names.count(n) == 1 else str(d) for n, d in zip(names, logdirs)]


def plot_returns(logdirs: list[Path], out: Path) -> list[str]:
    """Draws the runs' returns into `out` (its suffix picks the format); returns notes on
    runs left out (no return logged yet). PlotError where there is nothing to draw."""
    runs = {label: read_returns(d) for label, d in zip(run_labels(logdirs), logdirs)}
    tags = [t for t in RETURN_TAGS if any(t in curves for curves in runs.values())]
    if not tags:
        raise PlotError(f"no {' or '.join(RETURN_TAGS)} logged in {', '.join(map(str, logdirs))}: the learner logs "
                        "them once episodes have ended")
    notes = [f"{label}: no return logged yet, left out" for label, curves in runs.items() if not curves]
    _draw(runs, tags, out)
    return notes


def _draw(runs: dict[str, dict[str, Curve]], tags: list[str], out: Path) -> None:
    try:
        from matplotlib.figure import Figure  # lazy: optional (the plot extra); Figure needs no pyplot or GUI backend
    except ImportError as e:
        raise PlotError(f"zrl plot needs matplotlib ({e}): {INSTALL_HINT}") from None
    fig = Figure(figsize=(12, 4 * len(tags)), layout="constrained")
    axes = fig.subplots(len(tags), 2, squeeze=False, sharey="row")
    unit, scale = _time_unit(max(c.seconds[-1] for curves in runs.values() for c in curves.values()))
    colours = [f"C{i % 10}" for i in range(len(runs))]  # a run keeps its colour in every row
    for row, tag in zip(axes, tags):
        for (label, curves), colour in zip(runs.items(), colours):
            c = curves.get(tag)
            if c is None:
                continue
            row[0].plot(c.steps, c.values, label=label, color=colour, lw=1.2)
            row[1].plot([s / scale for s in c.seconds], c.values, label=label, color=colour, lw=1.2)
        row[0].set(xlabel="env steps", ylabel=tag, title=f"{tag} against env steps")
        row[1].set(xlabel=f"wall time ({unit})", title=f"{tag} against wall time")
        for ax in row:
            ax.grid(alpha=0.3)
        row[1].legend(fontsize="small")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)


def _time_unit(longest_s: float) -> tuple[str, float]:
    """(unit, seconds in it) that keeps the wall-time axis's numbers readable."""
    if longest_s > 3 * 3600:
        return "hours", 3600.0
    if longest_s > 180:
        return "minutes", 60.0
    return "seconds", 1.0
