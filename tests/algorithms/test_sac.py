"""SAC: the squashed Gaussian and its bounds, the actors' chunks as transitions, the replay
ratio and the hold on actors that run ahead of it, checkpoints, and one learning run."""
from __future__ import annotations

import io
import threading

import numpy as np
import pytest
import torch
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from zrl import algorithms, spaces, wire
from zrl.actors.sender import Sender
from zrl.algorithms.sac.networks import squashed_log_prob
from zrl.config import load_config
from zrl.envs import Step
from zrl.learner.batches import ReplayBatches
from zrl.learner.progress import Progress
from helpers import ROOT, apex_config, run_to_return, wait_for

OBS = spaces.BoxSpec((3,), "float32")
ACT = spaces.BoxSpec((2,), "float32", low=-2.0, high=1.0)  # asymmetric: the rescaling shows
PENDULUM = ROOT / "configs" / "pendulum_sac.yaml"


def sac_config(*overrides: str):
    """The Pendulum config, scaled down for logic tests: chunks of 4 steps x 2 envs."""
    base = ["actor.num_envs=2", "actor.unroll_length=4", "algo.batch_size=8", "algo.learning_starts=16",
            "algo.updates_per_step=0.5", "model.hidden_sizes=[16,16]", "learner.log_interval_s=0.2",
            "run.max_seconds=null", "run.stop_at_return=null"]
    return load_config(PENDULUM, [*base, *overrides])


def make_sac(*overrides: str, obs=OBS, act=ACT):
    return algorithms.get("sac")(sac_config(*overrides), obs, act)


def chunk(cfg, rng, truncated=(), terminated=(), version=0) -> tuple[wire.Message, dict[str, int]]:
    """A checked chunk of T x K steps with random values; `truncated` and `terminated` list
    (t, k) steps; each truncated one carries a final observation."""
    T, K = cfg.actor.unroll_length, cfg.actor.num_envs
    a = {
        "obs": rng.normal(size=(T + 1, K, *OBS.shape)).astype(np.float32),
        "action": rng.uniform(ACT.low, ACT.high, (T, K, *ACT.shape)).astype(np.float32),
        "reward": rng.normal(size=(T, K)).astype(np.float32),
        "terminated": np.zeros((T, K), bool),
        "truncated": np.zeros((T, K), bool),
        "behaviour_logp": np.zeros((T, K), np.float32),
    }
    for t, k in terminated:
        a["terminated"][t, k] = True
    for t, k in truncated:
        a["truncated"][t, k] = True
    a["final_index"] = np.array(sorted(t * K + k for t, k in truncated), np.int32)
    a["final_obs"] = rng.normal(size=(len(truncated), *OBS.shape)).astype(np.float32)
    msg = wire.decode(wire.encode(wire.Kind.TRAJECTORY, a, policy_version=version))
    return msg, make_sac().trajectory_schema(8).check(msg)


@pytest.mark.timeout(30)
def test_squashed_log_prob_is_the_tanh_transformed_gaussians_and_stays_finite():
    g = torch.Generator().manual_seed(0)  # (float64: the reference goes back through atanh(tanh(u)))
    mean, log_std = torch.randn(256, 2, generator=g, dtype=torch.float64), 0.5 * torch.randn(256, 2, generator=g, dtype=torch.float64)
    u = mean + log_std.exp() * torch.randn(256, 2, generator=g, dtype=torch.float64)
    want = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform()]).log_prob(torch.tanh(u)).sum(-1)
    torch.testing.assert_close(squashed_log_prob(u, mean, log_std), want, rtol=1e-6, atol=1e-6)
    # Far out, tanh(u) rounds to +-1 and log(1 - tanh(u)^2) to -inf; the softplus form does not.
    far = torch.tensor([[30.0, -40.0]])
    assert torch.isfinite(squashed_log_prob(far, torch.zeros(1, 2), torch.zeros(1, 2))).all()


@pytest.mark.timeout(30)
def test_actions_stay_in_the_bounds_random_until_trained_weights_arrive():
    algo = make_sac()
    acting = algo.build_model()  # an actor's copy
    policy = algo.make_policy(acting, actor_index=0, num_actors=1, seed=0)
    obs = np.random.default_rng(0).normal(size=(4000, *OBS.shape)).astype(np.float32)
    uniform, extras = policy.act(obs)
    assert uniform.shape == (4000, *ACT.shape) and uniform.dtype == np.float32 and extras["behaviour_logp"].shape == (4000,)
    assert uniform.min() >= ACT.low and uniform.max() <= ACT.high
    np.testing.assert_allclose(np.quantile(uniform, [0.1, 0.5, 0.9], axis=0).T, [[-1.7, -0.5, 0.7]] * 2, atol=0.05)
    # The learner's first update marks its weights trained; an actor that gets them acts with them.
    algo.setup(torch.device("cpu"))
    rng = np.random.default_rng(0)
    for _ in range(3):
        algo.ingest(*chunk(algo.config, rng))
    algo.update(algo.sample(torch.device("cpu")), env_steps=24)
    with torch.no_grad():
        weights = torch.nn.utils.parameters_to_vector(algo.model.parameters())  # what the learner publishes
        torch.nn.utils.vector_to_parameters(weights, acting.parameters())
        acting.mean.weight.mul_(1e4)  # means far past the tanh's range: the draws pile up at the bounds
    assert float(acting.trained) == 1.0
    sampled, extras = policy.act(obs)
    assert sampled.min() >= ACT.low and sampled.max() <= ACT.high and np.isfinite(extras["behaviour_logp"]).all()
    assert np.mean((sampled == ACT.low) | (sampled == ACT.high)) > 0.5  # not the uniform draw any more
    greedy, _ = algo.make_eval_policy(acting, greedy=True).act(obs[:5])
    with torch.no_grad():
        mean = acting(torch.from_numpy(obs[:5]))[0]
    np.testing.assert_allclose(greedy, (ACT.low + (torch.tanh(mean) + 1) / 2 * (ACT.high - ACT.low)).numpy(), atol=1e-6)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("act, why", [
    (spaces.DiscreteSpec(3), "needs a Box action space"),
    (spaces.BoxSpec((2,), "float32", low=None, high=1.0), "lacks one for some element"),
    (spaces.BoxSpec((2,), "float32", low=-1.0, high=None), "lacks one for some element"),
    (spaces.BoxSpec((2,), "float32", low=[-1.0, None], high=1.0), "lacks one for some element"),
    (spaces.BoxSpec((2,), "float32", low=[-1.0, 2.0], high=1.0), "low < high for every element"),
])
def test_it_refuses_discrete_and_unbounded_actions(act, why):
    with pytest.raises(ValueError, match=why):
        make_sac(act=act)


@pytest.mark.timeout(30)
def test_a_chunk_becomes_transitions_that_bootstrap_only_truncated_episodes():
    algo = make_sac("algo.discount=0.9")
    model = algo.build_model()
    rec = algo.make_recorder(model, num_envs=2, sender=Sender(0))
    rng = np.random.default_rng(1)
    obs = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(5)]
    final = rng.normal(size=3).astype(np.float32)
    rec.begin(obs[0])
    frames = []
    for t in range(4):  # env 0 is truncated after step 1 (its final observation `final`), env 1 terminates at step 2
        rec.record(rng.uniform(-2, 1, (2, 2)).astype(np.float32), {"behaviour_logp": np.zeros(2, np.float32)})
        term, trunc = np.array([False, t == 2]), np.array([t == 1, False])
        frames += rec.observe(Step(obs[t + 1], np.array([t, 10 + t], np.float32), term, trunc, {0: final} if t == 1 else {}))
    msg = wire.decode(bytes(frames[0]))
    algo.ingest(msg, algo.trajectory_schema(8).check(msg))
    got = {k.removeprefix("field/"): np.asarray(v) for k, v in algo.replay.state_dict().items() if k.startswith("field/")}
    assert len(algo.replay) == 8 and algo.ingested == 8
    for t in range(4):
        for k in range(2):
            i = t * 2 + k
            np.testing.assert_array_equal(got["obs"][i], obs[t][k])
            assert got["reward"][i] == (10 + t if k else t)
            assert got["discount"][i] == pytest.approx(0.0 if (t, k) == (2, 1) else 0.9)
            np.testing.assert_array_equal(got["next_obs"][i], final if (t, k) == (1, 0) else obs[t + 1][k])
    np.testing.assert_array_equal(got["action"], msg.arrays["action"].reshape(8, 2))


@pytest.mark.timeout(30)
def test_sample_waits_for_learning_starts_then_holds_the_replay_ratio():
    algo = make_sac()  # learning_starts 16, 0.5 updates per env step, chunks of 8 steps
    algo.setup(torch.device("cpu"))
    rng = np.random.default_rng(0)
    algo.ingest(*chunk(algo.config, rng, truncated=[(1, 0)], terminated=[(2, 1)]))
    assert algo.sample(torch.device("cpu")) is None and "8/16 env steps (algo.learning_starts)" in algo.waiting_for()
    for _ in range(2):
        algo.ingest(*chunk(algo.config, rng))
    for _ in range(4):  # 0.5 x (24 - 16)
        batch = algo.sample(torch.device("cpu"))
        assert batch is not None and batch.pop("_policy_version").shape == (8,)
        stats = algo.update(batch, env_steps=24)
        assert all(torch.isfinite(v).all() for v in stats.values())
    assert algo.sample(torch.device("cpu")) is None and "4 updates for 24 received" in algo.waiting_for()
    algo.ingest(*chunk(algo.config, rng))
    assert algo.sample(torch.device("cpu")) is not None


@pytest.mark.timeout(30)
def test_the_replay_source_takes_no_chunks_while_the_actors_are_ahead_of_the_ratio():
    cfg = sac_config("algo.max_steps_ahead=8")
    progress = Progress(cfg, None)
    source = ReplayBatches(make_sac("algo.max_steps_ahead=8"), torch.device("cpu"), progress, cfg, threading.Event())
    allowed = {0: 16, 2: 20, 100: 216}  # updates -> the env steps they allow: 16 to start, then 2 per update
    for updates, steps in allowed.items():
        progress.updates = updates
        progress.env_steps = steps + 8  # 8 ahead: the most it may be
        assert source.room() == 0
        progress.env_steps = steps + 4
        assert source.room() == 1  # half a chunk of room: one more chunk
        progress.env_steps = steps - 1000
        assert source.room() == 64
    # By default the slack is one chunk per actor; Ape-X, without a ratio, always takes chunks.
    default = ReplayBatches(make_sac(), torch.device("cpu"), progress, sac_config(), threading.Event())
    assert default.max_ahead == 4 * 2 * 1
    apex = apex_config()
    progress = Progress(apex, None)
    source = ReplayBatches(algorithms.get("apex_dqn")(apex, spaces.BoxSpec((2,), "float32"), spaces.DiscreteSpec(2)),
                           torch.device("cpu"), progress, apex, threading.Event())
    progress.env_steps = 10**9
    assert source.room() == 64


@pytest.mark.timeout(90)
def test_actors_are_held_to_the_replay_ratio(make_learner, make_actor):
    # A learner on Pendulum at 0.5 updates per env step: the steps it receives stay within
    # max_steps_ahead (and one chunk, which room() rounds up to) of what its updates allow,
    # and ZeroMQ holds the actor back: it has stepped at most a few chunks more.
    cfg = sac_config("algo.max_steps_ahead=8", "learner.publish_interval=4")
    learner, _ = make_learner(cfg)
    actor, _ = make_actor(cfg)
    worst = {"received": -1e9, "stepped": -1e9}

    def enough_updates() -> bool:
        steps, stepped = learner.env_steps, actor.env_steps
        updates = learner.updates  # (read last: it only grows, so what it allows is never understated)
        allowed = 16 + updates / 0.5
        worst["received"] = max(worst["received"], steps - allowed)
        worst["stepped"] = max(worst["stepped"], stepped - allowed)
        return updates >= 150

    wait_for(enough_updates, 60, "SAC updates")
    assert worst["received"] <= 8 + 8, worst
    assert worst["stepped"] <= 8 + 8 * 8, worst  # the learner's socket, the actor's, its frame in hand
    assert not learner.rejected


@pytest.mark.timeout(30)
def test_a_checkpoint_carries_the_critics_targets_alpha_and_optimiser():
    def trained(steps: int):
        torch.manual_seed(0)
        algo = make_sac()
        algo.setup(torch.device("cpu"))
        rng = np.random.default_rng(0)
        for _ in range(6):
            algo.ingest(*chunk(algo.config, rng))
        for _ in range(steps):
            algo.update(algo.sample(torch.device("cpu")), env_steps=48)
        return algo

    algo = trained(5)
    buf = io.BytesIO()
    torch.save(algo.checkpoint_state(), buf)  # as zrl.checkpoint saves it, and loads it: tensors and plain data only
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert set(state["algo"]) == {"critic", "critic_target", "log_alpha"}
    restored = trained(0)
    restored.restore(state, optimizer_matches=True)
    for a, b in [(algo.model, restored.model), (algo.critic, restored.critic), (algo.critic_target, restored.critic_target)]:
        for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
            torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    assert restored.log_alpha.item() == algo.log_alpha.item() != 0.0
    assert not torch.equal(algo.critic_target.weights[0], algo.critic.weights[0])  # (the targets are their own)
    # The same next update from both: the optimiser's moments came along too.
    batch = algo.sample(torch.device("cpu"))
    for a in (algo, restored):
        torch.manual_seed(1)  # the same draws of the policy's actions
        a.update({k: v.clone() for k, v in batch.items() if k != "_policy_version"}, env_steps=48)
    for p, q in zip(algo.params, restored.params):
        torch.testing.assert_close(p, q)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_pendulum_config_learns(tmp_path):
    """The learning test: `zrl run` with the shipped config, to a modest bound."""
    run_to_return(PENDULUM, -600, tmp_path, max_seconds=150)


@pytest.mark.timeout(30)
def test_per_element_bounds_rescale_each_element_to_its_own():
    act = spaces.BoxSpec((2,), "float32", low=[-2.0, 0.0], high=[1.0, 10.0])
    algo = make_sac(act=act)
    model = algo.build_model()
    edges = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0]])
    np.testing.assert_allclose(model.to_bounds(edges).numpy(), [[-2.0, 0.0], [1.0, 10.0], [-0.5, 5.0]], atol=1e-6)
    np.testing.assert_allclose(model.from_bounds(model.to_bounds(edges)).numpy(), edges.numpy(), atol=1e-6)
    assert "low" not in model.state_dict()  # (the bounds come from the spec, not the checkpoint)
    obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    sampled, _ = algo.make_policy(model, actor_index=0, num_actors=1, seed=0).act(obs)
    assert (sampled >= [-2.0, 0.0]).all() and (sampled <= [1.0, 10.0]).all()
