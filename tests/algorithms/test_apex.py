"""Ape-X DQN: actor-side n-step transitions and priorities, epsilons, learner integration."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import zmq

from zrl import checkpoint, spaces, wire
from zrl.envs import Step
from zrl import algorithms
from zrl.algorithms.apex_dqn import algorithm as apex_dqn
from zrl.algorithms.apex_dqn.algorithm import actor_epsilon
from zrl.actors.actor import hello_meta, say_hello
from zrl.actors.sender import Sender
from zrl.learner.report import Report
from zrl.replay import PrioritizedReplay
from helpers import Running, apex_config, wait_for

OBS = spaces.BoxSpec(shape=(2,), dtype="float32")
ACT = spaces.DiscreteSpec(n=3)


def reference_transitions(episodes, n, gamma):
    """Per-env lists of (obs, action, reward, end) -> the n-step transitions, written plainly.

    Each episode is a list of steps (obs_t, a_t, r_t) plus how it ended
    ("terminated", "truncated", or None if still running) and the next/final obs.
    """
    out = []
    for steps, end, last_obs in episodes:
        T = len(steps)
        for t in range(T):
            if t + n <= T - 1 or (t + n <= T and end is None):
                # a full window inside the episode, bootstrapped from obs_{t+n}
                if t + n < T:
                    nxt = steps[t + n][0]
                else:
                    nxt = last_obs
                R = sum(gamma**i * steps[t + i][2] for i in range(n))
                out.append((tuple(steps[t][0]), steps[t][1], R, gamma**n, tuple(nxt)))
            elif end is not None:
                m = T - t
                R = sum(gamma**i * steps[t + i][2] for i in range(m))
                disc = 0.0 if end == "terminated" else gamma**m
                out.append((tuple(steps[t][0]), steps[t][1], R, disc, tuple(last_obs) if end == "truncated" else None))
    return out


def test_recorder_builds_n_step_transitions_like_the_reference():
    cfg = apex_config("algo.n_step=3", "algo.discount=0.9", "actor.unroll_length=100")
    algo = algorithms.get("apex_dqn")(cfg, OBS, ACT)
    model = algo.build_model()
    K = 2
    rec = algo.make_recorder(model, num_envs=K, sender=Sender(0))
    rng = np.random.default_rng(0)
    # env 0: terminates after 5 steps then runs 4 more; env 1: truncated after 2 steps, then runs 7 more.
    ends = {0: {4: "terminated"}, 1: {1: "truncated"}}
    obs = rng.normal(size=(K, 2)).astype(np.float32)
    rec.begin(obs)
    histories = {0: [[]], 1: [[]]}
    episodes = {0: [], 1: []}
    for t in range(9):
        actions = rng.integers(0, 3, K)
        rec.record(actions, {"q_sa": np.zeros(K, np.float32)})
        reward = rng.normal(size=K).astype(np.float32)
        nxt = rng.normal(size=(K, 2)).astype(np.float32)
        term = np.array([ends[k].get(t) == "terminated" for k in range(K)])
        trunc = np.array([ends[k].get(t) == "truncated" for k in range(K)])
        final = {}
        for k in range(K):
            histories[k][-1].append((obs[k].copy(), int(actions[k]), float(reward[k])))
            if term[k] or trunc[k]:
                final_obs = rng.normal(size=2).astype(np.float32)
                if trunc[k]:
                    final[k] = final_obs
                episodes[k].append((histories[k][-1], "terminated" if term[k] else "truncated", final_obs))
                histories[k].append([])
        rec.observe(Step(nxt, reward, term, trunc, final))
        obs = nxt
    for k in range(K):
        episodes[k].append((histories[k][-1], None, obs[k]))
    frames = rec._message()
    msg = wire.decode(bytes(frames[0]))
    algo.trajectory_schema(8).check(msg)
    a = msg.arrays
    got = sorted(
        (tuple(np.round(a["obs"][i], 6)), int(a["action"][i]), round(float(a["reward"][i]), 5), round(float(a["discount"][i]), 6),
         tuple(np.round(a["next_obs"][i], 6)) if a["discount"][i] > 0 else None)
        for i in range(len(a["action"]))
    )
    want = sorted(
        (tuple(np.round(np.array(o, np.float32), 6)), act, round(R, 5), round(d, 6), tuple(np.round(np.array(nx, np.float32), 6)) if d > 0 else None)
        for k in range(K)
        for (o, act, R, d, nx) in reference_transitions(episodes[k], 3, 0.9)
    )
    assert got == want
    assert np.all(a["priority"] > 0)


@pytest.mark.parametrize("scale", [1.0, 0.1])
def test_initial_priority_is_the_actors_td_error(scale):
    cfg = apex_config("algo.n_step=1", "algo.discount=0.5", f"algo.reward_scale={scale}")
    algo = algorithms.get("apex_dqn")(cfg, OBS, ACT)
    model = algo.build_model()
    rec = algo.make_recorder(model, num_envs=1, sender=Sender(0))
    obs0 = np.array([[0.1, 0.2]], np.float32)
    obs1 = np.array([[0.3, -0.1]], np.float32)
    with torch.no_grad():
        q0 = model(torch.from_numpy(obs0))[0]
        q1 = model(torch.from_numpy(obs1))[0]
    rec.begin(obs0)
    rec.record(np.array([2]), {"q_sa": q0[2:3].numpy()})
    rec.observe(Step(obs1, np.array([1.0], np.float32), np.array([False]), np.array([False]), {}))
    msg = wire.decode(bytes(rec._message()[0]))
    want = abs(scale * 1.0 + 0.5 * q1.max().item() - q0[2].item()) + cfg.algo.priority_eps
    # The actor computes in float32 and the terms can nearly cancel (0.1 + 0.5 q' - q can be ~1e-4),
    # so the tolerance is float32's rounding of the terms, not a share of their small difference.
    terms = scale + 0.5 * abs(q1.max().item()) + abs(q0[2].item())
    assert msg.arrays["priority"][0] == pytest.approx(want, rel=1e-5, abs=4 * terms * float(np.finfo(np.float32).eps))
    assert msg.arrays["reward"][0] == 1.0  # the wire carries the reward as the env gave it


def test_learner_td_target_scales_the_reward():
    cfg = apex_config("algo.reward_scale=0.1", "learner.precision=fp32")
    algo = algorithms.get("apex_dqn")(cfg, OBS, ACT)
    model = algo.build_model()
    g = torch.Generator().manual_seed(0)
    N = 5
    batch = {
        "obs": torch.randn(N, 2, generator=g),
        "action": torch.randint(0, 3, (N,), generator=g),
        "reward": torch.tensor([10.0, -5.0, 0.0, 1.0, 100.0]),
        "discount": torch.tensor([0.9, 0.0, 0.9, 0.5, 0.9]),
        "next_obs": torch.randn(N, 2, generator=g),
        "weights": torch.ones(N),
    }
    algo.loss(model, batch)  # the target net starts as a copy of the online net
    with torch.no_grad():
        q = model(batch["obs"]).gather(1, batch["action"][:, None])[:, 0]
        q_next = model(batch["next_obs"]).max(1).values  # double Q with equal nets: the max
    torch.testing.assert_close(algo._td, 0.1 * batch["reward"] + batch["discount"] * q_next - q)


def test_actor_epsilons_follow_the_paper():
    hp = apex_config().algo
    assert actor_epsilon(hp, 0, 1) == pytest.approx(0.4)
    assert actor_epsilon(hp, 0, 8) == pytest.approx(0.4)
    assert actor_epsilon(hp, 7, 8) == pytest.approx(0.4**8)
    assert actor_epsilon(hp, 3, 8) == pytest.approx(0.4 ** (1 + 7 * 3 / 7))


def test_learner_fills_replay_trains_and_updates_priorities(make_learner, make_actor):
    # 3 envs: a chunk's width need not divide learner.batch_size (64) for a replay learner,
    # which samples algo.batch_size; the hello used to be refused over it.
    cfg = apex_config("algo.target_update_interval=5", "actor.num_envs=3")
    assert cfg.learner.batch_size % cfg.actor.num_envs
    learner, _ = make_learner(cfg)
    make_actor(cfg)
    wait_for(lambda: learner.updates >= 20, 60, "Ape-X updates")
    algo = learner.algo
    assert len(algo.replay) >= cfg.algo.min_replay_size
    assert algo.replay.max_priority != 1.0  # priorities came from actors and updates
    # the target net was synced: equal to the online net right after a sync is not guaranteed,
    # but it must exist and have the same shapes
    assert algo.target is not None
    for p, q in zip(learner.model.parameters(), algo.target.parameters()):
        assert p.shape == q.shape and not q.requires_grad
    algo.replay._check_invariants()


def test_replay_is_checkpointed_when_asked(tmp_path, endpoint, make_learner, make_actor):
    cfg = apex_config("algo.replay_checkpoint=true")
    learner, runner = make_learner(cfg, logdir=tmp_path / "run")
    actor, _ = make_actor(cfg)
    wait_for(lambda: learner.updates >= 5, 60, "updates")
    learner.request_stop()
    runner.join(30)
    actor.stop.set()
    size = len(learner.algo.replay)
    learner.close()
    resumed, _ = make_learner(cfg, logdir=tmp_path / "run", resume=True, bind=endpoint + "-2", start=False)
    # A resumed run that stops before its first update (a step limit already reached,
    # Ctrl-C while refilling) saves over the same checkpoint: the target net and replay it
    # loaded must still be in it.
    path = resumed.save_checkpoint(1.0)
    assert path == checkpoint.path_for(tmp_path / "run" / "checkpoints", learner.updates)
    saved = checkpoint.load(path)["algo"]
    assert set(saved) >= {"target", "replay", "updates"}
    assert int(saved["replay"]["size"]) == size
    resumed.algo._ensure_replay()
    assert len(resumed.algo.replay) == size
    assert resumed.updates == learner.updates


def test_a_bf16_apex_actor_scores_priorities_in_float32(make_learner, make_actor):
    cfg = apex_config("algo.n_step=1", "actor.precision=bf16")
    algo = algorithms.get("apex_dqn")(cfg, OBS, ACT)
    acting = algo.build_model().to(torch.bfloat16)  # what a bf16 actor acts with
    policy = algo.make_policy(acting, actor_index=0, num_actors=1, seed=0)
    rec = algo.make_recorder(acting, num_envs=1, sender=Sender(0))
    obs0 = np.array([[0.1, 0.2]], np.float32)
    actions, extras = policy.act(obs0)
    assert extras["q_sa"].dtype == np.float32
    rec.begin(obs0)
    rec.record(actions, extras)
    rec.observe(Step(np.array([[0.3, -0.1]], np.float32), np.array([1.0], np.float32), np.array([False]), np.array([False]), {}))
    priority = wire.decode(bytes(rec._message()[0])).arrays["priority"]
    assert priority.dtype == np.float32 and np.isfinite(priority).all() and priority[0] > 0
    # And end to end: the learner trains on a bf16 actor's transitions.
    learner, _ = make_learner(cfg)
    make_actor(cfg)
    wait_for(lambda: learner.updates >= 5, 60, "Ape-X updates from a bf16 actor")
    assert not learner.rejected


@pytest.mark.parametrize("capacity,alpha", [(20, 0.6), (5, 0.6), (8, 0.9), (5, 0.4)])
def test_a_resumed_replay_of_another_capacity_or_alpha_keeps_its_newest_items(capacity, alpha):
    # A checkpoint's replay of capacity 8 that has wrapped (12 items added: 4..11 are kept);
    # resuming with another algo.replay_capacity or priority_alpha used to crash the learner.
    old = PrioritizedReplay(8, {"x": ((2,), np.float32)}, alpha=0.6, seed=0)
    raw = np.arange(1, 13, dtype=np.float64)  # item i's raw priority: i + 1
    old.add({"x": np.repeat(np.arange(12, dtype=np.float32)[:, None], 2, axis=1)}, raw)
    saved = {k: np.array(v) for k, v in old.state_dict().items()}
    new = PrioritizedReplay(capacity, {"x": ((2,), np.float32)}, alpha=alpha, seed=0)
    apex_dqn._migrate(saved, new)
    kept = np.arange(max(4, 12 - capacity), 12)  # the newest, oldest first
    assert len(new) == len(kept)
    items = np.array(new.state_dict()["field/x"])[: len(kept), 0].astype(int)  # in slot order
    np.testing.assert_array_equal(np.sort(items), kept)
    np.testing.assert_allclose(new._scaled_priorities() ** (1 / alpha), raw[items], rtol=1e-5)  # each its own
    new._check_invariants()


def test_a_resumed_replay_saved_with_alpha_0_gives_its_items_the_largest_priority():
    # Alpha 0 keeps no priorities (every scaled one is 1): migrating used to divide by 0.
    old = PrioritizedReplay(8, {"x": ((2,), np.float32)}, alpha=0.0, seed=0)
    old.add({"x": np.zeros((5, 2), np.float32)}, np.linspace(1, 50, 5))
    new = PrioritizedReplay(8, {"x": ((2,), np.float32)}, alpha=0.6, seed=0)
    apex_dqn._migrate({k: np.array(v) for k, v in old.state_dict().items()}, new)
    assert len(new) == 5
    np.testing.assert_allclose(new._scaled_priorities(), 1.0)  # the new buffer's largest seen: its first default
    new._check_invariants()


def test_a_target_that_overflows_gives_the_largest_finite_priority_and_training_goes_on(ctx, make_learner):
    # Finite inputs whose TD target overflows to inf: update_priorities used to raise and stop the learner.
    cfg = apex_config("algo.min_replay_size=32", "algo.batch_size=32", "server.observation_space={type: box, shape: [2], dtype: float32}",
                      "server.action_space={type: discrete, n: 3}")  # (the learner's specs: OBS and ACT)
    learner, runner = make_learner(cfg)
    reply = say_hello(ctx, learner.control_endpoint, hello_meta(cfg, "actor", 0, OBS, ACT, cfg.actor.num_envs), timeout_s=60)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(learner.trajectory_endpoint)
    N = 64
    chunk = {"obs": np.zeros((N, *OBS.shape), np.float32), "action": np.zeros(N, np.int64),
             "reward": np.full(N, np.finfo(np.float32).max, np.float32), "discount": np.ones(N, np.float32),
             "next_obs": np.full((N, *OBS.shape), 1e38, np.float32), "priority": np.ones(N, np.float32)}
    push.send(wire.encode(wire.Kind.TRAJECTORY, chunk, sender_id=reply.sender_id))
    wait_for(lambda: learner.updates >= 3, 60, "updates on the overflowing transitions")
    push.close()
    assert runner.thread.is_alive() and sum(learner.rejected.values()) == 0
    assert np.isfinite(learner.algo.replay.max_priority)
    assert all(np.isfinite(p.detach().cpu().numpy()).all() for p in learner.model.parameters())


def test_a_warming_learner_keeps_actors_from_asking_again_and_says_what_it_waits_for(make_learner, make_actor):
    # During Ape-X's warm-up no update publishes weights: the learner publishes its latest
    # again, so an actor's watchdog (actor.learner_timeout_s) does not send a hello each time.
    cfg = apex_config("algo.min_replay_size=100000", "algo.replay_capacity=100000", "actor.learner_timeout_s=1",
                      "learner.actor_timeout_s=120")  # (the links' keep-alive hello, every 60 s, stays out of the test)
    learner, _ = make_learner(cfg, start=False)
    hellos, beats = [], []
    handshake, publisher = learner.receiver.handshake, learner.publisher
    on_hello, send_weights = handshake.answer, publisher.send
    handshake.answer = lambda msg, identity: hellos.append(msg) or on_hello(msg, identity)
    publisher.send = lambda frame: beats.append(frame) or send_weights(frame)
    runner = Running(learner.run, "learner")
    try:
        make_actor(cfg)
        wait_for(lambda: learner.env_steps > 0, 60, "data from the actor")
        connected = len(hellos)  # (more than one if the first timed out while the learner built its model)
        beats.clear()
        wait_for(lambda: len(beats) >= 8, 30, "heartbeats")  # 4 s of them: 3 watchdog hellos before
        assert learner.updates == 0 and len(hellos) == connected
        assert {wire.decode(b).policy_version for b in beats} == {0}
        lines = []
        Report(learner.progress, SimpleNamespace(line=lines.append, scalars=lambda values, step: None, progress=lambda record: None), learner.source.fill).waiting(1.0, learner.algo.waiting_for())
        n = len(learner.algo.replay)
        assert 0 < n < 100_000 and "waiting for replay" in lines[0] and "/100,000 transitions (algo.min_replay_size)" in lines[0]
        assert "actors 1" in lines[0]
    finally:
        learner.request_stop()
        runner.join(30)
