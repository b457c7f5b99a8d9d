"""Several learners as one (zrl.learner.group): two learners, each updating on half of a
batch and averaging their gradients, end with the weights of one learner updating on the
whole batch."""
from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from zrl import spaces
from zrl.algorithms.impala.algorithm import Impala
from zrl.config import ConfigError, load_config
from zrl.learner.group import LearnerGroup
from helpers import Proc, small_config, wait_for

T, B, STEPS = 5, 8, 3
OBS, ACT = spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2)


def batch(columns: slice) -> dict[str, torch.Tensor]:
    """The same [T, B] batch in every process (a fixed seed), cut to `columns`."""
    rng = np.random.default_rng(0)
    full = {
        "obs": rng.normal(size=(T + 1, B, 4)).astype(np.float32),
        "action": rng.integers(0, 2, size=(T, B)),
        "reward": rng.normal(size=(T, B)).astype(np.float32),
        "terminated": rng.random((T, B)) < 0.1,
        "truncated": np.zeros((T, B), bool),
        "behaviour_logp": np.log(rng.uniform(0.2, 0.8, size=(T, B))).astype(np.float32),
    }
    out = {k: torch.from_numpy(np.ascontiguousarray(v[:, columns])) for k, v in full.items()}
    out["final_index"] = torch.zeros(0, dtype=torch.int64)
    out["final_obs"] = torch.zeros((0, 4))
    return out


def train(rank: int, world: int, init: str, out: str) -> None:
    # Losses are means over the batch: the mean of two halves' gradients is the whole's (with
    # advantages normalised over each half it would not be).
    cfg = small_config("algo.normalize_advantages=false", f"learner.batch_size={B // world}", f"actor.unroll_length={T}")
    torch.manual_seed(1)
    algo = Impala(cfg, OBS, ACT)
    algo.setup(torch.device("cpu"))
    group = LearnerGroup(rank, world, init, timeout_s=60) if world > 1 else None
    try:
        if group is not None:
            algo.gradient_reduce = group.average_gradients
        share = B // world
        mine = batch(slice(rank * share, (rank + 1) * share))
        for _ in range(STEPS):
            algo.update(mine, env_steps=0)
        torch.save(algo.flat.detach().clone(), f"{out}.{rank}")
    finally:
        if group is not None:
            group.close()


@pytest.mark.timeout(120)
def test_two_learners_on_halves_end_with_the_weights_of_one_on_the_whole_batch(tmp_path):
    one = str(tmp_path / "one")
    train(0, 1, "", one)
    two = str(tmp_path / "two")
    mp.spawn(train, args=(2, f"file://{tmp_path}/rendezvous", two), nprocs=2, join=True)
    w1, w2a, w2b = torch.load(f"{one}.0"), torch.load(f"{two}.0"), torch.load(f"{two}.1")
    assert torch.equal(w2a, w2b)  # every member took the same step
    start = Impala(small_config(), OBS, ACT)
    torch.manual_seed(1)
    start.setup(torch.device("cpu"))
    assert not torch.allclose(w1, start.flat)  # (the updates did move the weights)
    torch.testing.assert_close(w2a, w1, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- zrl run with a group


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_zrl_run_with_two_learners_learns_cartpole(tmp_path):
    # A mean return of 200 (random play: ~20), not 475: two learners reached 475 in 22 to 75 s
    # here, but once not within 150 s (their returns swing more than one learner's; issue 44).
    run = Proc(["run", "--config", "configs/cartpole_impala.yaml", "-o", "learner.num_learners=2", "--seed", "1",
                "--logdir", str(tmp_path), "--max-seconds", "150", "--stop-at-return", "200"])
    assert run.wait(200) == 0, run.output[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["reached"] is True and summary["final_mean_return"] >= 200, summary
    # Both learners trained: the summary counts both learners' env steps, and the second said it stopped with the first.
    assert "[learner 1] done (another learner of the group stopped)" in run.output
    assert summary["env_steps"] > summary["updates"] * 32  # (one learner's share is 32 columns of 20 steps per update)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_learner_killed_stops_its_group_and_the_run_resumes_with_one_learner(tmp_path):
    run = Proc(["run", "--config", "configs/cartpole_impala.yaml", "-o", "learner.num_learners=2", "-o", "learner.group_timeout_s=10",
                "-o", "learner.checkpoint_interval_s=1", "--seed", "1", "--logdir", str(tmp_path), "--max-seconds", "150",
                "--stop-at-return", "1000"])
    try:
        wait_for(lambda: list((tmp_path / "checkpoints").glob("ckpt-*.pt")), 90, "a checkpoint")
        follower = json.loads((tmp_path / "pids.json").read_text())["learner 1"]
        os.kill(follower, signal.SIGKILL)
        t_kill = time.monotonic()
        code = run.wait(90)
        assert time.monotonic() - t_kill < 60, "the group should stop within its timeout"
        assert code != 0 and not json.loads((tmp_path / "summary.json").read_text())["reached"], run.output[-3000:]
    finally:
        run.kill_tree()
    resumed = Proc(["run", "--resume", "--logdir", str(tmp_path), "-o", "learner.num_learners=1", "--max-seconds", "8",
                    "--stop-at-return", "1000"])
    assert resumed.wait(90) == 0, resumed.output[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_steps"] > summary["env_steps_this_run"] > 0, summary  # it went on from the group's checkpoint


@pytest.mark.timeout(30)
@pytest.mark.parametrize("config,overrides,message", [
    ("pendulum_sac", [], "several learners train IMPALA and APPO only"),
    ("cartpole_ppo", [], "several learners train IMPALA and APPO only"),
    ("cartpole_impala", ["model.normalize_obs=true"], "model.normalize_obs"),
    ("cartpole_impala", ["learner.batch_size=63"], "multiple of learner.num_learners"),
])
def test_a_group_the_algorithm_cannot_take_is_a_config_error(config, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(config, ["learner.num_learners=2", *overrides])
