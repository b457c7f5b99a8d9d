"""`zrl bench pipeline`'s plot, from rows shaped as the bench writes them, its learner-overhead
timing on a couple of updates, and its actor -> sink measurement for half a second (the bench itself
runs real processes for minutes and is not run here)."""
from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from zrl.bench.pipeline import plot


def test_pipeline_plot_draws_every_env_or_says_it_cannot(tmp_path):
    rows = []
    for env, raw in (("CartPole", 160_000.0), ("Pong", 6_000.0)):
        rows.append({"measurement": "raw env (steps/s)", "env": env, "n": 16, "zrl": "", "reference": raw, "ratio": ""})
        rows.append({"measurement": "actor -> sink (steps/s)", "env": env, "n": 16, "zrl": 0.6 * raw, "reference": raw, "ratio": 0.6})
        for n in (1, 2, 4):
            rows.append({"measurement": "zrl run (env steps/s)", "env": env, "n": n, "zrl": 0.2 * n * raw, "reference": raw, "ratio": 0.2 * n})
        rows.append({"measurement": "learner update (ms)", "env": env, "n": 32, "zrl": 3.0, "reference": 2.9, "ratio": 1.03})
    png = tmp_path / "out" / "pipeline.png"
    drew = plot(rows, png)
    if importlib.util.find_spec("matplotlib") is None:
        assert drew is False and not png.exists()
    else:
        assert drew is True and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


@pytest.mark.timeout(30)
def test_sink_runs_alternate_with_raw_runs_and_each_ratio_uses_its_neighbours(monkeypatch):
    # raw, sink, raw, sink, raw, sink, raw: a raw env drifting 1000 -> 4000 while the actor runs
    # at 0.5 of whatever the raw env does at the time.
    from zrl.bench import pipeline

    calls = []
    raws = iter([1000.0, 2000.0, 3000.0, 4000.0])
    sinks = iter([750.0, 1250.0, 1750.0])
    monkeypatch.setattr(pipeline, "raw_env_rate", lambda cfg, s: calls.append("raw") or next(raws))
    monkeypatch.setattr(pipeline, "actor_sink_rate", lambda name, cfg, s, ov=(), cpu=None: calls.append(("sink", ov)) or next(sinks))
    raw, sink, ratio, each = pipeline.sink_against_raw("Pong", None, 1.0, ("x=1",), pairs=3)
    assert calls == ["raw", ("sink", ("x=1",)), "raw", ("sink", ("x=1",)), "raw", ("sink", ("x=1",)), "raw"]
    assert (raw, sink, ratio) == (2500.0, 1250.0, 0.5)  # medians; the ratios are 750/1500, 1250/2500, 1750/3500
    assert each == [0.5, 0.5, 0.5]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, overrides", [("CartPole", ["learner.batch_size=64"]), ("Pong", ["learner.batch_size=8", "actor.env_groups=3"])])
def test_learner_overhead_times_both_paths_on_batches_of_whole_chunks(name, overrides):
    # The Pong batch is one chunk of num_envs / env_groups columns, narrower than an actor's envs.
    from zrl.bench.pipeline import _config, learner_overhead

    zrl_s, plain_s = learner_overhead(name, _config(name, overrides), 2)
    assert 0 < plain_s and 0 < zrl_s


def test_learner_overhead_with_prefetch_stops_its_thread():
    import threading

    from zrl.bench.pipeline import _config, learner_overhead

    zrl_s, plain_s = learner_overhead("CartPole", _config("CartPole", ["learner.batch_size=64"]), 3, prefetch=2)
    assert 0 < plain_s and 0 < zrl_s
    assert not [t for t in threading.enumerate() if t.name == "zrl-prefetch"]


@pytest.mark.timeout(120)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("from_host, prefetch", [(False, 0), (True, 0), (False, 2)])
def test_learner_overhead_on_a_gpu(from_host, prefetch):
    from zrl.bench.pipeline import _config, learner_overhead

    zrl_s, plain_s = learner_overhead("Pong", _config("Pong", ["learner.batch_size=8", "actor.env_groups=3"]), 20, "cuda", from_host, prefetch)
    assert 0 < plain_s and 0 < zrl_s


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, overrides", [
    ("CartPole", ["actor.num_envs=4"]),
    # A `zrl actor` acting on the first 4 of 6 envs ready (actor.env_batching first_ready, actor.act_batch),
    # its chunks 3 groups of 2
    ("Pong", ["actor.num_envs=6", "actor.env_groups=3", "actor.env_batching=first_ready", "actor.act_batch=4", "actor.unroll_length=5"]),
])
def test_actor_sink_rate_measures_a_real_actor_and_leaves_no_temp_dir(tmp_path, monkeypatch, name, overrides):
    # The sink's ipc endpoint lives in a temp dir of its own: the bench removes it when done.
    import tempfile

    from zrl.bench.pipeline import _config, actor_sink_rate

    if name == "Pong":
        pytest.importorskip("ale_py.vector_env", reason="ale-py (with AtariVectorEnv) is not installed")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cpu = []
    rate = actor_sink_rate(name, _config(name, overrides), 0.5, overrides, cpu)
    assert rate > 0
    if sys.platform == "linux":  # the actor's CPU per env step, from /proc: (emulator threads, the rest)
        [(emulator, rest)] = cpu
        assert rest > 0 and (emulator > 0) == (name == "Pong")  # CartPole steps in the actor's own thread
    # (Only the sink's: torch may put a cache of its own there when first asked for one.)
    assert [p for p in tmp_path.iterdir() if p.name.startswith("zrl-sink-")] == []
