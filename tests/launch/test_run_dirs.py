"""Run directories: where a run writes, what becomes of an earlier run there, the config a
run keeps and a --resume continues with, refused resumes, and the summary of a learner
that did not finish. Most tests call the functions and the CLI in-process; two run `zrl run`."""
from __future__ import annotations

import json
import os
import signal

import pytest
from click.testing import CliRunner

from helpers import DEFAULT_CONFIG, Proc, small_config, wait_for
from zrl import spaces
from zrl.config import load_config
from zrl.launch import rundir

ACROBOT_OBS = spaces.BoxSpec((6,), "float32").to_json()
ACROBOT_ACT = spaces.DiscreteSpec(3).to_json()


def write_run(d, cfg, updates=5, env_steps=1000, obs=ACROBOT_OBS, act=ACROBOT_ACT):
    """A run directory as a finished run leaves it: config.yaml, events, summary, a checkpoint."""
    from zrl import checkpoint

    d.mkdir(parents=True, exist_ok=True)
    rundir.save_config(d, cfg)
    (d / "events.out.tfevents.1.host.1.0").write_bytes(b"events")
    (d / "summary.json").write_text("{}")
    state = {"model_hash": cfg.model_hash(obs, act), "model_shaping": cfg.model_shaping(obs, act), "config": cfg.to_dict(),
             "obs_spec": obs, "action_spec": act, "model": {}, "optimizer": {},
             "counters": {"updates": updates, "env_steps": env_steps, "episodes": 7, "recent_returns": [1.0, 3.0], "recent_eval_returns": []}}
    return checkpoint.save(d / "checkpoints", updates, state, keep=3)


def listing(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def cli(args, monkeypatch, tmp_path):
    """`zrl ARGS` in-process, from tmp_path, with run_local and run_learner caught: (result, [(cfg, opts or logdir)])."""
    from zrl import launch
    from zrl.cli import main

    started = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launch, "run_local", lambda cfg, opts: started.append((cfg, opts)) or 0)
    monkeypatch.setattr(launch, "run_learner", lambda cfg, bind, logdir, **kw: started.append((cfg, logdir)) or 0)
    return CliRunner().invoke(main, args), started


def test_a_run_without_logdir_gets_a_new_directory_named_after_the_config_and_time(tmp_path, monkeypatch):
    result, started = cli(["run", "--max-seconds", "5"], monkeypatch, tmp_path)
    assert result.exit_code == 0, result.output
    (cfg, opts), = started
    logdir = tmp_path / opts.logdir
    assert logdir.parent == tmp_path / "runs" / "cartpole_impala" and logdir.is_dir()
    assert cfg.run.max_seconds == 5
    again, started = cli(["run"], monkeypatch, tmp_path)  # the same second: a directory of its own
    assert again.exit_code == 0 and tmp_path / started[0][1].logdir != logdir
    custom = tmp_path / "elsewhere"
    _, started = cli(["learner", "-o", f"run.logdir={custom}"], monkeypatch, tmp_path)
    assert started[0][1].startswith(str(custom) + os.sep)  # run.logdir: where runs of the config go


def test_a_fresh_run_moves_the_whole_earlier_run_aside(tmp_path):
    d = tmp_path / "run"
    write_run(d, small_config())
    (d / "previous-20200101-000000").mkdir()  # an older one, moved aside before: it stays
    before = listing(d)
    moved = rundir.make_room(d)
    assert moved.parent == d and moved.name.startswith("previous-")
    assert sorted(p.name for p in d.iterdir()) == sorted(["previous-20200101-000000", moved.name])
    assert listing(moved) == [p for p in before if not p.startswith("previous-")]
    assert rundir.make_room(d) is None  # nothing left to move


def test_a_directory_holding_no_run_is_refused_not_emptied(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(rundir.RunDirError, match="holds no zrl run"):
        rundir.make_room(tmp_path)
    assert listing(tmp_path) == ["notes.txt"]
    assert rundir.make_room(tmp_path / "new") is None and (tmp_path / "new").is_dir()


def test_resume_takes_the_runs_config_with_only_this_command_lines_overrides(tmp_path, monkeypatch):
    d = tmp_path / "run"
    write_run(d, small_config("env.id=Acrobot-v1", "algo.reward_scale=1.0"))
    result, started = cli(["run", "--logdir", str(d), "--resume", "--max-seconds", "7"], monkeypatch, tmp_path)
    assert result.exit_code == 0, result.output
    (cfg, opts), = started
    assert cfg.env.id == "Acrobot-v1" and cfg.algo.reward_scale == 1.0 and cfg.actor.num_envs == 4  # the run's
    assert cfg.run.max_seconds == 7 and opts.resume  # this command line's
    assert f"resuming {d} with its config" in result.output


def test_resume_refuses_a_config_file_that_differs_from_the_runs(tmp_path, monkeypatch):
    d = tmp_path / "run"
    write_run(d, load_config(DEFAULT_CONFIG, ["env.id=Acrobot-v1"]))
    result, started = cli(["learner", "--logdir", str(d), "--resume", "--config", str(DEFAULT_CONFIG)], monkeypatch, tmp_path)
    assert result.exit_code == 2 and not started
    assert "env.id: the run's 'Acrobot-v1', --config's 'CartPole-v1'" in result.output and "Leave out --config" in result.output
    same, started = cli(["learner", "--logdir", str(d), "--resume", "--config", str(DEFAULT_CONFIG), "-o", "env.id=Acrobot-v1"],
                        monkeypatch, tmp_path)
    assert same.exit_code == 0 and started[0][0].env.id == "Acrobot-v1", same.output  # the same config: no conflict


def test_resume_without_logdir_continues_the_newest_run_of_the_config(tmp_path, monkeypatch):
    root = tmp_path / "runs" / "cartpole_impala"
    write_run(root / "20240101-000000", small_config())
    write_run(root / "20240102-000000", small_config("env.id=Acrobot-v1"))
    result, started = cli(["run", "--resume"], monkeypatch, tmp_path)
    assert result.exit_code == 0, result.output
    assert started[0][1].logdir == os.path.join("runs", "cartpole_impala", "20240102-000000") and started[0][0].env.id == "Acrobot-v1"
    none, started = cli(["run", "--resume", "--config", str(DEFAULT_CONFIG.parent / "cartpole_ppo.yaml")], monkeypatch, tmp_path)
    assert none.exit_code == 2 and "no earlier run in runs/cartpole_ppo/" in none.output and not started


def test_run_with_no_actors_and_no_agent_server_is_refused(tmp_path, monkeypatch):
    result, started = cli(["run", "--actors", "0"], monkeypatch, tmp_path)
    assert result.exit_code == 2 and not started
    assert "nothing would feed the learner" in result.output and "--actors N" in result.output and "run.agent_server" in result.output
    assert not (tmp_path / "runs").exists(), "a refused run makes no directory"
    served, started = cli(["run", "--actors", "0", "-o", "run.agent_server=true"], monkeypatch, tmp_path)
    assert served.exit_code == 0 and started, served.output


def test_an_unknown_section_names_the_file_not_a_flag(tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text("learnr:\n  batch_size: 3\n")
    result, _ = cli(["run", "--config", str(bad), "--max-seconds", "5", "-o", "run.seed=3"], monkeypatch, tmp_path)
    assert result.exit_code == 2
    assert f"{bad}: unknown section 'learnr'" in result.output and "--max-seconds" not in result.output and "run.seed" not in result.output


def test_a_refused_resume_writes_nothing(tmp_path):
    from zrl.launch import RunOptions, Supervisor

    d = tmp_path / "run"
    write_run(d, small_config("env.id=Acrobot-v1"))  # the run's checkpoint acts on Acrobot's 6 observations
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    cartpole = small_config()
    code = Supervisor(cartpole, RunOptions(num_actors=1, seed=1, logdir=str(d), resume=True)).run()
    assert code == 2
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before


def test_the_summary_of_a_killed_learner_reports_its_newest_checkpoint(tmp_path):
    from zrl.launch import RunOptions, summary

    write_run(tmp_path, small_config(), updates=500, env_steps=2_000_000)
    opts = RunOptions(num_actors=2, seed=1, logdir=str(tmp_path))
    code = summary.summarise(tmp_path / "learner_final.json", tmp_path, opts, opts.t_start + 10, learner_code=-9, resumed_env_steps=1_500_000)
    assert code == 137
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["env_steps"] == 2_000_000 and s["env_steps_this_run"] == 500_000 and s["updates"] == 500 and s["final_mean_return"] == 2.0
    assert s["learner_finished"] is False and s["counters_from"].endswith("ckpt-000000000500.pt")
    assert "killed by SIGKILL" in s["stop_reason"] and "did not finish cleanly" in s["stop_reason"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_run_saves_its_config_and_resume_continues_it_without_the_first_overrides(tmp_path):
    """The red team's case: a run on Acrobot, resumed without `-o env.id=Acrobot-v1`."""
    small = ["--actors", "1", "-o", "actor.num_envs=4", "-o", "actor.unroll_length=5", "-o", "learner.batch_size=8",
             "-o", "learner.log_interval_s=0.5", "-o", "learner.checkpoint_interval_s=600"]
    d = tmp_path / "run"
    first = Proc(["run", "--logdir", str(d), "--max-env-steps", "2000", "-o", "env.id=Acrobot-v1", *small])
    assert first.wait(60) == 0, first.output
    saved = load_config(d / "config.yaml")
    assert saved.env.id == "Acrobot-v1" and saved.run.max_env_steps == 2000 and saved.actor.num_envs == 4
    again = Proc(["run", "--logdir", str(d), "--resume", "--max-env-steps", "4000"])
    assert again.wait(60) == 0, again.output
    assert "resumed from" in again.output and "4 x Acrobot-v1" in again.output
    from zrl import checkpoint

    newest = checkpoint.load_latest(d / "checkpoints")[1]
    assert newest["config"]["env"]["id"] == "Acrobot-v1" and newest["counters"]["env_steps"] >= 4000


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_summary_after_the_learner_is_killed_counts_what_its_checkpoints_hold(tmp_path):
    run = Proc(["run", "--logdir", str(tmp_path), "--actors", "1", "--max-seconds", "100", "-o", "actor.num_envs=4",
                "-o", "actor.unroll_length=5", "-o", "learner.batch_size=8", "-o", "learner.checkpoint_interval_s=0.2"])
    try:
        wait_for(lambda: (tmp_path / "checkpoints").is_dir() and any((tmp_path / "checkpoints").glob("ckpt-*.pt")), 60, "a checkpoint")
        os.kill(json.loads((tmp_path / "pids.json").read_text())["learner"], signal.SIGKILL)
        code = run.wait(60)
    finally:
        run.kill_tree()
    assert code == 137, run.output
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["env_steps"] > 0 and s["updates"] > 0 and s["learner_finished"] is False, s
    assert "killed by SIGKILL" in s["stop_reason"] and "did not finish cleanly" in s["stop_reason"]
