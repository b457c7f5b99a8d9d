"""Timing statistics, tables and output files shared by every benchmark.

A benchmark builds a `BenchResult` (a title, column names, one dict per row,
free-text notes) and returns it; `write_result` writes DIR/NAME.json and
DIR/NAME.md, and `format_table` gives the console table. `time_call` times a
callable after a warm-up and returns per-call statistics from several
repeats, so every figure is a median over repeats, never one sample.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from zrl.cpu import cpu_flags


@dataclass
class BenchOptions:
    """What `zrl bench` passes to every benchmark."""

    out: Path
    quick: bool = False  # smaller sizes and fewer repeats, for smoke tests
    repeats: int = 5
    seconds: float | None = None  # how long a timed run lasts (atari, soak); None: the benchmark's own


# The benchmarks that are one run of a set length, which `zrl bench --seconds` sets.
TIMED = ("atari", "soak")


def start_group(argv: list[str], cwd: Path | str) -> subprocess.Popen:
    """Starts a command (`python -m zrl run ...`: a learner with its actors) in a session
    of its own, output discarded; stop it with `stop_group`."""
    return subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)


def stop_group(p: subprocess.Popen, grace_s: float = 60.0) -> None:
    """Stops a command started by `start_group`, if it still runs, as Ctrl-C would: SIGINT
    to its whole process group (a clean stop: `zrl run` stops its actors and learner), then
    SIGKILL to the group if it has not exited after grace_s."""
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGINT)
        p.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    except ProcessLookupError:  # (it exited in between)
        p.wait()


def run_group(argv: list[str], cwd: Path | str, timeout: float, grace_s: float = 60.0) -> int:
    """Runs a command to its end in a group of its own (`start_group`) and returns its exit
    status. Whatever ends the wait first (subprocess.TimeoutExpired after `timeout`,
    Ctrl-C, an error) stops the whole group (`stop_group`) before it propagates, so no
    learner or actor outlives the benchmark."""
    p = start_group(argv, cwd)
    try:
        return p.wait(timeout)
    finally:
        stop_group(p, grace_s)


@dataclass
class Timing:
    """Per-call seconds over `repeats` timed batches of `calls` calls each."""

    per_call_s: list[float]
    calls: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.per_call_s)

    @property
    def median_us(self) -> float:
        return self.median_s * 1e6

    def percentile_s(self, q: float) -> float:
        return percentile(self.per_call_s, q)


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; samples need not be sorted."""
    if not samples:
        raise ValueError("percentile of no samples")
    xs = sorted(samples)
    k = (len(xs) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def ratio_interval(num: list[float], den: list[float], level: float = 0.95, resamples: int = 2000,
                   seed: int = 0) -> tuple[float, float]:
    """A bootstrap interval for median(num) / median(den): both sides' samples (timed
    windows) are resampled with replacement, each on its own, `resamples` times, and the
    interval is the middle `level` of the ratios got. Seeded, so a result is reproducible
    from the samples in its JSON. Narrow means the run measured its ratio well; a row
    whose interval lies wholly below its target is below it beyond this run's noise."""
    if len(num) < 2 or len(den) < 2:
        raise ValueError("a ratio interval needs at least 2 samples a side")
    if not 0 < level < 1:
        raise ValueError(f"level {level}: expected 0 < level < 1")
    import random

    rng = random.Random(seed)
    med = statistics.median
    ratios = sorted(med(rng.choices(num, k=len(num))) / med(rng.choices(den, k=len(den))) for _ in range(resamples))
    tail = (1 - level) / 2 * 100
    return percentile(ratios, tail), percentile(ratios, 100 - tail)


def time_call(
    fn: Callable[[], Any],
    *,
    repeats: int = 5,
    min_batch_s: float = 0.05,
    warmup_s: float = 0.05,
) -> Timing:
    """Times `fn()` per call: warm up, size a batch to take ~min_batch_s, time `repeats` batches."""
    t_end = time.perf_counter() + warmup_s
    calls = 0
    while time.perf_counter() < t_end or calls < 2:
        fn()
        calls += 1
    # Calibrate a batch size so each timed batch runs about min_batch_s.
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_batch_s or n >= 1 << 24:
            break
        n = max(n * 2, int(n * min_batch_s / max(dt, 1e-9)))
    per_call = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        per_call.append((time.perf_counter() - t0) / n)
    return Timing(per_call, n)


def cpu_simd() -> str:
    """The vector features that decide zrl's CPU kernels (the model name alone does not tell an
    AVX2-only AMD EPYC from one with AVX-512): e.g. "AVX-512, VNNI, BF16" or "AVX2"."""
    flags = cpu_flags()
    names = [("avx512f", "AVX-512"), ("avx512_vnni", "VNNI"), ("avx_vnni", "AVX-VNNI"), ("avx512_bf16", "BF16"), ("amx_int8", "AMX")]
    found = [name for flag, name in names if flag in flags]
    if not found and "avx2" in flags:
        found = ["AVX2"]
    return ", ".join(found) or "unknown"


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info["cpu_simd"] = cpu_simd()
    try:
        import torch  # lazy: the harness's other users (benchmarks that only run subprocesses, its tests) need no torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


@dataclass
class BenchResult:
    name: str
    title: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # anything else worth keeping in JSON

    def add(self, **row: Any) -> None:
        self.rows.append(row)
        if _on_row is not None:
            _on_row(self, row)


# While `rows_shown` is active: called with each row a benchmark adds, as it adds it.
_on_row: Callable[[BenchResult, dict[str, Any]], None] | None = None


@contextlib.contextmanager
def rows_shown(echo: Callable[[str], None]):
    """Within it, every row any benchmark adds is passed to echo as one line, as it comes,
    so a benchmark that runs for minutes shows its progress (`zrl bench` uses it)."""
    global _on_row

    def show(result: BenchResult, row: dict[str, Any]) -> None:
        cells = ", ".join(f"{c} {_fmt(row[c])}" for c in result.columns if c in row and row[c] not in ("", "-"))
        echo(f"  [{result.name}] {cells}")

    before, _on_row = _on_row, show
    try:
        yield
    finally:
        _on_row = before


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v == 0:
            return "0"
        a = abs(v)
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 100:
            return f"{v:.1f}"
        if a >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v)


def format_table(result: BenchResult) -> str:
    """Markdown table of the rows (also readable on a console)."""
    cols = result.columns
    cells = [[_fmt(r.get(c, "")) for c in cols] for r in result.rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(cols)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    out = [line(cols), "| " + " | ".join("-" * w for w in widths) + " |"]
    out += [line(row) for row in cells]
    return "\n".join(out)


def write_result(result: BenchResult, out_dir: Path) -> tuple[Path, Path]:
    """Writes out_dir/NAME.json and out_dir/NAME.md; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    payload = {
        "name": result.name,
        "title": result.title,
        "when": stamp,
        "machine": machine,
        "columns": result.columns,
        "rows": result.rows,
        "notes": result.notes,
        **({"extra": result.extra} if result.extra else {}),
    }
    json_path = out_dir / f"{result.name}.json"
    json_path.write_text(json.dumps(payload, indent=2, default=float) + "\n")
    md = [f"## {result.title}", "", f"{stamp} on {machine.get('cpu_model', machine['processor'])} ({machine['cpu_simd']}), "
          f"{machine['cpus']} CPUs, Python {machine['python']}"
          + (f", torch {machine['torch']}" if "torch" in machine else ""), "", format_table(result)]
    if result.notes:
        md += [""] + [f"- {n}" for n in result.notes]
    md_path = out_dir / f"{result.name}.md"
    md_path.write_text("\n".join(md) + "\n")
    return json_path, md_path
