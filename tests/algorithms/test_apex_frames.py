"""Ape-X on stacked frames: each frame sent and stored once, stacks given back exactly."""
from __future__ import annotations

import numpy as np
import pytest

from zrl import algorithms, spaces, wire
from zrl.actors.sender import Sender
from zrl.algorithms.apex_dqn import algorithm as apex_dqn
from zrl.algorithms.apex_dqn import frames as frames_module
from zrl.algorithms.apex_dqn.frames import FrameReplay, FrameRing, is_frame_stack, split_frames
from zrl.envs import Step
from helpers import apex_config

FIELDS = {"action": ((), np.int64), "reward": ((), np.float32), "discount": ((), np.float32), "version": ((), np.int64)}


def rolling_stacks(rng, envs: int, steps: int, stack: int = 4, size: int = 6) -> np.ndarray:
    """[steps + 1, envs, stack, size, size]: each env's stacks shift by one new random frame a step."""
    frames = rng.integers(0, 255, (steps + stack, envs, size, size), dtype=np.uint8)
    return np.stack([frames[t:t + stack].swapaxes(0, 1) for t in range(steps + 1)])


def three_step_transitions(seed: int, envs: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(obs, next_obs) [N, 4, 6, 6] of every env's 3-step transitions, from rolling_stacks."""
    stacks = rolling_stacks(np.random.default_rng(seed), envs=envs, steps=steps)
    return stacks[:-3].reshape(-1, 4, 6, 6), stacks[3:].reshape(-1, 4, 6, 6)


def test_split_frames_keeps_each_distinct_frame_once_and_rebuilds_every_stack():
    obs, nxt = three_step_transitions(0, envs=3, steps=10)
    frames, obs_frames, next_frames = split_frames(obs, nxt)
    np.testing.assert_array_equal(frames[obs_frames], obs)
    np.testing.assert_array_equal(frames[next_frames], nxt)
    assert len(frames) == 3 * (10 + 4)  # every frame of every env once (10 steps of 4-frame stacks)
    assert len({f.tobytes() for f in frames}) == len(frames)
    ids = np.concatenate([obs_frames.ravel(), next_frames.ravel()])
    first_seen = np.unique(ids, return_index=True)[1]
    assert (np.diff(first_seen) > 0).all()  # in order of first appearance: the ring drops the oldest first


def test_the_ring_gives_back_the_frames_it_holds_and_knows_the_ones_it_lost():
    ring = FrameRing(5, (2, 2))
    first = ring.add(np.arange(12, dtype=np.uint8).reshape(3, 2, 2))
    assert first == 0
    assert ring.add(np.arange(100, 116, dtype=np.uint8).reshape(4, 2, 2)) == 3
    ids = np.arange(7)
    np.testing.assert_array_equal(ring.held(ids), [False, False, True, True, True, True, True])
    np.testing.assert_array_equal(ring.gather(np.array([2, 6]))[:, 0, 0], [8, 112])
    too_many = ring.add(np.arange(7 * 4, dtype=np.uint8).reshape(7, 2, 2))  # more than it holds: the newest stay
    assert too_many == 7 and ring.added == 14
    np.testing.assert_array_equal(ring.gather(np.arange(9, 14))[:, 0, 0], [8, 12, 16, 20, 24])
    smaller = FrameRing(3, (2, 2))
    smaller.load_state_dict(ring.state_dict())
    assert smaller.added == 14 and list(smaller.held(np.arange(10, 14))) == [False, True, True, True]
    np.testing.assert_array_equal(smaller.gather(np.arange(11, 14)), ring.gather(np.arange(11, 14)))
    with pytest.raises(ValueError, match="frame ring"):
        smaller.load_state_dict({"frames": np.zeros((2, 3, 3), np.uint8), "added": np.array(5)})


def add_transitions(replay: FrameReplay, obs, nxt, priorities=None):
    frames, obs_frames, next_frames = split_frames(obs, nxt)
    n = len(obs)
    rest = {"action": np.arange(n, dtype=np.int64), "reward": np.zeros(n, np.float32), "discount": np.ones(n, np.float32),
            "version": np.zeros(n, np.int64)}
    replay.add(frames, obs_frames, next_frames, rest, np.ones(n, np.float32) if priorities is None else priorities)
    return frames


def test_frame_replay_samples_the_stacks_that_were_added():
    obs, nxt = three_step_transitions(1, envs=4, steps=20)
    replay = FrameReplay(1000, (4, 6, 6), FIELDS, alpha=0.6, seed=0)
    add_transitions(replay, obs, nxt)
    keys, weights, batch = replay.sample(64, 0.4)
    assert len(keys) == 64 and replay.lost == 0
    np.testing.assert_array_equal(batch["obs"], obs[batch["action"]])  # action i was transition i
    np.testing.assert_array_equal(batch["next_obs"], nxt[batch["action"]])
    assert batch["obs"].dtype == np.uint8 and batch["obs"].shape == (64, 4, 6, 6)
    assert replay.ring.added < 2 * 4 * len(obs) // 4  # far fewer frames than the stacks hold
    replay._check_invariants()


def test_transitions_whose_frames_left_the_ring_are_dropped_from_their_batch_and_counted():
    # A sender whose every stack is new frames: the ring (1.5 frames per transition) loses the
    # oldest transitions' frames before the replay evicts them.
    rng = np.random.default_rng(2)
    replay = FrameReplay(10, (4, 3, 3), FIELDS, alpha=0.6, seed=0)
    obs = rng.integers(0, 255, (10, 4, 3, 3), dtype=np.uint8)
    nxt = rng.integers(0, 255, (10, 4, 3, 3), dtype=np.uint8)
    add_transitions(replay, obs, nxt, priorities=np.linspace(1, 2, 10).astype(np.float32))
    smallest = replay.replay._tree_min()
    keys, weights, batch = replay.sample(50, 1.0)
    held = np.flatnonzero(replay.ring.held(np.arange(replay.ring.added)))
    assert replay.lost > 0 and len(keys) == 50 - replay.lost
    for i, a in enumerate(batch["action"]):  # the ones kept are exactly what was added
        np.testing.assert_array_equal(batch["obs"][i], obs[a])
        np.testing.assert_array_equal(batch["next_obs"][i], nxt[a])
    assert len(held) == replay.ring.capacity
    assert replay.replay._tree_min() == pytest.approx(smallest, rel=1e-5)  # the weights' scale is unchanged
    replay._check_invariants()


def test_frame_replay_checkpoint_round_trips_and_moves_into_another_capacity():
    obs, nxt = three_step_transitions(3, envs=2, steps=30)
    replay = FrameReplay(40, (4, 6, 6), FIELDS, alpha=0.6, seed=0)
    add_transitions(replay, obs, nxt)
    state = {k: np.array(v) for k, v in replay.state_dict().items()}
    for capacity in (40, 20):  # (the smaller one's ring may not hold every frame of its newest 20)
        resumed = FrameReplay(capacity, (4, 6, 6), FIELDS, alpha=0.6, seed=0)
        apex_dqn._restore(state, resumed)
        assert len(resumed) == min(capacity, len(replay))
        keys, _, batch = resumed.sample(32, 0.4)
        assert len(keys) == 32 - resumed.lost and (resumed.lost == 0 or capacity < 40)
        np.testing.assert_array_equal(batch["obs"], obs[batch["action"]])
        np.testing.assert_array_equal(batch["next_obs"], nxt[batch["action"]])
    stacks_replay = apex_dqn.PrioritizedReplay(40, {"obs": ((4, 6, 6), np.uint8), "next_obs": ((4, 6, 6), np.uint8), **FIELDS}, alpha=0.6)
    with pytest.raises(ValueError, match="holds frames"):
        apex_dqn._restore(state, stacks_replay)
    with pytest.raises(ValueError, match="whole stacks"):
        apex_dqn._restore(stacks_replay.state_dict(), FrameReplay(40, (4, 6, 6), FIELDS, alpha=0.6, seed=0))


OBS = spaces.BoxSpec(shape=(4, 24, 24), dtype="uint8")
ACT = spaces.DiscreteSpec(n=3)


def test_only_stacks_of_8_bit_frames_are_sent_as_frames():
    assert is_frame_stack(OBS)
    assert not is_frame_stack(spaces.BoxSpec(shape=(1, 12, 12), dtype="uint8"))
    assert not is_frame_stack(spaces.BoxSpec(shape=(4, 24, 24), dtype="float32"))
    assert not is_frame_stack(spaces.BoxSpec(shape=(4, 12), dtype="uint8"))
    off = algorithms.get("apex_dqn")(apex_config("model.network=impala_shallow", "algo.frames_once=false"), OBS, ACT)
    assert not off.frames_once and "obs" in off.trajectory_schema(8).fields


def test_an_actor_message_carries_frames_once_and_the_learner_stores_what_the_actor_saw():
    cfg = apex_config("model.network=impala_shallow", "algo.n_step=3", "actor.unroll_length=12", "algo.min_replay_size=1")
    algo = algorithms.get("apex_dqn")(cfg, OBS, ACT)
    model = algo.build_model()
    K = 2
    rec = algo.make_recorder(model, num_envs=K, sender=Sender(0))
    stacks = rolling_stacks(np.random.default_rng(4), envs=K, steps=12, size=24)
    rec.begin(stacks[0])
    seen = {}  # action id -> the obs it was taken in
    for t in range(12):
        actions = np.array([2 * t, 2 * t + 1]) % 3
        rec.record(actions, {"q_sa": np.zeros(K, np.float32)})
        frames = rec.observe(Step(stacks[t + 1], np.ones(K, np.float32), np.zeros(K, bool), np.zeros(K, bool), {}))
    assert frames
    msg = wire.decode(bytes(frames[0]))
    bindings = algo.trajectory_schema(8).check(msg)
    a = msg.arrays
    assert "obs" not in a and len(a["frames"]) == K * (12 + 4)  # 10 transitions per env of 12 steps' stacks, each frame once
    algo.ingest(msg, bindings)
    _, _, batch = algo.replay.sample(len(a["action"]), 0.4)
    whole = {a_.tobytes() for a_ in stacks.reshape(-1, 4, 24, 24)}
    assert all(o.tobytes() in whole for o in batch["obs"]) and all(o.tobytes() in whole for o in batch["next_obs"])
    # The stacks decoded from the message are the stacks the recorder saw, 3 steps apart.
    for o, n_ in zip(a["frames"][a["obs_frames"]], a["frames"][a["next_frames"]]):
        t_env = [(t, k) for t in range(13) for k in range(K) if np.array_equal(stacks[t, k], o)]
        assert len(t_env) == 1
        t, k = t_env[0]
        np.testing.assert_array_equal(stacks[t + 3, k], n_)


def test_frame_indices_past_the_message_frames_are_refused():
    cfg = apex_config("model.network=impala_shallow")
    algo = algorithms.get("apex_dqn")(cfg, OBS, ACT)
    schema = algo.trajectory_schema(8)
    n = 3
    arrays = {"frames": np.zeros((5, 24, 24), np.uint8), "obs_frames": np.zeros((n, 4), np.int64),
              "next_frames": np.full((n, 4), 5, np.int64), "action": np.zeros(n, np.int64), "reward": np.zeros(n, np.float32),
              "discount": np.ones(n, np.float32), "priority": np.ones(n, np.float32)}
    msg = wire.decode(bytes(Sender(0).encode(wire.Kind.TRAJECTORY, arrays, 0)))
    bindings = schema.check(msg)
    with pytest.raises(wire.WireError, match="next_frames"):
        schema.check_values(msg, bindings)


def test_with_a_replay_ratio_an_actor_waits_for_the_updates_its_transitions_pay_for():
    cfg = apex_config("algo.updates_per_step=0.25", "algo.min_replay_size=40", "run.num_actors=2", "actor.unroll_length=5",
                      "algo.n_step=1")
    algo = algorithms.get("apex_dqn")(cfg, spaces.BoxSpec(shape=(2,), dtype="float32"), ACT)
    rec = algo.make_recorder(algo.build_model(), num_envs=4, sender=Sender(0))
    obs = np.zeros((4, 2), np.float32)
    rec.begin(obs)
    needs = []
    for t in range(20):  # 4 messages of 5 steps x 4 envs; this actor's share of min_replay_size is 20
        rec.record(np.zeros(4, np.int64), {"q_sa": np.zeros(4, np.float32)})
        if rec.observe(Step(obs, np.zeros(4, np.float32), np.zeros(4, bool), np.zeros(4, bool), {})):
            needs.append(rec.version_needed())
            rec.policy_version = {1: 3, 2: 30}.get(len(needs), rec.policy_version)  # weights arrive late, then early
    # 20 transitions x 0.25 updates each x 2 actors = 10 updates a message, after the free
    # share, counted from the version acting or the one last needed, whichever is newer.
    assert needs == [None, 3 + 10, 30 + 10, 30 + 10 + 10]


def test_split_frames_is_exact_when_two_distinct_frames_share_a_fingerprint(monkeypatch):
    rng = np.random.default_rng(5)
    obs, nxt = (rng.integers(0, 3, (50, 4, 3, 5), dtype=np.uint8) for _ in range(2))  # odd widths, many repeats
    for fingerprints in (frames_module._fingerprints, lambda rows: np.zeros(len(rows), np.uint64)):
        monkeypatch.setattr(frames_module, "_fingerprints", fingerprints)
        frames, obs_frames, next_frames = split_frames(obs, nxt)
        np.testing.assert_array_equal(frames[obs_frames], obs)
        np.testing.assert_array_equal(frames[next_frames], nxt)
        assert len({f.tobytes() for f in frames}) == len(frames) == len({f.tobytes() for f in np.concatenate([obs, nxt]).reshape(-1, 3, 5)})
