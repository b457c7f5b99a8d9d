"""Several learners as one (zrl.learner.group): two learners, each updating on half of a
batch and averaging their gradients, end with the weights of one learner updating on the
whole batch."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from zrl import spaces
from zrl.algorithms.impala.algorithm import Impala
from zrl.learner.group import LearnerGroup
from helpers import small_config

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
