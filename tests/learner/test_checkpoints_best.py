"""Checkpoints keep the newest learner.keep_checkpoints plus checkpoints/best.pt, the one saved
with the highest mean return; --resume and `zrl eval --checkpoint LOGDIR` take the newest,
`zrl eval --best` the best."""
from __future__ import annotations

import os

import pytest
import torch
from click.testing import CliRunner

from zrl import algorithms, checkpoint
from zrl.checkpoint import CheckpointError
from zrl.cli import main
from zrl.envs import probe_specs
from zrl.learner.progress import Progress
from zrl.learner.resume import Checkpoints, find_resume
from helpers import small_config


class Run:
    """A learner's checkpointing without the learner: an IMPALA model, its progress, and the
    Checkpoints that save them, with the recent returns set by hand."""

    def __init__(self, logdir, keep=2, resumed=False):
        self.cfg = small_config(f"learner.keep_checkpoints={keep}")
        self.specs = probe_specs(self.cfg.env)
        self.algo = algorithms.get(self.cfg.algo.name)(self.cfg, *self.specs)
        self.algo.setup(torch.device("cpu"))
        self.progress = Progress(self.cfg, None)
        self.ckdir = logdir / "checkpoints"
        self.checkpoints = Checkpoints(self.cfg, self.ckdir, resumed, lambda text: None)

    def save(self, updates: int, mean_return: float | None):
        self.progress.updates = updates
        self.progress.returns.clear()
        if mean_return is not None:
            self.progress.returns.extend([mean_return - 1, mean_return + 1])
        return self.checkpoints.save(self.algo, self.progress, self.specs, 1.0)


def best_updates(ckdir) -> int:
    return checkpoint.load(checkpoint.best_path(ckdir))["counters"]["updates"]


def test_the_last_k_are_kept_and_the_best_besides(tmp_path):
    run = Run(tmp_path / "run", keep=2)
    run.save(1, None)  # no episode yet: no best
    assert not checkpoint.best_path(run.ckdir).exists()
    for updates, mean in [(2, 10.0), (3, 30.0), (4, 20.0), (5, 5.0)]:
        run.save(updates, mean)
    assert [p.name for p in checkpoint.list_checkpoints(run.ckdir)] == ["ckpt-000000000004.pt", "ckpt-000000000005.pt"]
    best = checkpoint.load(checkpoint.best_path(run.ckdir))  # its own ckpt-3 was pruned: best.pt stays whole
    assert best["counters"]["updates"] == 3 and best["mean_return"] == 30.0
    assert sorted(p.name for p in run.ckdir.iterdir()) == ["best.pt", "ckpt-000000000004.pt", "ckpt-000000000005.pt"]


def test_resume_continues_from_the_newest_not_the_best(tmp_path):
    run = Run(tmp_path / "run")
    run.save(1, 50.0)
    run.save(2, 10.0)
    found = find_resume(run.cfg, run.ckdir, lambda text: None)
    assert found.path.name == "ckpt-000000000002.pt" and found.state["counters"]["updates"] == 2
    assert best_updates(run.ckdir) == 1


def test_a_resumed_run_keeps_the_best_from_before_it_until_beaten(tmp_path):
    Run(tmp_path / "run").save(1, 50.0)
    resumed = Run(tmp_path / "run", resumed=True)
    resumed.save(2, 40.0)
    assert best_updates(resumed.ckdir) == 1
    resumed.save(3, 60.0)
    assert best_updates(resumed.ckdir) == 3


def test_a_fresh_run_moves_an_earlier_best_aside_with_the_rest(tmp_path):
    Run(tmp_path / "run").save(1, 500.0)
    fresh = Run(tmp_path / "run")
    fresh.save(1, 5.0)
    assert best_updates(fresh.ckdir) == 1 and checkpoint.load(checkpoint.best_path(fresh.ckdir))["mean_return"] == 5.0
    (aside,) = [d for d in (tmp_path / "run").iterdir() if d.name.startswith("checkpoints-")]
    assert checkpoint.load(checkpoint.best_path(aside))["mean_return"] == 500.0


def test_best_is_copied_where_the_filesystem_has_no_hard_links(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise OSError("hard links not supported")

    monkeypatch.setattr(os, "link", no_links)
    run = Run(tmp_path / "run")
    saved = run.save(1, 7.0)
    assert checkpoint.best_path(run.ckdir).read_bytes() == saved.read_bytes()
    assert not list(run.ckdir.glob(".ckpt-*.tmp"))


def test_find_picks_the_newest_or_with_best_the_best(tmp_path):
    run = Run(tmp_path / "run")
    run.save(1, 50.0)
    run.save(2, 10.0)
    assert checkpoint.find(tmp_path / "run")[0].name == "ckpt-000000000002.pt"
    path, state = checkpoint.find(tmp_path / "run", best=True)
    assert path.name == "best.pt" and state["counters"]["updates"] == 1
    assert checkpoint.find(run.ckdir, best=True)[0] == path  # (the checkpoints directory itself too)
    with pytest.raises(CheckpointError, match="is a file: --best picks the best checkpoint of a logdir"):
        checkpoint.find(path, best=True)


def test_best_without_a_best_checkpoint_says_when_one_is_written(tmp_path):
    Run(tmp_path / "run").save(1, None)
    with pytest.raises(CheckpointError, match=r"no best checkpoint \(best.pt\) in .*after an episode has ended"):
        checkpoint.find(tmp_path / "run", best=True)


def test_eval_best_plays_the_best_checkpoint_and_eval_a_logdir_the_newest(tmp_path):
    run = Run(tmp_path / "run")
    run.save(1, 50.0)
    run.save(2, 10.0)
    args = ["eval", "--checkpoint", str(tmp_path / "run"), "--episodes", "1", "--num-envs", "1"]
    newest = CliRunner().invoke(main, args)
    best = CliRunner().invoke(main, [*args, "--best"])
    assert newest.exit_code == 0 and best.exit_code == 0, newest.output + best.output
    assert newest.output.startswith(f"checkpoint {run.ckdir / 'ckpt-000000000002.pt'}\n")
    assert best.output.startswith(f"checkpoint {run.ckdir / 'best.pt'}\n")
