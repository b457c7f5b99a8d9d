"""`zrl bench NAME`: runs benchmarks from zrl.bench.BENCHMARKS and writes their results."""
from __future__ import annotations

import importlib
from pathlib import Path

from zrl.bench import BENCHMARKS
from zrl.bench.harness import TIMED, BenchOptions, format_table, rows_shown, write_result


def check_seconds(name: str, seconds: float | None) -> None:
    """ValueError unless `name` takes a run length (or none is given)."""
    if seconds is not None and name != "all" and name not in TIMED:
        raise ValueError(f"--seconds sets the length of a timed run ({', '.join(TIMED)}); {name} has none")


def run_benchmarks(name: str, out: str | Path, quick: bool = False, repeats: int = 5, seconds: float | None = None) -> list:
    """seconds: the length of the timed runs (atari, soak: TIMED); ValueError for a benchmark
    that has none."""
    names = list(BENCHMARKS) if name == "all" else [name]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise KeyError(f"unknown benchmark {unknown[0]!r} (known: {', '.join(BENCHMARKS)}, all)")
    check_seconds(name, seconds)
    opts = BenchOptions(out=Path(out), quick=quick, repeats=repeats, seconds=seconds)
    results = []
    for n in names:
        print(f"== zrl bench {n}{' (quick)' if quick else ''}", flush=True)
        with rows_shown(lambda line: print(line, flush=True)):  # each row as it is measured
            result = importlib.import_module(BENCHMARKS[n]).run(opts)
        print(result.title)
        print(format_table(result))
        for note in result.notes:
            print(f"  - {note}")
        json_path, md_path = write_result(result, opts.out)
        print(f"  wrote {json_path} and {md_path}", flush=True)
        results.append(result)
    return results
