"""PPO: the "version" batch source (only the current version's chunks, dead actors dropped
from the wait), actors that wait for each new version, GAE, and learning CartPole."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from helpers import ROOT, good_trajectory, run_to_return, wait_for
from zrl import algorithms, spaces, wire
from zrl.config import ConfigError, load_config
from zrl.learner.progress import Progress
from zrl.algorithms.ppo.algorithm import gae
from zrl.learner.version_batches import VersionBatches

PPO_CONFIG = ROOT / "configs" / "cartpole_ppo.yaml"
OBS, ACT = spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2)


def ppo_config(*overrides: str):
    base = ["actor.num_envs=4", "actor.unroll_length=8", "learner.queue_size=8", "learner.log_interval_s=0.2", "actor.learner_timeout_s=2",
            "actor.stats_interval_s=0.05", "run.max_seconds=null", "run.stop_at_return=null"]
    return load_config(PPO_CONFIG, [*base, *overrides])


def chunk_message(cfg, version: int, sender: int):
    arrays = good_trajectory(cfg)
    msg = wire.decode(wire.encode(wire.Kind.TRAJECTORY, arrays, policy_version=version, sender_id=sender))
    return msg


class Source:
    """A VersionBatches over a real PPO algorithm, fed by hand."""

    def __init__(self, cfg):
        self.algo = algorithms.get("ppo")(cfg, OBS, ACT)
        self.algo.setup(torch.device("cpu"))
        self.progress = Progress(cfg, None)
        self.batches = VersionBatches(self.algo, torch.device("cpu"), self.progress, cfg, threading.Event())
        self.schema = self.algo.trajectory_schema(64)
        self.cfg = cfg

    def put(self, version: int, sender: int) -> None:
        msg = chunk_message(self.cfg, version, sender)
        self.batches.queue.put((msg, self.schema.check(msg)))

    def next(self, limit_s: float = 5.0):
        stop = threading.Event()
        timer = threading.Timer(limit_s, stop.set)
        timer.start()
        try:
            return self.batches.next(stop.is_set, lambda: None)
        finally:
            timer.cancel()


@pytest.mark.timeout(30)
def test_a_rollout_holds_only_chunks_of_the_current_version():
    src = Source(ppo_config("algo.rollout_chunks=2"))
    src.progress.updates = 3  # version 3 is the one actors act with
    src.put(2, sender=0)  # acted before the last publish: stale
    src.put(3, sender=0)
    src.put(1, sender=1)
    src.put(3, sender=1)
    batch, versions = src.next()
    assert versions == [3, 3]
    assert batch["obs"].shape[1] == 2 * src.cfg.actor.num_envs
    assert src.progress.discarded["stale_version"] == 2


@pytest.mark.timeout(30)
def test_a_chunk_claiming_an_unpublished_version_is_rejected():
    src = Source(ppo_config("algo.rollout_chunks=1"))
    src.put(7, sender=0)
    src.put(0, sender=1)
    batch, versions = src.next()
    assert versions == [0]
    assert src.progress.rejected["future_version"] == 1


@pytest.mark.timeout(30)
def test_a_silent_sender_is_dropped_from_the_wait_and_rejoins_when_heard_from():
    src = Source(ppo_config("algo.rollout_chunks=2", "algo.rollout_timeout_s=0.3"))
    src.put(0, sender=0)
    _, versions = src.next()  # sender 1 never sends: the rollout is sender 0's, after the timeout
    assert versions == [0]
    src.progress.updates = 1
    src.put(1, sender=0)
    _, versions = src.next(limit_s=0.2)  # no longer waited for: no timeout to sit out
    assert versions == [1]
    src.progress.updates = 2
    src.put(2, sender=1)  # back: waited for again
    src.put(2, sender=0)
    _, versions = src.next()
    assert sorted(versions) == [2, 2]


def test_gae_matches_its_recursion():
    rng = np.random.default_rng(0)
    T, B, gamma, lam = 6, 3, 0.9, 0.8
    rewards = torch.tensor(rng.normal(size=(T, B)), dtype=torch.float32)
    discounts = torch.full((T, B), gamma)
    discounts[2, 1] = 0.0  # an episode ends there
    values = torch.tensor(rng.normal(size=(T + 1, B)), dtype=torch.float32)
    adv = gae(rewards, discounts, values, lam)
    want = np.zeros((T, B))
    nxt = np.zeros(B)
    for t in reversed(range(T)):
        delta = rewards[t].numpy() + discounts[t].numpy() * values[t + 1].numpy() - values[t].numpy()
        nxt = delta + discounts[t].numpy() * lam * nxt
        want[t] = nxt
    np.testing.assert_allclose(adv.numpy(), want, rtol=1e-5, atol=1e-5)


def test_ppo_configs_that_cannot_be_synchronous_are_refused():
    with pytest.raises(ConfigError, match="learner.publish_interval"):
        ppo_config("learner.publish_interval=2")
    with pytest.raises(ConfigError, match="actor.env_groups"):
        ppo_config("actor.env_groups=2")


@pytest.mark.timeout(120)
def test_actors_wait_for_each_version_and_a_dead_actor_does_not_stall_training(make_learner, make_actor):
    cfg = ppo_config("algo.rollout_chunks=2", "algo.rollout_timeout_s=0.5", "run.num_actors=2")
    learner, _ = make_learner(cfg)
    actors = [make_actor(cfg, index=i, num_actors=2, max_steps=10**9) for i in range(2)]
    wait_for(lambda: learner.updates >= 5, 60, "updates on both actors' rollouts")
    dead, runner = actors[1]
    dead.stop.set()
    runner.join(30)
    at_death = learner.updates
    wait_for(lambda: learner.updates >= at_death + 10, 60, "updates after an actor died")
    assert learner.progress.run_lag.max == 0  # every chunk trained on was acted by the version trained
    assert not learner.rejected
    # The living actor acted with each new version: it waited rather than act with a stale one.
    assert actors[0][0].policy_version >= at_death + 9


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ppo_learns_cartpole(tmp_path):
    run_to_return(PPO_CONFIG, 200, tmp_path / "run")


def test_the_agent_server_refuses_a_synchronous_learner():
    from zrl.server.server import AgentServer

    with pytest.raises(ConfigError, match="algo.name: ppo"):
        AgentServer(ppo_config(), "inproc://zrl-test-serve-ppo", learner="inproc://zrl-test-learner-ppo")
