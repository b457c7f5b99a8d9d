"""`zrl bench transport --quick`: a smoke test (no speed assertions; targets live in bench/README.md)."""
from __future__ import annotations

import multiprocessing as mp

import pytest

from zrl.bench import BENCHMARKS
from zrl.bench.harness import BenchOptions
from zrl.bench.transport import CHUNKS, TRANSPORTS, run


def test_transport_bench_quick_reports_every_transport_and_chunk(tmp_path):
    assert BENCHMARKS["transport"] == "zrl.bench.transport"
    result = run(BenchOptions(out=tmp_path, quick=True))
    assert result.columns == ["transport", "chunk", "bytes/msg", "zrl msg/s", "raw msg/s", "zrl GB/s", "raw GB/s", "ratio",
                              "zrl CPU us/msg", "raw CPU us/msg", "CPU ratio"]
    assert [(r["transport"], r["chunk"]) for r in result.rows] == [(t, c.name) for t in TRANSPORTS for c in CHUNKS]
    for row in result.rows:
        assert set(row) == set(result.columns)
        assert row["zrl msg/s"] > 0 and row["raw msg/s"] > 0
        assert abs(row["ratio"] - row["zrl msg/s"] / row["raw msg/s"]) < 1e-9
        assert abs(row["zrl GB/s"] - row["zrl msg/s"] * row["bytes/msg"] / 1e9) < 1e-9
        # Both processes use CPU for every message: a send, a receive, the I/O threads between.
        assert row["zrl CPU us/msg"] > 0 and row["raw CPU us/msg"] > 0
        assert abs(row["CPU ratio"] - row["raw CPU us/msg"] / row["zrl CPU us/msg"]) < 1e-9
    sizes = {r["chunk"]: r["bytes/msg"] for r in result.rows}
    assert sizes["cartpole T20xK2"] < 4096  # the ~2 KB class
    assert 564_480 < sizes["atari T19xK1"] < 600_000  # 20 x 4 x 84 x 84 uint8 of observations plus the rest
    windows = result.extra["windows"]["tcp/cartpole T20xK2"]
    assert len(windows["cpu_us_per_msg"]["zrl"]) == len(windows["msg_per_s"]["zrl"]) == 2  # one per quick window
    assert not mp.active_children()  # both worker processes were stopped


def test_transport_bench_worker_error_is_raised_and_the_worker_stopped():
    from zrl.bench.transport import _receiver_main, _Worker

    worker = _Worker(mp.get_context("spawn"), _receiver_main, "receiver")
    try:
        with pytest.raises(RuntimeError, match="KeyError"):
            worker.call("window", "zrl", 10)  # before any setup: the worker reports the error and keeps serving
        assert worker.proc.is_alive()
    finally:
        worker.stop()
    assert not worker.proc.is_alive()
