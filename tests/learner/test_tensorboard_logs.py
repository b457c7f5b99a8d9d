"""What the learner writes to TensorBoard besides its curves: the config as hyper-parameters
(the HPARAMS tab) with the final mean return as their metric, the learning rate after any
decay, and the policy's entropy under a name that says so."""
from __future__ import annotations

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from zrl.learner.report import flat_hparams
from zrl.metrics import MetricsWriter
from helpers import small_config, wait_for


def events(logdir) -> EventAccumulator:
    ea = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    ea.Reload()
    return ea


def hparams_data(ea: EventAccumulator, tag: str) -> HParamsPluginData:
    return HParamsPluginData.FromString(ea.PluginTagToContent("hparams")[tag])


def test_a_learner_logs_hparams_learning_rate_and_policy_entropy(tmp_path, make_learner, make_actor):
    # The rate decays to half over the first 100 env steps, so the one logged is the decayed one.
    cfg = small_config("learner.learning_rate=0.002", "learner.lr_decay_env_steps=100", "learner.lr_final_scale=0.5")
    learner, runner = make_learner(cfg, logdir=tmp_path / "run")
    make_actor(cfg)
    wait_for(lambda: learner.env_steps > 200 and len(learner.returns) >= 2 and learner.updates >= 3, 60, "episodes and updates")
    learner.request_stop()
    result = runner.join(30)
    ea = events(tmp_path / "run")
    scalars = ea.Tags()["scalars"]
    assert ea.Scalars("learner/learning_rate")[-1].value == pytest.approx(0.001)
    assert "policy/entropy" in scalars and "loss/entropy" not in scalars and "entropy" not in scalars
    start = hparams_data(ea, "_hparams_/session_start_info").session_start_info
    assert start.hparams["learner.learning_rate"].number_value == pytest.approx(0.002)
    assert start.hparams["env.id"].string_value == "CartPole-v1"
    assert start.hparams["model.hidden_sizes"].string_value == "[64, 64]"
    experiment = hparams_data(ea, "_hparams_/experiment").experiment
    assert [m.name.tag for m in experiment.metric_infos] == ["hparams/final_mean_return", "episode/return"]
    (final,) = ea.Scalars("hparams/final_mean_return")
    # (written as training stops, just before the receiver does: an episode may land in between)
    assert min(learner.returns) <= final.value <= max(learner.returns)
    assert result.final_mean_return is not None


def test_flat_hparams_keeps_scalars_and_writes_lists_as_text():
    flat = flat_hparams({"a": {"x": 1, "y": None, "z": [1, 2], "w": {"deep": True}}, "b": "s"})
    assert flat == {"a.x": 1, "a.z": "[1, 2]", "a.w.deep": True, "b": "s"}


def test_hparams_go_into_the_runs_own_events(tmp_path):
    writer = MetricsWriter(tmp_path, console=False)
    writer.hparams({"learner.learning_rate": 0.01}, ["episode/return"])
    writer.close()
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []  # (add_hparams would make a sub-run)
    start = hparams_data(events(tmp_path), "_hparams_/session_start_info").session_start_info
    assert start.hparams["learner.learning_rate"].number_value == 0.01
