"""`zrl bench transport --quick`: a smoke test (no speed assertions; targets live in bench/README.md)."""
from __future__ import annotations

import multiprocessing as mp
import sys

import pytest

from zrl.bench import BENCHMARKS
from zrl.bench.harness import BenchOptions, ratio_interval
from zrl.bench.transport import BY_THREAD, CHUNKS, PARTS, SLEEPS, TRANSPORTS, run


@pytest.mark.slow
def test_transport_bench_quick_reports_every_transport_and_chunk(tmp_path):
    assert BENCHMARKS["transport"] == "zrl.bench.transport"
    result = run(BenchOptions(out=tmp_path, quick=True))
    assert result.columns == ["transport", "chunk", "bytes/msg", "zrl msg/s", "raw msg/s", "zrl GB/s", "raw GB/s", "ratio",
                              "ratio 95% CI", "zrl CPU us/msg", "raw CPU us/msg", "CPU ratio", BY_THREAD,
                              "raw fresh msg/s", "ratio to fresh"]
    assert [(r["transport"], r["chunk"]) for r in result.rows] == [(t, c.name) for t in TRANSPORTS for c in CHUNKS]
    for row in result.rows:
        assert set(row) == set(result.columns)
        assert row["zrl msg/s"] > 0 and row["raw msg/s"] > 0
        assert abs(row["ratio"] - row["zrl msg/s"] / row["raw msg/s"]) < 1e-9
        lo, hi = (float(x) for x in row["ratio 95% CI"].split("-"))
        assert 0 < lo <= hi
        assert abs(row["zrl GB/s"] - row["zrl msg/s"] * row["bytes/msg"] / 1e9) < 1e-9
        # Both processes use CPU for every message: a send, a receive, the I/O threads between.
        assert row["zrl CPU us/msg"] > 0 and row["raw CPU us/msg"] > 0
        assert abs(row["CPU ratio"] - row["raw CPU us/msg"] / row["zrl CPU us/msg"]) < 1e-9
        by_thread = result.extra["windows"][f"{row['transport']}/{row['chunk']}"]["by_thread_per_msg"]
        assert set(by_thread) >= {"zrl", "raw"} and all(set(v) == set(PARTS + SLEEPS) for v in by_thread.values())
        # The difference column is zrl's median minus raw's, thread by thread, in PARTS' order.
        assert [float(x) for x in row[BY_THREAD].split(", ")] == pytest.approx(
            [by_thread["zrl"][k] - by_thread["raw"][k] for k in PARTS], abs=0.006)
        for side in by_thread.values():
            # Every message passes through both main threads; on Linux the I/O threads move the bytes.
            assert side["sender main"] > 0 and side["receiver main"] > 0
            if sys.platform == "linux":
                assert side["sender io"] > 0 and side["receiver io"] > 0
        if row["bytes/msg"] >= 64 << 10:  # sent without a copy: raw from a ring of payloads too
            assert row["raw fresh msg/s"] > 0
            assert abs(row["ratio to fresh"] - row["zrl msg/s"] / row["raw fresh msg/s"]) < 1e-9
        else:
            assert row["raw fresh msg/s"] == row["ratio to fresh"] == "-"
    sizes = {r["chunk"]: r["bytes/msg"] for r in result.rows}
    assert sizes["cartpole T20xK2"] < 4096  # the ~2 KB class
    assert 564_480 < sizes["atari T19xK1"] < 600_000  # 20 x 4 x 84 x 84 uint8 of observations plus the rest
    windows = result.extra["windows"]["tcp/cartpole T20xK2"]
    assert len(windows["cpu_us_per_msg"]["zrl"]) == len(windows["msg_per_s"]["zrl"]) == 2  # one per quick window
    assert windows["ratio_ci95"][0] <= windows["ratio_ci95"][1]
    assert any(n.startswith("Rows under the target of 0.9: ") for n in result.notes)
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


def test_ratio_interval_brackets_the_ratio_narrows_with_more_windows_and_is_reproducible():
    import random

    rng = random.Random(1)

    def windows(n, mean):  # rates with a 12% spread, as a window's rate has on these machines
        return [rng.gauss(mean, 0.12 * mean) for _ in range(n)]

    # A 95% interval should hold the true ratio (0.92) in about 95% of runs: allow some slack.
    held = sum(lo < 0.92 < hi for lo, hi in (ratio_interval(windows(15, 92.0), windows(15, 100.0), resamples=500)
                                              for _ in range(40)))
    assert held >= 34
    few = ratio_interval(windows(15, 92.0), windows(15, 100.0))
    many_z, many_r = windows(200, 92.0), windows(200, 100.0)
    many = ratio_interval(many_z, many_r)
    assert many[1] - many[0] < 0.5 * (few[1] - few[0])
    assert ratio_interval(many_z, many_r) == many  # seeded: the JSON's windows give the same interval
    narrow = ratio_interval(many_z, many_r, level=0.5)
    assert many[0] < narrow[0] < narrow[1] < many[1]
    with pytest.raises(ValueError, match="at least 2 samples"):
        ratio_interval([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="level"):
        ratio_interval([1.0, 2.0], [1.0, 2.0], level=1.0)


def test_thread_cpu_counts_other_threads_apart_from_main_and_falls_back_to_the_process_total(monkeypatch):
    import threading
    import time

    from zrl.bench import transport

    spun, done = threading.Event(), threading.Event()

    def spin():  # 50 ms of this thread's own CPU, then parked (an ended thread leaves /proc)
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.05:
            pass
        spun.set()
        done.wait(30)

    before = transport._thread_cpu()
    worker = threading.Thread(target=spin)
    worker.start()
    try:
        assert spun.wait(30)
        after = transport._thread_cpu()
    finally:
        done.set()
        worker.join(30)
    if sys.platform == "linux":
        io, main = after["io"] - before["io"], after["main"] - before["main"]
        assert io >= 0.045 and main < io
    else:
        assert after["main"] - before["main"] >= 0.045

    def no_proc(path):
        raise OSError("no /proc here")

    monkeypatch.setattr(transport.os, "listdir", no_proc)
    fallback = transport._thread_cpu()
    assert fallback["io"] == 0.0 and fallback["main"] >= after["main"] + after["io"] - 0.01
