"""`zrl bench soak`: a long `zrl run` whose every process's resident memory is sampled.

The default config trains for 10 minutes (`--quick`: 40 s) with no return
target, so the learner keeps training and the actors keep streaming; the
resident set size of the learner and of each actor is sampled every few
seconds from /proc (psutil). After a warm-up (the first fifth of the run),
growth is the change from the mean of the first warm samples to the mean of
the last ones; the target is under 5% for every process. A leak that grows
a gigabyte every few minutes (sample-factory #116) shows here at once.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import psutil

from zrl.bench.harness import BenchOptions, BenchResult, start_group, stop_group

ROOT = Path(__file__).resolve().parents[2]


def run(opts: BenchOptions) -> BenchResult:
    seconds = opts.seconds or (40.0 if opts.quick else 600.0)
    interval = min(1.0 if opts.quick else 5.0, seconds / 20)  # >= 16 samples after the warm-up, however short
    result = BenchResult(
        name="soak",
        title=f"Soak: resident memory of every process over a {seconds:.0f} s `zrl run` (default config, no target)",
        columns=["process", "rss_warm_MiB", "rss_end_MiB", "growth_%", "samples"],
    )
    with tempfile.TemporaryDirectory(prefix="zrl-soak-") as d:
        logdir = Path(d)
        argv = [sys.executable, "-m", "zrl", "run", "--logdir", str(logdir), "--max-seconds", str(seconds + 30),
                "--stop-at-return", "1e9", "-o", "learner.checkpoint_interval_s=60"]
        p = start_group(argv, ROOT)
        samples: dict[str, list[tuple[float, int]]] = {}
        try:
            deadline = time.monotonic() + 120
            while not (logdir / "pids.json").exists() or len(json.loads((logdir / "pids.json").read_text())) < 3:
                if time.monotonic() > deadline or p.poll() is not None:
                    raise RuntimeError("zrl run did not start its processes")
                time.sleep(0.2)
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                if p.poll() is not None:  # a soak that ended early measured nothing worth reporting
                    raise RuntimeError(f"zrl run exited with {p.returncode} after {time.monotonic() - t0:.0f} of {seconds:.0f} s")
                pids = json.loads((logdir / "pids.json").read_text())
                for name, pid in pids.items():
                    try:
                        samples.setdefault(name, []).append((time.monotonic() - t0, psutil.Process(pid).memory_info().rss))
                    except psutil.NoSuchProcess:
                        pass
                time.sleep(interval)
            summary_steps = None
        finally:
            stop_group(p)
        try:
            summary_steps = json.loads((logdir / "summary.json").read_text()).get("env_steps")
        except (OSError, ValueError):
            pass
    worst = None
    for name, xs in samples.items():
        warm = [r for t, r in xs if t >= seconds / 5]
        if len(warm) < 4:
            continue
        k = max(2, len(warm) // 5)
        start, end = sum(warm[:k]) / k, sum(warm[-k:]) / k
        growth = 100.0 * (end - start) / start
        worst = growth if worst is None else max(worst, growth)
        result.add(process=name, rss_warm_MiB=start / 2**20, rss_end_MiB=end / 2**20, **{"growth_%": growth}, samples=len(xs))
    if worst is None:
        raise RuntimeError("no process has 4 samples after the warm-up: nothing measured")
    result.notes.append(f"Largest growth after warm-up: {worst:.2f}% (target: under 5%); env steps in the run: {summary_steps}.")
    result.notes.append("RSS from psutil; the mean of the first fifth of the post-warm-up samples against the mean of the last fifth.")
    result.extra["samples"] = {k: v for k, v in samples.items()}
    return result
