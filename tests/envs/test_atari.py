"""Atari backends (ale_py's C++ vector env and the gymnasium fallback) and IMPALA's CNN torsos."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("ale_py.vector_env", reason="ale-py (with AtariVectorEnv) is not installed: pip install ale-py")

from zrl import spaces  # noqa: E402
from zrl.config import EnvConfig, ModelConfig, load_config  # noqa: E402
from zrl.envs import make_vector_env, probe_specs  # noqa: E402
from zrl.envs.atari import AleVectorEnv, AreaResize, GymAtariVectorEnv, is_atari, rom_name  # noqa: E402
from zrl import algorithms  # noqa: E402
from zrl.models import ActorCritic, QNetwork, build_actor_critic  # noqa: E402
from zrl.models.cnn import ImpalaDeep, ImpalaShallow  # noqa: E402
from helpers import ROOT  # noqa: E402

pytestmark = pytest.mark.timeout(30)  # each test; the whole file takes a few seconds

PONG_CONFIG = ROOT / "configs" / "pong_impala.yaml"
BACKENDS = {"ale_vector": AleVectorEnv, "gymnasium": GymAtariVectorEnv}
OBS = spaces.BoxSpec((4, 84, 84), "uint8", 0.0, 255.0)
PONG_ACTIONS = spaces.DiscreteSpec(6)


def _env(backend: str, num_envs: int = 2, seed: int = 0, **kw):
    env = make_vector_env(EnvConfig(id="ALE/Pong-v5", backend=backend, **kw), num_envs, seed)
    assert type(env) is BACKENDS[backend]
    return env


def _fresh_stack(obs: np.ndarray) -> bool:
    """A new episode's first observation: every frame but the last is zero padding."""
    return not obs[:-1].any() and obs[-1].any()


# -- env ids and dispatch


@pytest.mark.parametrize(
    "env_id, rom",
    [("ALE/Pong-v5", "pong"), ("PongNoFrameskip-v4", "pong"), ("Pong-v4", "pong"), ("Pong", "pong"), ("pong", "pong"),
     ("ALE/MsPacman-v5", "ms_pacman"), ("MsPacmanNoFrameskip-v4", "ms_pacman"), ("ms_pacman", "ms_pacman"),
     ("ALE/MontezumaRevenge-v5", "montezuma_revenge"), ("TicTacToe3D", "tic_tac_toe_3d")],
)
def test_atari_ids_map_to_rom_names(env_id, rom):
    assert is_atari(env_id)
    assert rom_name(env_id) == rom


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "ALE/Pong-ram-v5"])
def test_non_image_ids_are_not_atari(env_id):
    assert not is_atari(env_id)


def test_unknown_ale_id_is_a_clear_error():
    with pytest.raises(ValueError, match="no Atari ROM"):
        make_vector_env(EnvConfig(id="ALE/NoSuchGame-v5"), 1, 0)


def test_ale_vector_backend_refuses_non_atari_ids():
    with pytest.raises(ValueError, match="Atari games only"):
        make_vector_env(EnvConfig(id="CartPole-v1", backend="ale_vector"), 1, 0)


def test_probe_specs_of_an_atari_id():
    assert probe_specs(EnvConfig(id="PongNoFrameskip-v4")) == (OBS, PONG_ACTIONS)


# -- the backends


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_gives_uint8_frame_stacks_and_a_discrete_spec(backend):
    env = _env(backend, num_envs=3)
    try:
        assert env.observation_spec == OBS and env.action_spec == PONG_ACTIONS
        obs = env.reset()
        assert obs.dtype == np.uint8 and obs.shape == (3, 4, 84, 84)
        assert all(_fresh_stack(o) for o in obs)
        for _ in range(5):
            step = env.step(np.array([0, 2, 3]))
            assert step.obs.dtype == np.uint8 and step.obs.shape == (3, 4, 84, 84)
            assert step.reward.dtype == np.float32 and step.reward.shape == (3,)
            assert step.terminated.dtype == np.bool_ and step.truncated.dtype == np.bool_
            assert step.final_obs == {}
        assert step.obs[:, 0].any()  # after 5 steps the stack is full of real frames
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_truncated_episode_reports_its_final_obs(backend):
    # 5 agent steps of 4 frames, counted from after the reset's no-ops.
    env = _env(backend, num_envs=2, max_episode_frames=20)
    try:
        env.reset()
        for t in range(4):
            step = env.step(np.array([2, 3]))
            assert not step.truncated.any() and not step.terminated.any(), t
        step = env.step(np.array([2, 3]))
        assert step.truncated.all() and not step.terminated.any()
        assert sorted(step.final_obs) == [0, 1]
        for k, last in step.final_obs.items():
            assert last.dtype == np.uint8 and last.shape == (4, 84, 84)
            assert last.reshape(4, -1).any(axis=1).all()  # a full stack of the old episode's frames
            assert _fresh_stack(step.obs[k])  # obs already holds the next episode's start
        step = env.step(np.array([2, 3]))
        assert not step.truncated.any() and step.final_obs == {}
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_terminated_game_resets_in_the_same_step_without_final_obs(backend):
    # Standing still, the agent loses 0:21 in 764 steps.
    env = _env(backend, num_envs=1, noop_max=0)
    try:
        env.reset()
        total = 0.0
        for t in range(1000):
            step = env.step(np.zeros(1, np.int64))
            total += float(step.reward[0])
            if step.terminated[0]:
                break
        assert step.terminated[0] and not step.truncated[0], "the game did not end"
        assert total == -21.0  # raw game score, not clipped
        assert step.final_obs == {}
        assert _fresh_stack(step.obs[0])
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_episodic_life_terminates_on_a_lost_life_and_the_game_goes_on(backend):
    env = make_vector_env(EnvConfig(id="ALE/Breakout-v5", backend=backend, episodic_life=True, noop_max=0), 1, 0)
    try:
        env.reset()
        for t in range(300):
            step = env.step(np.zeros(1, np.int64))  # never serves again after FIRE: loses the ball
            if step.terminated[0]:
                break
        assert step.terminated[0] and step.final_obs == {}
        assert not _fresh_stack(step.obs[0]) and step.obs[0, 0].any()  # no reset: frames carry on
    finally:
        env.close()


def test_backends_agree_frame_for_frame_without_random_noops():
    """The numpy port of the preprocessing gives the C++ env's observations (up to resize rounding)."""
    cfg = dict(noop_max=0, max_episode_frames=4 * 40)
    a, b = _env("ale_vector", 2, **cfg), _env("gymnasium", 2, **cfg)
    try:
        assert np.abs(a.reset().astype(int) - b.reset().astype(int)).max() <= 1
        rng = np.random.default_rng(0)
        for t in range(60):
            act = rng.integers(0, 6, 2)
            sa, sb = a.step(act), b.step(act)
            assert np.abs(sa.obs.astype(int) - sb.obs.astype(int)).max() <= 1, t
            np.testing.assert_array_equal(sa.reward, sb.reward)
            np.testing.assert_array_equal(sa.terminated, sb.terminated)
            np.testing.assert_array_equal(sa.truncated, sb.truncated)
            assert sorted(sa.final_obs) == sorted(sb.final_obs)
    finally:
        a.close()
        b.close()


def test_same_seed_same_episodes_in_the_cpp_backend():
    runs = []
    for _ in range(2):
        env = _env("ale_vector", 2, seed=7, repeat_action_probability=0.25)
        try:
            frames = [env.reset()]
            for t in range(40):
                frames.append(env.step(np.array([t % 6, (t + 3) % 6])).obs)
            runs.append(np.stack(frames))
        finally:
            env.close()
    np.testing.assert_array_equal(runs[0], runs[1])


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="thread priorities are set through /proc (Linux)")
@pytest.mark.parametrize("nice", [0, 5])
def test_emulator_threads_give_way_to_the_actor_thread(nice):
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    env = _env("ale_vector", 2, num_threads=2, thread_nice=nice)
    try:
        assert len(env.emulator_threads) == (2 if nice else 0)
        for tid in env.emulator_threads:  # the workers AtariVectorEnv started
            assert os.sched_getscheduler(tid) == os.SCHED_BATCH
            assert os.getpriority(os.PRIO_PROCESS, tid) == min(19, mine + nice)
            assert Path(f"/proc/self/task/{tid}/comm").read_text().strip() == "zrl-emulator"
        # the calling thread itself is left as it was, and stepping still works
        assert os.sched_getscheduler(0) == os.SCHED_OTHER and os.getpriority(os.PRIO_PROCESS, 0) == mine
        env.reset()
        assert env.step(np.array([0, 1])).obs.shape == (2, 4, 84, 84)
    finally:
        env.close()
    if not nice:  # no thread of the process was touched
        tids = [int(t) for t in os.listdir("/proc/self/task")]
        assert all(os.sched_getscheduler(t) != os.SCHED_BATCH for t in tids if Path(f"/proc/self/task/{t}").exists())


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable cores")
def test_bench_one_core_overrides_pin_every_emulator_thread_to_one_core():
    # `zrl bench pipeline`'s "emulator on 1 core" row relies on this: one thread per env,
    # pinned to the first usable core; the caller's affinity is left as it was.
    from zrl.bench.pipeline import _config, one_core_overrides

    mine = os.sched_getaffinity(0)
    assert one_core_overrides(_config("Pong", ["env.backend=gymnasium"])) is None  # nothing to pin there
    assert one_core_overrides(_config("CartPole")) is None  # nor in a gymnasium env that is not Atari
    cfg = _config("Pong", one_core_overrides(_config("Pong")))
    assert cfg.env.num_threads == 1
    envs = [make_vector_env(cfg.env, 2, 2 * g) for g in range(2)]  # an actor's two env groups
    try:
        tids = [t for e in envs for t in e.emulator_threads]
        assert len(tids) == 2
        assert all(os.sched_getaffinity(t) == {min(mine)} for t in tids)
        assert os.sched_getaffinity(0) == mine
        envs[0].reset()
        assert envs[0].step(np.array([0, 1])).obs.shape == (2, 4, 84, 84)
    finally:
        for e in envs:
            e.close()


def test_emulator_priority_is_left_alone_when_other_threads_start_meanwhile():
    from zrl.envs.atari import _yield_to_caller

    assert _yield_to_caller({1, 2, 3}, 2, 5) == []  # 3 threads appeared, 2 expected: ambiguous, so nothing changes
    assert _yield_to_caller(set(), 2, 5) == []


def test_area_resize_matches_the_dense_definition():
    def weights(n_in, n_out):
        s = n_in / n_out
        lo = np.arange(n_out)[:, None] * s
        j = np.arange(n_in)[None, :]
        return np.clip(np.minimum(j + 1, lo + s) - np.maximum(j, lo), 0, None) / s

    frame = np.random.default_rng(0).integers(0, 256, (210, 160), dtype=np.uint8)
    ref = np.rint(weights(210, 84) @ frame.astype(np.float64) @ weights(160, 84).T)
    out = AreaResize((210, 160), (84, 84))(frame)
    assert out.dtype == np.uint8 and out.shape == (84, 84)
    assert np.abs(out.astype(int) - ref.astype(int)).max() <= 1


# -- CNN torsos and models


@pytest.mark.parametrize("torso", [ImpalaShallow((4, 84, 84), 256), ImpalaDeep((4, 84, 84), (16, 32, 32), 256)], ids=["shallow", "deep"])
def test_cnn_torso_gives_features_from_uint8_frames_and_gradients_flow(torso):
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    h = torso(x)
    assert h.shape == (3, 256) and h.dtype == torch.float32
    assert (h >= 0).all()  # ends in a ReLU
    h.sum().backward()
    for name, p in torso.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert torso.convs[0].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("torso", [ImpalaShallow((4, 84, 84), 32), ImpalaDeep((4, 84, 84), (16, 32, 32), 32)], ids=["shallow", "deep"])
def test_cnn_scales_uint8_inside_the_model(torso, dtype):
    # uint8 frames go through the first conv with its weights scaled by 1/255: the same
    # features as frames scaled to [0, 1] first, up to the dtype's rounding.
    torso = torso.to(dtype)
    x = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        want = torso(x.to(dtype) / 255.0)
        got = torso(x)
    assert got.dtype == dtype
    tol = {"rtol": 1e-5, "atol": 1e-4} if dtype == torch.float32 else {"atol": 0.05 * float(want.abs().max()), "rtol": 0.02}
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("torso", [ImpalaShallow((4, 84, 84), 32), ImpalaDeep((4, 84, 84), (16, 32, 32), 32)], ids=["shallow", "deep"])
def test_cnn_runs_channels_last_on_the_cpu_with_the_same_gradients(torso):
    # uint8 frames enter in channels_last (zrl's C++ relayout) and the activations stay in it;
    # features and gradients are those of the plain [N, C, H, W] path on frames scaled first.
    seen = []
    hook = torso.convs[-2 if isinstance(torso, ImpalaShallow) else 4].register_forward_hook(
        lambda mod, inp, out: seen.append(inp[0].is_contiguous(memory_format=torch.channels_last)))
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    got = torso(x)
    got.square().sum().backward()
    grads = [p.grad.clone() for p in torso.parameters()]
    torso.zero_grad()
    hook.remove()
    want = torso(x.float() / 255.0)
    want.square().sum().backward()
    assert seen == [True]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for (name, p), g in zip(torso.named_parameters(), grads):
        # Compared as a whole: the two paths round differently, and where that breaks a
        # max-pool's tie the gradient of a few elements goes to a neighbour instead.
        assert float((g - p.grad).norm()) <= 1e-2 * float(p.grad.norm()), name


def test_cnn_under_cpu_autocast_takes_bf16_frames_straight(monkeypatch):
    # Under autocast the frames are cast to bf16 in the relayout itself, not to fp32 first.
    from zrl.models import cnn

    written = []
    kernel = cnn._core.pixels_to_channels_last
    monkeypatch.setattr(cnn._core, "pixels_to_channels_last", lambda src, out: (written.append(out.dtype), kernel(src, out)))
    torso = ImpalaShallow((4, 84, 84), 32)
    x = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = torso(x)
        want = torso(x.float() / 255.0)
    assert written == [np.int16]  # bf16 bits
    torch.testing.assert_close(got.float(), want.float(), atol=0.05 * float(want.abs().max()), rtol=0.02)


@pytest.mark.parametrize("network", ["impala_shallow", "impala_deep"])
def test_actor_critic_with_a_cnn_shares_its_torso(network):
    model = build_actor_critic(ModelConfig(network=network, shared_torso=False), OBS, PONG_ACTIONS)
    assert model.shared and model.v_torso is None
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    params, value = model(obs)
    assert params.shape == (5, 6) and value.shape == (5,)
    torch.testing.assert_close(model.policy(obs), params)
    torch.testing.assert_close(model.value_only(obs), value)


def test_q_network_with_a_cnn():
    q = QNetwork(ModelConfig(network="impala_shallow"), OBS, PONG_ACTIONS)
    assert q(torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)).shape == (3, 6)


def test_cnn_on_vector_observations_is_a_clear_error():
    with pytest.raises(ValueError, match="image observations"):
        ActorCritic(ModelConfig(network="impala_shallow"), spaces.BoxSpec((4,)), spaces.DiscreteSpec(2))


def test_cnn_with_an_lstm_core_steps_and_the_q_network_refuses_one():
    model = ActorCritic(ModelConfig(network="impala_shallow", lstm_size=32), OBS, PONG_ACTIONS)
    obs = torch.zeros((2, *OBS.shape), dtype=torch.uint8)
    params, value, (h, c) = model.step(obs, model.initial_state(2))
    assert params.shape == (2, PONG_ACTIONS.n) and value.shape == (2,) and h.shape == (2, 32)
    with pytest.raises(NotImplementedError, match="LSTM"):
        QNetwork(ModelConfig(network="impala_shallow", lstm_size=32), OBS, PONG_ACTIONS)


@pytest.mark.parametrize("network", ["impala_shallow", "impala_deep"])
def test_impala_loss_trains_a_cnn_on_a_tiny_pong_batch(network):
    torch.manual_seed(0)
    T, B = 3, 2
    # fp32: the check below is that the learner's log-probabilities equal the actor's exactly.
    cfg = load_config(PONG_CONFIG, [f"model.network={network}", f"actor.num_envs={B}", "actor.env_groups=1", f"learner.batch_size={B}", f"actor.unroll_length={T}",
                                    "learner.precision=fp32"])
    algo = algorithms.get("impala")(cfg, OBS, PONG_ACTIONS)
    model = algo.build_model()
    g = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 256, (T + 1, B, 4, 84, 84), dtype=torch.uint8, generator=g)
    action = torch.randint(0, 6, (T, B), generator=g)
    with torch.no_grad():
        params = model.policy(obs[:T].reshape(T * B, 4, 84, 84)).reshape(T, B, -1)
        behaviour_logp = model.head.log_prob(params, action)
    truncated = torch.zeros(T, B, dtype=torch.bool)
    truncated[1, 0] = True  # one truncated episode, bootstrapped from its final observation
    terminated = torch.zeros(T, B, dtype=torch.bool)
    terminated[2, 1] = True
    batch = {
        "obs": obs,
        "action": action,
        "reward": torch.tensor([[1.0, 0.0], [0.0, -3.0], [2.0, 1.0]]),  # raw scores, clipped by algo.reward_clip
        "terminated": terminated,
        "truncated": truncated,
        "behaviour_logp": behaviour_logp,
        "final_index": torch.tensor([1 * B + 0]),
        "final_obs": torch.randint(0, 256, (1, 4, 84, 84), dtype=torch.uint8, generator=g),
    }
    loss, stats = algo.loss(model, batch)
    assert torch.isfinite(loss)
    torch.testing.assert_close(stats["vtrace/mean_rho"], torch.tensor(1.0))  # on-policy
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(gr is not None and torch.isfinite(gr).all() for gr in grads)
    assert model.pi_torso.convs[0].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("core", ["feedforward", "lstm"])
def test_bf16_learner_gives_the_fp32_loss_and_gradients_up_to_rounding(core):
    T, B = 3, 2
    over = [f"actor.num_envs={B}", "actor.env_groups=1", f"learner.batch_size={B}", f"actor.unroll_length={T}"] + (["model.lstm_size=32"] if core == "lstm" else [])
    g = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 256, (T + 1, B, 4, 84, 84), dtype=torch.uint8, generator=g)
    action = torch.randint(0, 6, (T, B), generator=g)
    results = {}
    for precision in ("fp32", "bf16"):
        cfg = load_config(PONG_CONFIG, over + [f"learner.precision={precision}"])
        algo = algorithms.get("impala")(cfg, OBS, PONG_ACTIONS)
        torch.manual_seed(0)
        model = algo.build_model()
        batch = {
            "obs": obs,
            "action": action,
            "reward": torch.tensor([[1.0, 0.0], [0.0, -1.0], [1.0, 1.0]]),
            "terminated": torch.zeros(T, B, dtype=torch.bool),
            "truncated": torch.zeros(T, B, dtype=torch.bool),
            "behaviour_logp": torch.full((T, B), -1.7),
            "final_index": torch.zeros(0, dtype=torch.int64),
            "final_obs": torch.zeros((0, 4, 84, 84), dtype=torch.uint8),
        }
        if core == "lstm":
            batch["core_h0"] = batch["core_c0"] = torch.zeros(B, 32)
        loss, _ = algo.loss(model, batch)
        loss.backward()
        grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        assert loss.dtype == torch.float32 and grad.dtype == torch.float32  # only the forward pass is bf16
        results[precision] = (loss.detach(), grad)
    (l32, g32), (l16, g16) = results["fp32"], results["bf16"]
    torch.testing.assert_close(l16, l32, rtol=0.05, atol=0.02)
    assert torch.nn.functional.cosine_similarity(g16, g32, dim=0) > 0.95


def test_precision_must_be_fp32_or_bf16():
    from zrl.config import ConfigError

    with pytest.raises(ConfigError, match="learner.precision"):
        load_config(PONG_CONFIG, ["learner.precision=fp16"])


def test_auto_precision_is_bf16_only_where_the_hardware_has_it():
    from zrl.algorithms.base import resolve_precision

    cpu = torch.device("cpu")
    assert resolve_precision("fp32", cpu) == "fp32" and resolve_precision("bf16", cpu) == "bf16"
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), [])
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    assert resolve_precision("auto", cpu) == ("bf16" if native else "fp32")
