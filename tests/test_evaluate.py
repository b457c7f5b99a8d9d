"""`zrl eval`'s episode count: each env plays its share, so short episodes are not favoured."""
from __future__ import annotations

import types

import numpy as np
import pytest

from zrl import evaluate as ev
from zrl.envs import Step
from zrl.algorithms.base import Policy


class Lengths:
    """Env k's episodes last lengths[k] steps, each step rewarding 1: an episode's return is its length."""

    def __init__(self, lengths):
        self.lengths = np.array(lengths)
        self.num_envs = len(lengths)
        self.t = np.zeros(self.num_envs, int)

    def reset(self):
        return np.zeros((self.num_envs, 1), np.float32)

    def step(self, actions):
        self.t += 1
        done = self.t >= self.lengths
        self.t[done] = 0
        n = self.num_envs
        return Step(np.zeros((n, 1), np.float32), np.ones(n, np.float32), done, np.zeros(n, bool), {})

    def close(self):
        pass


class Zeros(Policy):
    def act(self, obs, state=None):
        return np.zeros(len(obs), np.int64), {}


@pytest.mark.parametrize("episodes,want", [(4, [1, 1, 10, 10]), (3, [1, 1, 10]), (1, [1])])
def test_each_env_plays_its_share_of_the_episodes(monkeypatch, episodes, want):
    # Env 0's episodes last 1 step, env 1's 10: taking the first 4 to finish would give
    # [1, 1, 1, 1] (mean 1); each env's share gives the two kinds alike.
    monkeypatch.setattr(ev, "make_vector_env", lambda cfg, n, seed: Lengths([1, 10][:n]))
    algo = types.SimpleNamespace(make_eval_policy=lambda model, greedy: Zeros())
    result = ev.evaluate(None, algo, None, episodes, num_envs=2)
    assert result["episodes"] == episodes
    assert result["mean_return"] == pytest.approx(np.mean(want))
    assert (result["min_return"], result["max_return"]) == (min(want), max(want))
