"""actor.env_batching first_ready: the policy acts on whichever envs finished first, and
`ReadyStreams` hands each fixed group's recorder the steps a fixed group would have given it."""
from __future__ import annotations


import numpy as np
import pytest

from zrl.actors.streams import ReadyStreams
from zrl.envs import Step
from zrl.algorithms.base import Policy, Recorder
from helpers import ROOT

pytestmark = pytest.mark.timeout(60)

PONG_CONFIG = ROOT / "configs" / "pong_impala.yaml"


class FakeReadyEnv:
    """N envs served like ale_py's asynchronous mode: each recv returns B envs picked at random
    among those that have a step (or their first observation) ready, and send gives actions
    to the envs of the last recv. Env k's observation is [k, t, episode]; its episodes last
    3 + k % 4 steps, ending terminated, or truncated (with its final observation) when odd."""

    def __init__(self, n: int, b: int, seed: int = 0):
        self.n, self.b = n, b
        self.rng = np.random.default_rng(seed)
        self.t = np.zeros(n, np.int64)
        self.episode = np.zeros(n, np.int64)
        self.ready = list(range(n))  # envs with something to return
        self.last: np.ndarray | None = None
        self.log = {k: [] for k in range(n)}  # env k: (action, reward, terminated, truncated, obs after) per step
        self.pending: dict[int, bool] = {}  # env -> whether its ready result is a step (not its first obs)

    def _obs(self, k: int) -> np.ndarray:
        return np.array([k, self.t[k], self.episode[k]], np.int64)

    def _take(self) -> np.ndarray:
        picks = self.rng.choice(len(self.ready), self.b, replace=False)
        ids = np.array([self.ready[i] for i in picks], np.int32)
        self.ready = [k for i, k in enumerate(self.ready) if i not in set(picks.tolist())]
        self.last = ids
        return ids

    def reset_batch(self):
        ids = self._take()
        return ids, np.stack([self._obs(k) for k in ids])

    def step_async(self, actions: np.ndarray) -> None:
        for k, a in zip(self.last.tolist(), actions.tolist()):
            self.t[k] += 1
            length = 3 + k % 4
            ended = self.t[k] == length
            truncated = bool(ended and self.episode[k] % 2 == 1)
            terminated = bool(ended and not truncated)
            final = self._obs(k) if truncated else None
            reward = float(10 * k + self.t[k])
            if ended:
                self.t[k] = 0
                self.episode[k] += 1
            self.log[k].append((a, reward, terminated, truncated, self._obs(k), final))
            self.pending[k] = True
            self.ready.append(k)

    def step_wait(self) -> Step:
        ids = self._take()
        rows = []
        for k in ids.tolist():
            if self.pending.pop(k, False):
                a, r, te, tr, o, f = self.log[k][-1]
                rows.append((r, te, tr, o, f))
            else:  # its first observation
                rows.append((0.0, False, False, self._obs(k), None))
        final = {i: row[4] for i, row in enumerate(rows) if row[4] is not None}
        return Step(np.stack([row[3] for row in rows]), np.array([row[0] for row in rows], np.float32),
                    np.array([row[1] for row in rows]), np.array([row[2] for row in rows]), final, env_ids=ids)


class CountingPolicy(Policy):
    """Action (7 * env + t) % 6 read off the observation; a recurrent state that counts the
    steps acted on since the episode began (reset_rows zeroes it), recorded as core_h."""

    def initial_state(self, n: int):
        return (np.zeros((n, 1), np.float32),)

    def act(self, obs, state=None):
        actions = (7 * obs[:, 0] + obs[:, 1]) % 6
        (h,) = state
        return actions, {"behaviour_logp": -obs[:, 1].astype(np.float32), "core_h": h.copy(), "state": (h + 1,)}


class Calls(Recorder):
    def __init__(self):
        self.calls = []

    def begin(self, obs):
        self.calls.append(("begin", obs.copy()))

    def record(self, actions, extras):
        self.calls.append(("record", actions.copy(), {k: v.copy() for k, v in extras.items()}))

    def observe(self, step):
        self.calls.append(("observe", step))
        return [("frame", len(self.calls))]


def test_ready_batches_reach_each_groups_recorder_as_a_fixed_groups_steps():
    W, G = 3, 4
    env = FakeReadyEnv(W * G, W)
    recorders = [Calls() for _ in range(G)]
    streams = ReadyStreams(CountingPolicy(), recorders, W)
    ids, obs = env.reset_batch()
    streams.begin(ids, obs)
    env.step_async(streams.act(ids, obs))
    frames = []
    firsts = len(ids)
    for _ in range(400):
        step = env.step_wait()
        got, stepped = streams.observe(step)
        frames += got
        # A row is a step exactly when the env was given an action before.
        firsts += int((~stepped).sum())
        env.step_async(streams.act(step.env_ids, step.obs))
    assert firsts == W * G  # every env's first observation came once

    for g, rec in enumerate(recorders):
        envs = list(range(g * W, (g + 1) * W))
        kinds = [c[0] for c in rec.calls]
        assert kinds[0] == "begin" and kinds[1:] == ["record", "observe"] * ((len(kinds) - 1) // 2)
        np.testing.assert_array_equal(rec.calls[0][1], [[k, 0, 0] for k in envs])
        steps = (len(kinds) - 1) // 2
        # As many steps as the slowest env of the group has finished (not counting one whose
        # result is still to come back), and every one of them.
        assert steps == min(len(env.log[k]) - env.pending.get(k, False) for k in envs) and steps > 20
        since_reset = np.zeros(W)
        for t in range(steps):
            _, actions, extras = rec.calls[1 + 2 * t]
            step = rec.calls[2 + 2 * t][1]
            for c, k in enumerate(envs):
                a, r, te, tr, o, f = env.log[k][t]
                assert actions[c] == a and step.reward[c] == r and step.terminated[c] == te and step.truncated[c] == tr, (g, t, c)
                np.testing.assert_array_equal(step.obs[c], o)
                assert (c in step.final_obs) == tr
                if tr:
                    np.testing.assert_array_equal(step.final_obs[c], f)
                assert extras["core_h"][c, 0] == since_reset[c]  # the state gathered for env k, reset where its episode ended
                since_reset[c] = 0 if te or tr else since_reset[c] + 1
            # The observation acted on is the one before: its t is in the log-prob.
            prev_t = -extras["behaviour_logp"]
            want = [rec.calls[0][1][c, 1] if t == 0 else rec.calls[2 * t][1].obs[c, 1] for c in range(W)]
            np.testing.assert_array_equal(prev_t, want)
    assert len(frames) == sum((len(r.calls) - 1) // 2 for r in recorders)


def test_ready_streams_need_the_newest_version_any_groups_recorder_needs():
    # A synchronous algorithm (PPO) or a paced Ape-X actor waits for a version after a chunk;
    # under first_ready the actor used to act on without asking.
    recorders = [Calls(), Calls(), Calls()]
    streams = ReadyStreams(CountingPolicy(), recorders, width=2)
    assert streams.version_needed() is None
    recorders[0].version_needed = lambda: 4
    recorders[2].version_needed = lambda: 7
    assert streams.version_needed() == 7


def test_first_ready_needs_ale_pys_vector_env():
    from zrl.actors.actor import make_ready_env
    from zrl.config import ConfigError, load_config

    cfg = load_config(None, ["env.id=CartPole-v1", "actor.num_envs=4", "actor.env_groups=2", "actor.env_batching=first_ready"])
    with pytest.raises(ConfigError, match="actor.env_batching: first_ready needs ale_py's AtariVectorEnv"):
        make_ready_env(cfg, 4, 2, 0)
    with pytest.raises(ConfigError, match="actor.env_batching: must be groups or first_ready"):
        load_config(None, ["actor.env_batching=fastest"])
    for bad in (-1, 4, 5):
        with pytest.raises(ConfigError, match=r"actor.act_batch: must be 0 \(a chunk's width\) or 1 to actor.num_envs - 1 \(3\)"):
            load_config(None, ["actor.num_envs=4", f"actor.act_batch={bad}"])


def test_ale_batches_are_the_envs_that_finished_first_and_ids_name_them():
    pytest.importorskip("ale_py.vector_env", reason="ale-py (with AtariVectorEnv) is not installed")
    from zrl.config import EnvConfig
    from zrl.envs.atari import AleVectorEnv

    env = AleVectorEnv(EnvConfig(id="ALE/Pong-v5", max_episode_frames=40), 6, 0, batch_size=2)
    try:
        with pytest.raises(RuntimeError, match="reset_batch"):
            env.reset()
        ids, obs = env.reset_batch()
        assert ids.shape == (2,) and obs.shape == (2, 4, 84, 84)
        seen = {int(k): 0 for k in ids}
        truncations = 0
        # At least 60 steps, and on until every env has been served: ale_py hands out the
        # first envs to finish, and on a loaded machine one may wait longer than 60 steps.
        for n in range(3000):
            if n >= 60 and len(seen) == 6:
                break
            env.step_async(np.array([2, 3]))
            step = env.step_wait()
            assert step.env_ids.shape == (2,) and step.obs.shape == (2, 4, 84, 84) and len(set(step.env_ids.tolist())) == 2
            for i, k in enumerate(step.env_ids.tolist()):
                seen[k] = seen.get(k, 0) + 1
                if step.truncated[i]:
                    truncations += 1
                    last = step.final_obs[i]
                    assert last.shape == (4, 84, 84) and last.reshape(4, -1).any(axis=1).all()
                    assert not step.obs[i][:-1].any()  # the next episode's first stack
            assert set(step.final_obs) == set(np.flatnonzero(step.truncated).tolist())
        assert sorted(seen) == list(range(6))  # every env was served
        assert truncations > 0  # 40 frames: episodes of 10 steps
        with pytest.raises(ValueError, match="expected 2 actions"):
            env.step_async(np.zeros(6, np.int64))
    finally:
        env.close()


@pytest.mark.parametrize("batch", [2, 3])
def test_a_first_ready_pong_actors_chunks_are_each_envs_frames_in_order(batch):
    # The real env, policy and recorder, as the actor's loop runs them. A column of a chunk is one
    # env's steps in order: each observation's frame stack is the one before shifted by a frame
    # (unless an episode ended), and a chunk starts where the column's previous chunk ended.
    # The policy acts on the first `batch` envs ready: a chunk's width (2), or not (actor.act_batch 3).
    pytest.importorskip("ale_py.vector_env", reason="ale-py (with AtariVectorEnv) is not installed")
    from zrl import wire
    from zrl.actors.actor import make_ready_env
    from zrl.config import load_config
    from zrl import algorithms
    from zrl.actors.sender import Sender

    T, W, G = 6, 2, 3
    cfg = load_config(PONG_CONFIG, [f"actor.num_envs={W * G}", f"actor.env_groups={G}", "actor.env_batching=first_ready",
                                    f"actor.unroll_length={T}", "env.max_episode_frames=60", "actor.int8_torso=false",
                                    "actor.int8_first_conv=false", "actor.precision=fp32"])
    env = make_ready_env(cfg, W * G, batch, 0)
    try:
        algo = algorithms.get("impala")(cfg, env.observation_spec, env.action_spec)
        model = algo.build_model().eval()
        senders = [Sender(g) for g in range(G)]
        recorders = [algo.make_recorder(model, num_envs=W, sender=senders[g]) for g in range(G)]
        streams = ReadyStreams(algo.make_policy(model, actor_index=0, num_actors=1, seed=0), recorders, W)
        ids, obs = env.reset_batch()
        streams.begin(ids, obs)
        env.step_async(streams.act(ids, obs))
        chunks = {g: [] for g in range(G)}
        steps = 0
        while min(len(c) for c in chunks.values()) < 4:
            step = env.step_wait()
            frames, stepped = streams.observe(step)
            steps += int(stepped.sum())
            env.step_async(streams.act(step.env_ids, step.obs))
            for f in frames:
                msg = wire.decode(f)
                chunks[msg.sender_id].append(msg.arrays)
            assert steps < 2000
    finally:
        env.close()
    truncated_columns = 0
    for g, got in chunks.items():
        for n, a in enumerate(got):
            assert a["obs"].shape == (T + 1, W, 4, 84, 84)
            if n:
                np.testing.assert_array_equal(a["obs"][0], got[n - 1]["obs"][T])
            finals = dict(zip(a["final_index"].tolist(), a["final_obs"]))
            for t in range(T):
                for c in range(W):
                    before, after = a["obs"][t, c], a["obs"][t + 1, c]
                    if a["terminated"][t, c] or a["truncated"][t, c]:
                        assert not after[:-1].any()  # a new episode's first stack
                        if a["truncated"][t, c]:
                            truncated_columns += 1
                            np.testing.assert_array_equal(finals[t * W + c][:-1], before[1:])
                    else:
                        np.testing.assert_array_equal(after[:-1], before[1:])
    assert truncated_columns > 0  # 60 frames: every env's episodes end within the chunks
