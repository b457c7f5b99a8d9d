"""learner.prefetch_batches: batches made on a thread ahead of the training loop."""
from __future__ import annotations

import threading

import pytest
import torch

from zrl.algorithms.impala import algorithm as impala
from zrl.learner.prefetch import Prefetcher
from helpers import small_config, wait_for

pytestmark = pytest.mark.timeout(60)


def _threads(name: str = "zrl-prefetch") -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def test_batches_come_in_order_and_no_more_than_depth_ahead():
    made = []
    gate = threading.Semaphore(0)

    def make(stop):
        if not gate.acquire(timeout=0.05):
            return None  # nothing yet: the thread asks again
        made.append(len(made))
        return made[-1]

    pf = Prefetcher(make, depth=2)
    try:
        assert pf.get(0.1) is None  # nothing made yet
        for _ in range(5):
            gate.release()
        wait_for(lambda: len(made) == 3, 10, "two batches ready and a third waiting for room")
        assert [pf.get(5) for _ in range(5)] == [0, 1, 2, 3, 4]
        assert pf.get(0.1) is None
    finally:
        pf.close()
    assert not pf.alive


def test_an_error_in_make_is_raised_by_get_after_the_batches_made_before_it():
    calls = []

    def make(stop):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("collate failed")
        return "batch"

    pf = Prefetcher(make, depth=4)
    try:
        assert pf.get(5) == "batch"
        wait_for(lambda: not pf.alive, 10, "the thread to end")
        with pytest.raises(RuntimeError, match="collate failed"):
            pf.get(0.1)
    finally:
        pf.close()


def test_close_stops_a_thread_that_waits_for_room_or_for_data():
    full = Prefetcher(lambda stop: "batch", depth=1)  # its queue fills at once: it waits for room
    empty = Prefetcher(lambda stop: None if not stop.wait(0.05) else None, depth=1)
    wait_for(lambda: full._ready.full(), 10, "the queue to fill")
    full.close()
    empty.close()
    assert not full.alive and not empty.alive
    with pytest.raises(ValueError, match="depth must be >= 1"):
        Prefetcher(lambda stop: None, depth=0)


def test_a_learner_with_prefetch_trains_and_stops_its_thread(make_learner, make_actor, monkeypatch):
    cfg = small_config("learner.prefetch_batches=2")
    on = {}  # the thread each collate ran on
    real = impala.Impala.collate

    def collate(self, msgs, device):
        on[threading.current_thread().name] = on.get(threading.current_thread().name, 0) + 1
        return real(self, msgs, device)

    monkeypatch.setattr(impala.Impala, "collate", collate)
    learner, runner = make_learner(cfg)
    make_actor(cfg)
    wait_for(lambda: learner.updates >= 10, 60, "10 updates")
    assert len(_threads()) == 1
    learner.request_stop()
    result = runner.join(30)
    assert result.updates >= 10 and result.stop_reason == "interrupted"
    assert set(on) == {"zrl-prefetch"} and on["zrl-prefetch"] >= result.updates
    assert _threads() == []
    assert learner.run_lag_n > 0  # the chunks' versions came along with their batches (the run's count: the last log took the interval's)


def test_a_failing_collate_on_the_prefetch_thread_ends_the_run_with_its_error(make_learner, make_actor, monkeypatch):
    cfg = small_config("learner.prefetch_batches=1")

    def collate(self, msgs, device):
        raise RuntimeError("planted collate failure")

    monkeypatch.setattr(impala.Impala, "collate", collate)
    learner, runner = make_learner(cfg)
    make_actor(cfg)
    with pytest.raises(RuntimeError, match="planted collate failure"):
        runner.join(30)
    assert _threads() == [] and learner.updates == 0


def test_prefetch_batches_is_checked_and_auto_means_two_on_cuda_only():
    from zrl.config_sections import AUTO_PREFETCH_CUDA
    from zrl.config import ConfigError

    lc = small_config("learner.prefetch_batches=8").learner
    assert lc.prefetch_batches == 8 and lc.prefetch_for(torch.device("cuda")) == 8
    auto = small_config().learner
    assert auto.prefetch_batches == "auto"
    assert auto.prefetch_for(torch.device("cpu")) == 0
    assert auto.prefetch_for(torch.device("cuda", 1)) == AUTO_PREFETCH_CUDA == 2
    assert small_config("learner.prefetch_batches=0").learner.prefetch_for(torch.device("cuda")) == 0
    for bad in ("-1", "9", "sometimes", "1.5", "true"):
        with pytest.raises(ConfigError, match=r"learner\.prefetch_batches"):
            small_config(f"learner.prefetch_batches={bad}")
