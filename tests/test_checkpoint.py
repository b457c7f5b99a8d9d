"""Checkpoints: resume continues the counters; incompatible or corrupt ones are refused."""
from __future__ import annotations

import logging
import os

import pytest
import torch

from zrl import checkpoint
from zrl.checkpoint import CheckpointError
from helpers import small_config, wait_for


def train_a_little(make_learner, make_actor, cfg, logdir, updates):
    learner, runner = make_learner(cfg, logdir=logdir)
    actor, _ = make_actor(cfg)
    wait_for(lambda: learner.updates >= updates, 60, f"{updates} updates")
    learner.request_stop()
    result = runner.join(30)
    actor.stop.set()
    return learner, result


def test_resume_continues_the_counters(tmp_path, endpoint, make_learner, make_actor):
    cfg = small_config()
    logdir = tmp_path / "run"
    first, r1 = train_a_little(make_learner, make_actor, cfg, logdir, 5)
    assert r1.stop_reason == "interrupted"
    saved = checkpoint.list_checkpoints(logdir / "checkpoints")
    assert saved, "a checkpoint is written on stop"
    state = checkpoint.load(saved[-1])
    assert state["counters"]["updates"] == r1.updates and state["counters"]["env_steps"] == r1.env_steps
    first.close()

    # A new endpoint: ZeroMQ releases a closed socket's inproc name asynchronously.
    second, runner = make_learner(cfg, logdir=logdir, resume=True, bind=endpoint + "-resumed")
    assert second.updates == r1.updates and second.env_steps == r1.env_steps and second.episodes == r1.episodes
    # Same weights as were saved.
    for (k, v), (k2, v2) in zip(state["model"].items(), second.model.state_dict().items()):
        assert k == k2 and torch.equal(v, v2.cpu())  # (the learner's may be on a GPU)
    make_actor(cfg, index=0, learner=endpoint + "-resumed")
    wait_for(lambda: second.updates >= r1.updates + 3, 60, "training to continue after resume")
    assert second.env_steps > r1.env_steps


def test_resuming_a_run_whose_returns_already_reach_the_target_says_so(tmp_path, endpoint, make_learner, make_actor, caplog):
    cfg = small_config("run.return_window=2")
    logdir = tmp_path / "run"
    first, runner = make_learner(cfg, logdir=logdir)
    actor, _ = make_actor(cfg)
    wait_for(lambda: len(first.returns) == 2 and first.updates >= 1, 60, "episodes to finish")
    first.request_stop()
    runner.join(30)
    actor.stop.set()
    first.close()
    returns = checkpoint.load(checkpoint.list_checkpoints(logdir / "checkpoints")[-1])["counters"]["recent_returns"]
    assert len(returns) == 2
    with caplog.at_level(logging.INFO, logger="zrl.learner"):
        make_learner(cfg, logdir=logdir, resume=True, start=False, bind=endpoint + "-high", stop_at_return=max(returns) + 1)
        assert "already reach" not in caplog.text
        make_learner(cfg, logdir=logdir, resume=True, start=False, bind=endpoint + "-low", stop_at_return=min(returns))
    assert "already reach the target" in caplog.text and "raise --stop-at-return" in caplog.text


def test_incompatible_checkpoint_is_refused_saying_why(tmp_path, make_learner, make_actor):
    cfg = small_config()
    logdir = tmp_path / "run"
    first, _ = train_a_little(make_learner, make_actor, cfg, logdir, 2)
    first.close()
    wider = small_config("model.hidden_sizes=[32, 32]")
    with pytest.raises(CheckpointError, match=r"different model.*hidden_sizes"):
        make_learner(wider, logdir=logdir, resume=True, start=False)


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    ckdir = tmp_path / "checkpoints"
    good = {"model_hash": "h", "model_shaping": {}, "model": {"w": torch.ones(2)}, "optimizer": {}, "counters": {"updates": 1}, "config": {}}
    checkpoint.save(ckdir, 1, good, keep=3)
    checkpoint.save(ckdir, 2, {**good, "counters": {"updates": 2}}, keep=3)
    newest = checkpoint.list_checkpoints(ckdir)[-1]
    newest.write_bytes(newest.read_bytes()[:50])  # damaged on disk
    path, state = checkpoint.load_latest(ckdir)
    assert state["counters"]["updates"] == 1
    with pytest.raises(CheckpointError, match="cannot be read"):
        checkpoint.load(newest)


def test_a_file_that_is_not_a_checkpoint_is_named_without_torchs_advice(tmp_path):
    bad = tmp_path / "garbage.pt"
    bad.write_bytes(b"garbage\n")
    with pytest.raises(CheckpointError, match=r"garbage.pt: not a zrl checkpoint: damaged") as e:
        checkpoint.load(bad)
    assert "weights_only" not in str(e.value)  # torch's text advises loading it unsafely


def test_a_write_killed_midway_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    ckdir = tmp_path / "checkpoints"
    good = {"model_hash": "h", "model_shaping": {}, "model": {}, "optimizer": {}, "counters": {"updates": 1}, "config": {}}
    checkpoint.save(ckdir, 1, good, keep=3)

    def dies_midway(obj, f):
        f.write(b"partial bytes")
        raise KeyboardInterrupt  # stands in for the process dying mid-write

    monkeypatch.setattr(checkpoint.torch, "save", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(ckdir, 2, good, keep=3)
    monkeypatch.undo()
    assert [p.name for p in checkpoint.list_checkpoints(ckdir)] == ["ckpt-000000000001.pt"]
    assert checkpoint.load_latest(ckdir)[1]["counters"]["updates"] == 1
    # A temporary left behind by a real kill is never mistaken for a checkpoint.
    (ckdir / ".ckpt-dead.tmp").write_bytes(b"junk")
    assert checkpoint.load_latest(ckdir)[1]["counters"]["updates"] == 1


def test_checkpoints_keep_only_the_last_k(tmp_path):
    ckdir = tmp_path / "c"
    st = {"model_hash": "h", "model_shaping": {}, "model": {}, "optimizer": {}, "counters": {}, "config": {}}
    for i in range(5):
        checkpoint.save(ckdir, i, st, keep=2)
    assert [p.name for p in checkpoint.list_checkpoints(ckdir)] == ["ckpt-000000000003.pt", "ckpt-000000000004.pt"]


def test_other_format_is_refused(tmp_path):
    p = tmp_path / "ckpt-000000000001.pt"
    torch.save({"format_version": 99}, p)
    with pytest.raises(CheckpointError, match="format"):
        checkpoint.load(p)
    os.unlink(p)


def test_resume_with_another_reward_scale_warns(tmp_path, endpoint, make_learner, make_actor, caplog):
    cfg = small_config()  # the default config: algo.reward_scale 0.1
    logdir = tmp_path / "run"
    first, _ = train_a_little(make_learner, make_actor, cfg, logdir, 2)
    first.close()
    with caplog.at_level(logging.INFO, logger="zrl.learner"):
        make_learner(cfg, logdir=logdir, resume=True, start=False, bind=endpoint + "-same")
        assert "reward_scale" not in caplog.text
        make_learner(small_config("algo.reward_scale=1.0"), logdir=logdir, resume=True, start=False, bind=endpoint + "-other")
        assert "env.id" not in caplog.text
        make_learner(small_config("env.id=CartPole-v0"), logdir=logdir, resume=True, start=False, bind=endpoint + "-env")
        with pytest.raises(CheckpointError, match=r"trained .*\[4\].* gives obs .*\[6\]"):  # weights that cannot act there
            make_learner(small_config("env.id=Acrobot-v1"), logdir=logdir, resume=True, start=False, bind=endpoint + "-acrobot")
    assert "trained with algo.reward_scale 0.1, this config has 1.0" in caplog.text
    assert "trained on env.id 'CartPole-v1', this config has 'CartPole-v0'" in caplog.text  # the same specs: allowed


def test_algo_changes_counts_a_setting_the_checkpoint_lacks_as_its_default_then():
    cfg = small_config()  # algo.reward_scale 0.1, discount 0.995
    saved = cfg.to_dict()
    del saved["algo"]["reward_scale"]  # a checkpoint from before the setting existed (1.0 then)
    saved["algo"]["discount"] = 0.99
    assert checkpoint.algo_changes({"config": saved}, cfg) == [("discount", 0.99, 0.995), ("reward_scale", 1.0, 0.1)]
    assert checkpoint.algo_changes({"config": cfg.to_dict()}, cfg) == []


def test_a_fresh_run_moves_an_earlier_runs_checkpoints_aside(tmp_path, endpoint, make_learner, make_actor):
    cfg = small_config()
    logdir = tmp_path / "run"
    ckdir = logdir / "checkpoints"
    first, _ = train_a_little(make_learner, make_actor, cfg, logdir, 2)
    first.close()
    # An earlier, longer run: its checkpoint numbers are above anything the new run reaches.
    old = checkpoint.list_checkpoints(ckdir)[-1]
    os.replace(old, checkpoint.path_for(ckdir, 50_000))
    second, runner = make_learner(cfg, logdir=logdir, bind=endpoint + "-fresh")
    make_actor(cfg, learner=endpoint + "-fresh")
    wait_for(lambda: second.updates >= 2, 60, "the fresh run's updates")
    second.request_stop()
    result = runner.join(30)
    mine = checkpoint.list_checkpoints(ckdir)
    assert mine and all(checkpoint.load(p)["counters"]["updates"] <= result.updates for p in mine)
    assert checkpoint.load_latest(ckdir)[1]["counters"]["updates"] == result.updates
    aside = [d for d in logdir.iterdir() if d.name.startswith("checkpoints-")]
    assert len(aside) == 1 and [p.name for p in checkpoint.list_checkpoints(aside[0])] == ["ckpt-000000050000.pt"]


def test_set_aside_leaves_an_empty_or_missing_directory_alone(tmp_path):
    assert checkpoint.set_aside(tmp_path / "none") is None
    (tmp_path / "empty").mkdir()
    assert checkpoint.set_aside(tmp_path / "empty") is None and (tmp_path / "empty").is_dir()


def test_resume_applies_the_configs_optimizer_settings(tmp_path, endpoint, make_learner, make_actor, caplog):
    cfg = small_config("learner.learning_rate=0.001", "learner.adam_eps=0.001")
    logdir = tmp_path / "run"
    first, _ = train_a_little(make_learner, make_actor, cfg, logdir, 2)
    first.close()
    lower = small_config("learner.learning_rate=0.00001", "learner.adam_eps=1e-8")
    with caplog.at_level(logging.INFO, logger="zrl.learner"):
        resumed, _ = make_learner(lower, logdir=logdir, resume=True, start=False, bind=endpoint + "-lower")
    groups = resumed.optimizer.param_groups
    assert all(g["lr"] == 0.00001 and g["eps"] == 1e-8 for g in groups)
    assert resumed.optimizer.state, "Adam's moments carry over"
    assert "learner.learning_rate 0.001; resuming with this config's 1e-05" in caplog.text


def test_resume_with_another_optimizer_starts_it_afresh(tmp_path, endpoint, make_learner, make_actor, caplog):
    cfg = small_config()
    logdir = tmp_path / "run"
    first, _ = train_a_little(make_learner, make_actor, cfg, logdir, 2)
    saved = checkpoint.load(checkpoint.list_checkpoints(logdir / "checkpoints")[-1])
    first.close()
    rms = small_config("learner.optimizer=rmsprop")
    with caplog.at_level(logging.INFO, logger="zrl.learner"):
        resumed, runner = make_learner(rms, logdir=logdir, resume=True, bind=endpoint + "-rms")
    assert isinstance(resumed.optimizer, torch.optim.RMSprop) and not resumed.optimizer.state
    assert "learner.optimizer adam, this config has rmsprop: the optimiser starts afresh" in caplog.text
    for k, v in saved["model"].items():
        assert torch.equal(v, resumed.model.state_dict()[k].cpu())
    make_actor(rms, learner=endpoint + "-rms")
    wait_for(lambda: resumed.updates >= saved["counters"]["updates"] + 2, 60, "RMSprop updates after resume")


def test_a_fresh_run_that_has_not_trained_saves_nothing_and_moves_nothing(tmp_path, make_learner):
    from zrl import spaces

    ckdir = tmp_path / "run" / "checkpoints"
    st = {"model_hash": "h", "model_shaping": {}, "model": {}, "optimizer": {}, "counters": {"updates": 7}, "config": {}}
    checkpoint.save(ckdir, 7, st, keep=3)  # an earlier run's
    learner, _ = make_learner(small_config(), logdir=tmp_path / "run", start=False)
    learner._build(spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2))  # as the first hello does
    assert learner.save_checkpoint(1.0) is None  # Ctrl-C before the first update
    assert [p.name for p in checkpoint.list_checkpoints(ckdir)] == ["ckpt-000000000007.pt"]
    assert not [d for d in (tmp_path / "run").iterdir() if d.name.startswith("checkpoints-")]


def test_resume_rmsprop_with_momentum_now(tmp_path, endpoint, make_learner, make_actor):
    cfg = small_config("learner.optimizer=rmsprop", "learner.rmsprop_momentum=0.0")
    logdir = tmp_path / "run"
    first, r1 = train_a_little(make_learner, make_actor, cfg, logdir, 2)
    first.close()
    with_momentum = small_config("learner.optimizer=rmsprop", "learner.rmsprop_momentum=0.9")
    resumed, runner = make_learner(with_momentum, logdir=logdir, resume=True, bind=endpoint + "-momentum")
    assert all(g["momentum"] == 0.9 for g in resumed.optimizer.param_groups)
    make_actor(with_momentum, learner=endpoint + "-momentum")
    wait_for(lambda: resumed.updates >= r1.updates + 3 or runner.thread.is_alive() is False, 60, "updates after resume")
    assert resumed.updates >= r1.updates + 3, "the trainer failed after resuming"


def _impala(cfg, obs_spec, act_spec):
    from zrl.algorithms.impala.algorithm import Impala

    algo = Impala(cfg, obs_spec, act_spec)
    algo.setup(torch.device("cpu"))
    return algo


def test_the_writer_refuses_a_checkpoint_whose_config_does_not_describe_its_weights(tmp_path):
    from zrl import spaces
    from zrl.learner.progress import Progress
    from zrl.learner.resume import Checkpoints

    cfg = small_config()
    specs = (spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2))
    algo = _impala(cfg, *specs)
    progress = Progress(cfg, None)
    ckdir = tmp_path / "checkpoints"
    for other, why in ((small_config("model.hidden_sizes=[32, 32]"), r"model: the model has .*64, 64.*the config has .*32, 32"),
                       (small_config("env.id=Acrobot-v1"), r"env: the model was built for 'CartPole-v1', the config to save has 'Acrobot-v1'")):
        with pytest.raises(CheckpointError, match=rf"refusing to write a checkpoint to .* whose config does not describe its weights: {why}"):
            Checkpoints(other, ckdir, resumed=True, say=print).save(algo, progress, specs, 0.0)
    acrobot = (spaces.BoxSpec((6,), "float32"), spaces.DiscreteSpec(3))
    with pytest.raises(CheckpointError, match=r"obs: the model has .*\[4\].*the config has .*\[6\]"):  # the specs to save are not the model's
        Checkpoints(cfg, ckdir, resumed=True, say=print).save(algo, progress, acrobot, 0.0)
    algo.model = _impala(cfg, *acrobot).model  # weights of another shape under the same config and specs
    with pytest.raises(CheckpointError, match=r"the config's model has \(\d+, 4\), the weights \(\d+, 6\)"):
        Checkpoints(cfg, ckdir, resumed=True, say=print).save(algo, progress, specs, 0.0)
    assert checkpoint.list_checkpoints(ckdir) == [], "a refused checkpoint is not written"
    algo.model = _impala(cfg, *specs).model
    assert Checkpoints(cfg, ckdir, resumed=True, say=print).save(algo, progress, specs, 0.0) is not None


def test_eval_of_a_checkpoint_whose_config_does_not_match_its_weights_says_what_differs(tmp_path):
    """What a resume under another env.id used to write: CartPole's config, Acrobot's weights."""
    from zrl import spaces
    from zrl.evaluate import evaluate_checkpoint

    cfg = small_config()
    obs, act = spaces.BoxSpec((6,), "float32").to_json(), spaces.DiscreteSpec(3).to_json()
    algo = _impala(cfg, spaces.from_json(obs), spaces.from_json(act))
    state = {"model_hash": cfg.model_hash(obs, act), "model_shaping": cfg.model_shaping(obs, act), "config": cfg.to_dict(),
             "obs_spec": obs, "action_spec": act, **algo.checkpoint_state(), "counters": {"updates": 1}}
    path = checkpoint.save(tmp_path / "checkpoints", 1, state, keep=1)
    with pytest.raises(CheckpointError, match=r"weights take obs .*\[6\].* but the env of its config \(env.id 'CartPole-v1'\) gives obs .*\[4\]"):
        evaluate_checkpoint(tmp_path, episodes=1)
    wrong = {**state, "obs_spec": spaces.BoxSpec((4,), "float32").to_json(), "action_spec": spaces.DiscreteSpec(2).to_json()}
    checkpoint.save(tmp_path / "checkpoints", 2, wrong, keep=1)  # specs right, weights of another shape
    with pytest.raises(CheckpointError, match=r"its weights do not fit the model its config describes"):
        evaluate_checkpoint(path.parent, episodes=1)
