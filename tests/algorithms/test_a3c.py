"""A3C: actors' gradients checked at the learner's gate, staleness bounded, the actor-side
gradient against a plain recomputation, and CartPole learned through `zrl run`."""
from __future__ import annotations


import numpy as np
import pytest
import torch
import zmq

from zrl import algorithms, spaces, wire
from zrl.actors.actor import hello_meta, say_hello
from zrl.actors.sender import Sender
from zrl.config import load_config
from zrl.envs import Step
from zrl.learner.receiver import DATA_KINDS
from zrl.models import flatten_parameters
from helpers import ROOT, good_trajectory, run_to_return, small_config, wait_for

OBS = spaces.BoxSpec((4,), "float32")
ACT = spaces.DiscreteSpec(2)
CONFIG = ROOT / "configs" / "cartpole_a3c.yaml"
A3C = algorithms.get("a3c")


def a3c_config(*overrides: str):
    """The A3C CartPole config, scaled down for logic tests."""
    base = [
        "actor.num_envs=4",
        "actor.unroll_length=5",
        "learner.log_interval_s=0.2",
        "learner.lr_decay_env_steps=null",
        "actor.learner_timeout_s=2",
        "run.max_seconds=null",
        "run.stop_at_return=null",
    ]
    return load_config(CONFIG, [*base, *overrides])


def gradient_arrays(algo, scale: float = 1e-2, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "gradient": (rng.standard_normal(algo.n_params()) * scale).astype(np.float32),
        "env_steps": np.array(20, np.int64),
        "loss": np.zeros(3, np.float32),
    }


def damaged(algo) -> dict[str, tuple[dict, wire.Reason, str]]:
    """Gradient messages that break one rule each: (arrays, the reason, a word of its detail)."""
    good = gradient_arrays(algo)
    n = algo.n_params()
    nan = dict(good, gradient=good["gradient"].copy())
    nan["gradient"][7] = np.nan
    inf = dict(good, gradient=good["gradient"].copy())
    inf["gradient"][0] = np.inf
    big = dict(good, gradient=np.full(n, 2 * algo.hp.max_gradient_norm / np.sqrt(n), np.float32))  # norm 2x the bound
    return {
        "shape": (dict(good, gradient=np.zeros(n + 1, np.float32)), wire.Reason.BAD_SHAPE, "gradient"),
        "dtype": (dict(good, gradient=good["gradient"].astype(np.float64)), wire.Reason.BAD_DTYPE, "gradient"),
        "nan": (nan, wire.Reason.BAD_VALUE, "NaN"),
        "inf": (inf, wire.Reason.BAD_VALUE, "NaN or an infinity"),
        "norm": (big, wire.Reason.BAD_VALUE, "norm"),
        "env_steps": (dict(good, env_steps=np.array(-1, np.int64)), wire.Reason.BAD_VALUE, "env_steps"),
        "missing": ({k: v for k, v in good.items() if k != "loss"}, wire.Reason.MISSING_FIELD, "loss"),
        "extra": (dict(good, obs=np.zeros(3, np.float32)), wire.Reason.UNKNOWN_FIELD, "obs"),
    }


def learner_gate(cfg, algo) -> wire.Gate:
    """The gate as a learner sets it up for `algo`."""
    gate = wire.Gate(cfg.learner.max_message_bytes, DATA_KINDS)
    gate.set_trajectory_schema(algo.trajectory_schema(cfg.learner.batch_size))
    gate.set_gradient_schema(algo.gradient_schema())
    return gate


def reason(gate: wire.Gate, frame) -> tuple[wire.Reason, str] | None:
    try:
        gate.check(bytes(frame))
    except wire.WireError as e:
        return e.reason, e.detail
    return None


@pytest.mark.timeout(60)
def test_gradient_messages_are_checked_at_the_gate():
    cfg = a3c_config()
    algo = A3C(cfg, OBS, ACT)
    good = wire.encode(wire.Kind.GRADIENT, gradient_arrays(algo), policy_version=3)
    early = wire.Gate(cfg.learner.max_message_bytes, DATA_KINDS)
    assert reason(early, good)[0] == wire.Reason.NOT_READY  # before a hello agreed the specs

    gate = learner_gate(cfg, algo)
    msg, bindings = gate.check(bytes(good))
    assert msg.kind == wire.Kind.GRADIENT and msg.policy_version == 3 and bindings is not None
    assert algo.env_steps(msg, bindings) == 20
    for name, (arrays, want, word) in damaged(algo).items():
        got = reason(gate, wire.encode(wire.Kind.GRADIENT, arrays))
        assert got is not None and got[0] == want and word in got[1], (name, got)
    # Each learner takes the kind its algorithm's actors send, and refuses the other.
    assert reason(gate, wire.encode(wire.Kind.TRAJECTORY, good_trajectory(cfg)))[0] == wire.Reason.UNEXPECTED_KIND
    impala_cfg = small_config()
    impala = algorithms.get("impala")(impala_cfg, OBS, ACT)
    assert reason(learner_gate(impala_cfg, impala), good)[0] == wire.Reason.UNEXPECTED_KIND


@pytest.mark.timeout(90)
def test_a_learner_rejects_bad_gradients_applies_fresh_ones_and_discards_stale_ones(ctx, make_learner):
    cfg = a3c_config("algo.max_staleness=1")
    learner, runner = make_learner(cfg)
    reply = say_hello(ctx, learner.control_endpoint, hello_meta(cfg, "actor", 0, OBS, ACT, cfg.actor.num_envs), timeout_s=60)
    weights = np.array(reply.weights.arrays["params"])
    algo = learner.algo
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(learner.trajectory_endpoint)
    try:
        # Bad ones are counted by reason and dropped: no update, no env steps.
        bad = damaged(algo)
        for arrays, _, _ in bad.values():
            push.send(wire.encode(wire.Kind.GRADIENT, arrays, sender_id=reply.sender_id))
        wait_for(lambda: sum(learner.rejected.values()) == len(bad), 30, lambda: f"rejections, got {dict(learner.rejected)}")
        assert learner.rejected == {"bad_shape": 1, "bad_dtype": 1, "bad_value": 4, "missing_field": 1, "unknown_field": 1}
        assert learner.updates == 0 and learner.env_steps == 0

        # A fresh gradient moves the weights: clipped to learner.max_grad_norm, then Adam's first
        # step, lr * g / (|g| + eps).
        g = gradient_arrays(algo, seed=1)["gradient"]
        push.send(wire.encode(wire.Kind.GRADIENT, dict(gradient_arrays(algo), gradient=g), policy_version=0, sender_id=reply.sender_id))
        wait_for(lambda: learner.updates == 1, 30, "the first gradient applied")
        lc = cfg.learner
        clipped = g.astype(np.float64) * min(1.0, lc.max_grad_norm / (np.linalg.norm(g) + 1e-6))
        np.testing.assert_allclose(algo.flat.numpy() - weights, -lc.learning_rate * clipped / (np.abs(clipped) + lc.adam_eps), atol=1e-6)
        assert learner.env_steps == 20

        # Computed one update ago: max_staleness 1 still takes it.
        push.send(wire.encode(wire.Kind.GRADIENT, gradient_arrays(algo, seed=2), policy_version=0, sender_id=reply.sender_id))
        wait_for(lambda: learner.updates == 2, 30, "a gradient max_staleness old applied")
        before = algo.flat.clone()
        # Two updates ago: discarded and counted; the weights stay.
        push.send(wire.encode(wire.Kind.GRADIENT, gradient_arrays(algo, seed=3), policy_version=0, sender_id=reply.sender_id))
        wait_for(lambda: learner.progress.discarded["stale_gradient"] == 1, 30, "the stale gradient discarded")
        # A version the learner never made is no honest actor's.
        push.send(wire.encode(wire.Kind.GRADIENT, gradient_arrays(algo, seed=4), policy_version=99, sender_id=reply.sender_id))
        wait_for(lambda: learner.rejected.get("future_version") == 1, 30, "the future gradient rejected")
        assert learner.updates == 2 and torch.equal(algo.flat, before)
        assert learner.env_steps == 3 * 20  # received: the stale one's steps were taken, the rejected one's not
        assert runner.thread.is_alive()
    finally:
        push.close()


def reference_gradient(algo, rollout: dict, final_obs: dict) -> tuple[np.ndarray, list[float]]:
    """The loss's gradient on the learner's model, with the n-step returns written plainly, env by env."""
    hp = algo.hp
    model = algo.model
    obs = torch.from_numpy(rollout["obs"])
    T, K = rollout["reward"].shape

    def value(x) -> float:
        with torch.no_grad():
            return float(model.value_only(torch.as_tensor(x)[None])[0])

    returns = np.zeros((T, K), np.float64)
    for k in range(K):
        R = value(rollout["obs"][T, k])
        for t in reversed(range(T)):
            r = hp.reward_scale * float(rollout["reward"][t, k])
            if rollout["terminated"][t, k]:
                R = r
            elif rollout["truncated"][t, k]:
                R = r + hp.discount * value(final_obs[(t, k)])
            else:
                R = r + hp.discount * R
            returns[t, k] = R
    logits, values = model(obs[:T].reshape(T * K, -1))
    logits, values = logits.reshape(T, K, -1), values.reshape(T, K)
    returns_t = torch.from_numpy(returns).float()
    adv = returns_t - values.detach()
    if hp.normalize_advantages:
        adv = (adv - adv.mean()) / (adv.std(correction=0) + 1e-8)
    dist = torch.distributions.Categorical(logits=logits)
    pg = -(adv * dist.log_prob(torch.from_numpy(rollout["action"]))).mean()
    vloss = 0.5 * (returns_t - values).pow(2).mean()
    entropy = dist.entropy().mean()
    algo.optimizer.zero_grad(set_to_none=True)
    (pg + hp.value_cost * vloss - hp.entropy_cost * entropy).backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return grad.numpy(), [float(x.detach()) for x in (pg, vloss, entropy)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("normalize", [False, True])
def test_the_actors_gradient_is_the_learners_on_the_same_rollout(normalize):
    cfg = a3c_config("actor.unroll_length=6", "algo.discount=0.9", "algo.reward_scale=0.5", "algo.entropy_cost=0.05",
                     f"algo.normalize_advantages={str(normalize).lower()}")
    T, K = 6, 3
    actor = A3C(cfg, OBS, ACT)
    torch.manual_seed(0)
    model = actor.build_model()
    flatten_parameters(model)  # as the actor's link makes them
    model.eval()
    recorder = actor.make_recorder(model, num_envs=K, sender=Sender(5))
    recorder.policy_version = 7
    rng = np.random.default_rng(0)
    ends = {(2, 0): "terminated", (3, 1): "truncated", (5, 1): "truncated"}  # env 2 runs through
    rollout = {"obs": rng.standard_normal((T + 1, K, 4)).astype(np.float32), "action": rng.integers(0, 2, (T, K)),
               "reward": rng.standard_normal((T, K)).astype(np.float32),
               "terminated": np.zeros((T, K), bool), "truncated": np.zeros((T, K), bool)}
    final_obs = {}
    for (t, k), how in ends.items():
        rollout[how][t, k] = True
        if how == "truncated":
            final_obs[(t, k)] = rng.standard_normal(4).astype(np.float32)
    recorder.begin(rollout["obs"][0])
    frames = []
    for t in range(T):
        with torch.inference_mode():  # (as the actor acts: the recorder computes with autograd anyway)
            recorder.record(rollout["action"][t], {"behaviour_logp": np.zeros(K, np.float32)})
            finals = {k: o for (s, k), o in final_obs.items() if s == t}
            frames += recorder.observe(Step(rollout["obs"][t + 1], rollout["reward"][t], rollout["terminated"][t],
                                            rollout["truncated"][t], finals))
    assert len(frames) == 1 and all(p.grad is None for p in model.parameters())

    learner = A3C(cfg, OBS, ACT)
    learner.setup(torch.device("cpu"))
    learner.flat.copy_(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    msg, bindings = learner_gate(cfg, learner).check(bytes(frames[0]))
    assert msg.policy_version == 7 and msg.sender_id == 5 and learner.env_steps(msg, bindings) == T * K
    want, losses = reference_gradient(learner, rollout, final_obs)
    np.testing.assert_allclose(msg.arrays["gradient"], want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(msg.arrays["loss"], losses, rtol=1e-4, atol=1e-6)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("override,key", [("actor.precision=bf16", "actor.precision"), ("actor.precision=auto", "actor.precision"),
                                          ("actor.int8_torso=auto", "actor.int8_torso"),
                                          ("actor.int8_first_conv=true", "actor.int8_first_conv")])
def test_actors_that_cannot_compute_fp32_gradients_are_refused(override, key):
    with pytest.raises(ValueError, match=rf"^{key}: must be"):
        A3C(a3c_config(override), OBS, ACT)


@pytest.mark.timeout(30)
def test_a3c_is_refused_by_an_impala_config_and_takes_no_trajectories():
    with pytest.raises(ValueError, match="A3CConfig"):
        A3C(small_config(), OBS, ACT)
    assert A3C(a3c_config(), OBS, ACT).trajectory_schema(8) is None


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a3c_config_learns_cartpole(tmp_path):
    """The learning test: the real CLI, the shipped config, 2 actors, a modest bound."""
    run_to_return(CONFIG, 150, tmp_path, max_seconds=100)


@pytest.mark.timeout(120)
def test_actors_send_their_rollouts_observation_moments_and_the_learner_keeps_them(make_learner, make_actor):
    cfg = a3c_config("model.normalize_obs=true")
    algo = A3C(cfg, OBS, ACT)
    gate = learner_gate(cfg, algo)
    arrays = dict(gradient_arrays(algo), obs_mean=np.zeros(4, np.float32), obs_var=np.full(4, -1.0, np.float32))
    assert reason(gate, wire.encode(wire.Kind.GRADIENT, arrays))[0] == wire.Reason.BAD_VALUE  # a negative variance
    learner, _ = make_learner(cfg)
    actor, _ = make_actor(cfg, max_steps=10**9)
    wait_for(lambda: learner.updates >= 3, 60, "updates from an actor's gradients")
    wait_for(lambda: actor.policy_version >= 2, 60, "the actor applies published weights")
    assert float(learner.model.obs_norm.count) >= 3 * cfg.actor.unroll_length * cfg.actor.num_envs
    assert float(actor.model.obs_norm.count) > 0  # it acts with the learner's statistics
    assert not learner.rejected
