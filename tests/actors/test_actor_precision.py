"""actor.precision: actors that act in bfloat16 with the learner's fp32 weights cast on arrival."""
from __future__ import annotations

import copy
import threading

import numpy as np
import pytest
import torch

from zrl import spaces, wire
from zrl.actors.actor import LearnerLink
from zrl.config import ConfigError, load_config
from zrl import algorithms
from helpers import ROOT, small_config, wait_for

pytestmark = pytest.mark.timeout(60)

PONG_CONFIG = ROOT / "configs" / "pong_impala.yaml"
OBS = spaces.BoxSpec((4, 84, 84), "uint8", 0.0, 255.0)
PONG_ACTIONS = spaces.DiscreteSpec(6)


def bf16_link(model):
    """A LearnerLink over `model` in bf16, as a bf16 actor builds it (no sockets until connect)."""
    model.to(torch.bfloat16)
    return LearnerLink(None, "inproc://unused", {}, model, sender_id=0, timeout_s=1.0, send_hwm=1, stop=threading.Event(), say=print)


def test_actor_precision_must_be_fp32_bf16_or_auto():
    with pytest.raises(ConfigError, match="actor.precision"):
        load_config(PONG_CONFIG, ["actor.precision=fp16"])
    assert load_config(PONG_CONFIG, ["actor.precision=bf16"]).actor.precision == "bf16"


@pytest.mark.parametrize("core", ["feedforward", "lstm"])
def test_a_bf16_copy_records_the_log_prob_of_what_it_sampled(core):
    over = ["actor.num_envs=8", "actor.env_groups=1"] + (["model.lstm_size=32"] if core == "lstm" else [])
    cfg = load_config(PONG_CONFIG, over)
    algo = algorithms.get("impala")(cfg, OBS, PONG_ACTIONS)
    torch.manual_seed(0)
    master = algo.build_model().eval()
    acting = copy.deepcopy(master)
    bf16_link(acting)
    assert all(p.dtype == torch.bfloat16 for p in acting.parameters())
    assert all(p.dtype == torch.float32 for p in master.parameters())  # the master is untouched

    obs = np.random.default_rng(0).integers(0, 256, (8, 4, 84, 84), dtype=np.uint8)
    policy = algo.make_policy(acting, actor_index=0, num_actors=1, seed=0)
    state = policy.initial_state(8)
    actions, extras = policy.act(obs, state)
    logp = extras["behaviour_logp"]
    assert actions.shape == (8,) and logp.dtype == np.float32 and np.isfinite(logp).all()

    # log mu(a|x) is the copy's own distribution (the one sampled from), in float32 ...
    with torch.inference_mode():
        x = torch.from_numpy(obs)
        if core == "lstm":
            params16, _, new = acting.step(x, tuple(torch.from_numpy(s).bfloat16() for s in state))
            params32, _, _ = master.step(x, tuple(torch.from_numpy(s) for s in state))
            assert all(s.dtype == np.float32 and s.shape == (8, 32) for s in extras["state"])
            np.testing.assert_array_equal(extras["state"][0], new[0].float().numpy())
        else:
            # A feed-forward actor's head runs in fp32 on the bf16 torso's features.
            params16, params32 = acting.policy_float(x), master.policy(x)
        head = master.head
        expected = head.log_prob(params16.float(), torch.from_numpy(actions)).numpy()
    np.testing.assert_allclose(logp, expected, rtol=1e-5, atol=1e-6)  # zrl's C++ draw computes it in double
    # ... and close to the fp32 master's: V-trace's importance weights see only rounding.
    p16, p32 = torch.softmax(params16.float(), -1), torch.softmax(params32, -1)
    assert (p16 - p32).abs().max() < 0.02


def test_received_fp32_weights_are_cast_into_the_bf16_model():
    cfg = load_config(PONG_CONFIG, [])
    algo = algorithms.get("impala")(cfg, OBS, PONG_ACTIONS)
    model = algo.build_model()
    link = bf16_link(model)
    params = np.random.default_rng(0).normal(size=link.n_params).astype(np.float32)
    frame = wire.encode(wire.Kind.WEIGHTS, {"params": params}, policy_version=3)
    before = link.flat.clone()
    msg = wire.decode(frame)
    assert torch.equal(link.flat, before)  # nothing moves until the weights are applied
    link._apply_weights(msg)
    assert link.flat.dtype == torch.bfloat16 and link.policy_version == 3
    assert torch.equal(link.flat, torch.from_numpy(params).bfloat16())
    # The parameters are views of the flat buffer, so the module sees the new weights.
    first = next(model.parameters())
    assert torch.equal(first.reshape(-1), torch.from_numpy(params[: first.numel()]).bfloat16())


def test_a_bf16_actor_trains_and_follows_the_learners_weights(make_learner, make_actor, monkeypatch):
    applied = []
    apply = LearnerLink._apply_weights

    def recording(self, msg):
        applied.append(np.array(msg.arrays["params"]))
        apply(self, msg)

    monkeypatch.setattr(LearnerLink, "_apply_weights", recording)
    cfg = small_config("actor.precision=bf16")
    learner, _ = make_learner(cfg)
    actor, runner = make_actor(cfg, max_steps=10**9)
    wait_for(lambda: learner.updates >= 3, 60, "learner updates from a bf16 actor's data")
    wait_for(lambda: actor.weights_applied >= 3, 60, "actor applies published weights")
    actor.stop.set()
    runner.join(30)
    assert not learner.rejected  # every chunk of the bf16 actor passed the learner's checks
    flat = actor.link.flat
    assert flat.dtype == torch.bfloat16 and all(p.dtype == torch.bfloat16 for p in actor.model.parameters())
    # The model holds the newest weights the actor applied, cast to bf16.
    assert torch.equal(flat, torch.from_numpy(applied[-1]).bfloat16())
    assert actor.policy_version >= 1
