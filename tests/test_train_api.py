"""zrl.train: `zrl run` from Python, with its progress passed to a callback."""
from __future__ import annotations

import json
import os
import signal
from types import SimpleNamespace

import pytest

import zrl
from zrl.config import ConfigError, load_config
from zrl.launch.options import RunOptions
from zrl.launch.progress_tail import ProgressTail
from zrl.launch.supervisor import Supervisor
from zrl.training import _Callback

SMALL = ["actor.num_envs=8", "learner.batch_size=16", "learner.log_interval_s=0.5", "learner.checkpoint_interval_s=600"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_train_runs_the_pipeline_and_passes_progress_to_the_callback(tmp_path, capfd):
    records = []

    def callback(progress: dict):
        records.append(progress)
        if len([r for r in records if "steps_per_s" in r]) == 3:  # a few stretches of training: Ctrl-C
            os.kill(os.getpid(), signal.SIGINT)

    result = zrl.train("cartpole_impala", logdir=tmp_path / "run", seed=3, max_seconds=30, overrides=SMALL, callback=callback)

    assert isinstance(result, zrl.RunResult) and result.logdir == tmp_path / "run"
    assert result.summary == json.loads((result.logdir / "summary.json").read_text())
    assert result.summary["stop_reason"] == "interrupted" and result.summary["seed"] == 3
    assert result.exit_code == 130 and result.interrupted, "Ctrl-C stops the run cleanly and returns its result"
    assert result.env_steps > 0 and result.mean_return is not None
    training = [r for r in records if "steps_per_s" in r]
    assert len(training) >= 3 and {"env_steps", "updates", "mean_return", "elapsed_s", "time"} <= set(training[0])
    steps = [r["env_steps"] for r in records]
    assert steps == sorted(steps) and steps[-1] <= result.env_steps
    assert any(result.logdir.glob("checkpoints/*.pt")), "the learner checkpointed as it stopped"
    out = capfd.readouterr().out
    assert "[actor 0] connected" in out and "steps " in out, "the children's lines come through this process's stdout"


def test_train_refuses_a_bad_config_before_starting_anything(tmp_path):
    with pytest.raises(ConfigError, match="shipped: "):
        zrl.train("no_such_config", logdir=tmp_path / "run")
    with pytest.raises(ConfigError, match="learner.batch_siz"):
        zrl.train("cartpole_impala", logdir=tmp_path / "run", overrides=["learner.batch_siz=3"])
    with pytest.raises(TypeError, match="a list"):
        zrl.train("cartpole_impala", logdir=tmp_path / "run", overrides="learner.batch_size=8")
    assert not (tmp_path / "run").exists()


def test_a_callback_that_returns_false_stops_the_run(tmp_path):
    (tmp_path / "progress.jsonl").write_text("")
    supervisor = Supervisor(load_config(None), RunOptions(num_actors=0, seed=0, logdir=str(tmp_path)), on_progress=lambda p: p["env_steps"] < 10)
    supervisor.tail = ProgressTail(tmp_path / "progress.jsonl")
    supervisor.learner = SimpleNamespace(alive=lambda: False)
    with open(tmp_path / "progress.jsonl", "a") as f:
        f.write('{"env_steps": 5}\n')
    supervisor._poll_progress()
    assert not supervisor.stopping.is_set()
    with open(tmp_path / "progress.jsonl", "a") as f:
        f.write('{"env_steps": 10}\n')
    supervisor._poll_progress()
    assert supervisor.stopping.is_set() and supervisor.callback_stop


def test_an_error_in_the_callback_stops_the_run_and_is_kept_to_raise():
    def callback(progress):
        raise KeyError("oops")

    guard = _Callback(callback)
    assert guard({"env_steps": 1}) is False and isinstance(guard.error, KeyError)
    assert guard({"env_steps": 2}) is None, "not called again"
