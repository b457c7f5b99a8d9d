"""zrl's benchmark suite, run by `zrl bench NAME --out DIR`.

Each benchmark is a module here with `run(opts: BenchOptions) -> BenchResult`
that measures zrl side by side with the reference it is judged against, in
the same run (machines are shared and noisy, so only ratios taken together
mean anything). The harness in `harness.py` does the timing statistics, the
table, and the JSON + Markdown output. bench/README.md at the repository
root defines every figure and keeps the latest tables.
"""
from __future__ import annotations

# name -> module under zrl.bench; each module has `run(opts) -> BenchResult`. (`zrl bench
# pong` is `zrl bench atari --game pong`: ALIASES.)
BENCHMARKS: dict[str, str] = {
    "kernels": "zrl.bench.kernels",
    "client": "zrl.bench.client",
    "soak": "zrl.bench.soak",
    "pipeline": "zrl.bench.pipeline",
    "learning": "zrl.bench.learning",
    "atari": "zrl.bench.atari",
    "replay": "zrl.bench.replay",
    "transport": "zrl.bench.transport",
}

ALIASES: dict[str, tuple[str, dict]] = {"pong": ("atari", {"game": "pong"})}


class BenchUnavailable(RuntimeError):
    """A benchmark cannot run here (e.g. a binary not built); the message says what to do."""
