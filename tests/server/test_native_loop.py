"""The agent server's C++ request loop (zrl.server.fast_path, csrc/server/serve_loop.h):
its policy twin computes what torch computes, its draws and behaviour log-probabilities
are the learner's, and the chunks it writes are those the Python path writes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from zrl import _core, spaces, wire
from zrl.models import build_actor_critic
from zrl.server.fast_path import native_mlp
from helpers import CapturedChunks, small_config, wait_for
from test_server import raw_client, raw_hello
from test_server_limits import ask

FIRST, LAST, TRUNCATED = 1, 2, 4


def twin_and_model(model_overrides, obs_dim, action_spec, seed=0):
    """A model with random (not initial) weights and normaliser statistics, and its C++ twin."""
    torch.manual_seed(seed)
    cfg = small_config(*model_overrides).model
    model = build_actor_critic(cfg, spaces.BoxSpec((obs_dim,), "float32"), action_spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("obs_norm.var"):
                p.uniform_(0.5, 4.0)
            elif name.startswith("obs_norm.count"):
                p.fill_(10.0)
            else:
                p.normal_(0.0, 0.5)
    policy, log_std = native_mlp(model)
    return model, policy, log_std


MODELS = [
    (["model.hidden_sizes=[64, 64]", "model.activation=tanh"], 4, spaces.DiscreteSpec(2)),
    (["model.hidden_sizes=[32]", "model.activation=relu"], 7, spaces.DiscreteSpec(5)),
    (["model.hidden_sizes=[64, 64]", "model.normalize_obs=true"], 3, spaces.BoxSpec((2,), "float32", -1.0, 1.0)),
    (["model.hidden_sizes=[]"], 5, spaces.DiscreteSpec(3)),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("overrides,obs_dim,action_spec", MODELS)
def test_the_cpp_twin_computes_the_policy_parameters_torch_computes(overrides, obs_dim, action_spec):
    model, policy, _ = twin_and_model(overrides, obs_dim, action_spec)
    obs = np.random.default_rng(1).normal(0, 3, (37, obs_dim)).astype(np.float32)
    want = model.policy_float(torch.from_numpy(obs)).detach().numpy()
    got = policy.forward(obs)
    n_out = want.shape[1] if isinstance(action_spec, spaces.DiscreteSpec) else action_spec.shape[0]
    np.testing.assert_allclose(got, want[:, :n_out], rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(30)
def test_categorical_draws_are_torchs_for_the_same_uniforms_and_logp_is_the_learners():
    model, policy, _ = twin_and_model(MODELS[1][0], 7, spaces.DiscreteSpec(5))
    obs = np.random.default_rng(2).normal(0, 2, (2000, 7)).astype(np.float32)
    u = np.random.default_rng(3).random(2000)
    logits_torch = model.policy_float(torch.from_numpy(obs)).detach()
    a_cpp, logp_cpp = _core.sample_categorical(policy.forward(obs), u)
    a_torch, _ = _core.sample_categorical(logits_torch.numpy(), u)
    # The logits agree to rounding, so a draw can differ only where u lies within rounding of a
    # boundary of the cumulative probabilities.
    cdf = torch.softmax(logits_torch.double(), -1).cumsum(-1).numpy()
    near = (np.abs(cdf - u[:, None]) < 1e-5).any(1)
    assert (a_cpp[~near] == a_torch[~near]).all()
    assert near.sum() < 10
    learner_logp = model.head.log_prob(logits_torch, torch.from_numpy(a_cpp)).numpy()
    np.testing.assert_allclose(logp_cpp, learner_logp, atol=1e-5)


@pytest.mark.timeout(30)
def test_gaussian_draws_are_torchs_for_the_same_normals_and_logp_is_the_learners():
    model, policy, log_std = twin_and_model(MODELS[2][0], 3, spaces.BoxSpec((2,), "float32", -1.0, 1.0))
    obs = np.random.default_rng(4).normal(0, 2, (500, 3)).astype(np.float32)
    normals = np.random.default_rng(5).normal(size=(500, 2))
    actions, logp = _core.sample_gaussian(policy.forward(obs), log_std, normals)
    params = model.policy_float(torch.from_numpy(obs)).detach()
    mean, std = params[:, :2].numpy(), np.exp(log_std)
    np.testing.assert_allclose(actions, mean + std * normals.astype(np.float32), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logp, model.head.log_prob(params, torch.from_numpy(actions)).numpy(), atol=1e-4)


# ---------------------------------------------------------------- the loop end to end


def serve_box_config(*overrides):
    return small_config("actor.num_envs=1", "learner.batch_size=4", "actor.unroll_length=5",
                        "server.observation_space={type: box, shape: [4], dtype: float32}", *overrides)


def play(server, ctx, episodes, action_space):
    """Plays scripted episodes (lengths, the last truncated) through `server` with one raw
    client, serving one iteration at a time; returns the trajectories it sent."""
    captured = server.sender.link = CapturedChunks()
    serve = lambda: server.serve_once(10)  # noqa: E731
    obs_space = {"type": "box", "shape": [4], "dtype": "float32", "low": None, "high": None}
    s = raw_client(ctx, server)
    rng = np.random.default_rng(7)
    seq = 1
    try:
        assert ask(s, raw_hello(obs_space, action_space), serve).kind == wire.Kind.HELLO_REPLY
        for e, length in enumerate(episodes):
            for t in range(length + 1):
                seq += 1
                obs = rng.normal(0, 1, 4).astype(np.float32)
                flags = FIRST if t == 0 else LAST | (TRUNCATED if e == len(episodes) - 1 else 0) if t == length else 0
                arrays = {"obs": obs, "reward": np.float32(rng.normal()), "flags": np.uint8(flags)}
                if flags & LAST and not flags & TRUNCATED:
                    del arrays["obs"]
                reply = ask(s, wire.encode(wire.Kind.ACT, arrays, seq=seq), serve)
                assert reply.kind == wire.Kind.ACTION, reply.text() if reply.kind == wire.Kind.ERROR else reply.kind
        seq += 1
        ask(s, wire.encode(wire.Kind.ACT, {"obs": np.zeros(4, np.float32), "reward": np.float32(0), "flags": np.uint8(FIRST)}, seq=seq), serve)
    finally:
        s.close()
    return captured.messages()


def check_behaviour_logp(server, chunks):
    """Every recorded behaviour log-probability is the policy's (the learner's) for the recorded action."""
    for c in chunks:
        a = c.arrays
        params = server.model.policy_float(torch.from_numpy(a["obs"][:-1, 0].copy())).detach()
        want = server.model.head.log_prob(params, torch.from_numpy(a["action"][:, 0].copy())).numpy()
        np.testing.assert_allclose(a["behaviour_logp"][:, 0], want, atol=1e-4)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("action_space", [{"type": "discrete", "n": 3}, {"type": "box", "shape": [2], "dtype": "float32", "low": -2.0, "high": 2.0}])
def test_the_cpp_loop_records_the_chunks_the_python_path_records(ctx, endpoint, action_space):
    """Both loops over the same scripted episodes (steps inside chunks, chunk ends, episode ends,
    a truncation): the same observations, rewards and flags, the same final observations, and
    behaviour log-probabilities that are the policy's for the actions each drew."""
    from zrl.server import AgentServer

    space = "{type: discrete, n: 3}" if action_space["type"] == "discrete" else "{type: box, shape: [2], dtype: float32, low: -2.0, high: 2.0}"
    chunks, answered = {}, {}
    for native in (True, False):
        cfg = serve_box_config(f"server.action_space={space}", f"server.native_loop={str(native).lower()}")
        server = AgentServer(cfg, f"{endpoint}-{native}", ctx=ctx, console=False, seed=3)
        try:
            assert (server.fast is not None) == native, server.request_loop
            chunks[native] = play(server, ctx, [12, 3, 9], action_space)
            check_behaviour_logp(server, chunks[native])
            answered[native] = server.fast.answered if native else 0
            assert server.stats.steps == 12 + 3 + 9
        finally:
            server.close()
    assert answered[True] >= 12, "most routine steps should be served in C++"
    assert len(chunks[True]) == len(chunks[False]) == (12 + 3 + 9) // 5
    for fast, slow in zip(chunks[True], chunks[False]):
        for name in ("obs", "reward", "terminated", "truncated", "final_index", "final_obs"):
            np.testing.assert_array_equal(fast.arrays[name], slow.arrays[name], err_msg=name)


@pytest.mark.timeout(30)
def test_a_policy_without_a_cpp_twin_is_served_in_python(ctx, endpoint):
    from zrl.server import AgentServer

    cfg = serve_box_config("server.action_space={type: discrete, n: 2}", "model.lstm_size=16")
    server = AgentServer(cfg, f"{endpoint}-lstm", ctx=ctx, console=False)
    try:
        assert server.fast is None and "LSTM" in server.request_loop
    finally:
        server.close()


def started_session(server, ctx, dim):
    """A raw client whose session the C++ loop holds (a FIRST and two routine steps answered); returns (socket, next seq)."""
    serve = lambda: server.serve_once(10)  # noqa: E731
    s = raw_client(ctx, server)
    obs_space = {"type": "box", "shape": [dim], "dtype": "float32", "low": None, "high": None}
    assert ask(s, raw_hello(obs_space, {"type": "discrete", "n": 2}), serve).kind == wire.Kind.HELLO_REPLY
    for seq, flags in ((2, FIRST), (3, 0), (4, 0)):
        reply = ask(s, wire.encode(wire.Kind.ACT, {"obs": np.ones(dim, np.float32), "reward": np.float32(1), "flags": np.uint8(flags)}, seq=seq), serve)
        assert reply.kind == wire.Kind.ACTION
    assert server.fast.loop.armed(next(iter(server.sessions.values())).client_id)
    return s, 5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("obs,reason,text", [
    (np.array([np.nan] + [0] * 63, np.float32), "bad_value", "NaN or an infinity"),
    (np.full(64, 3e38, np.float32), "bad_value", "cannot act on this observation"),
])
def test_a_bad_observation_of_a_session_the_loop_holds_is_refused_as_python_refuses_it(ctx, endpoint, obs, reason, text):
    """A NaN fails the loop's gate; finite observations whose logits overflow give no draw.
    Either way the request goes back to the Python path, which refuses it with its reason."""
    from zrl.server import AgentServer

    # ReLU, not tanh: huge observations overflow the hidden layer, and the logits are no numbers.
    cfg = serve_box_config("server.action_space={type: discrete, n: 2}", "model.hidden_sizes=[64]", "model.activation=relu",
                           "server.observation_space={type: box, shape: [64], dtype: float32}")
    server = AgentServer(cfg, f"{endpoint}-bad", ctx=ctx, console=False)
    s = None
    try:
        s, seq = started_session(server, ctx, 64)
        answered = server.fast.answered
        reply = ask(s, wire.encode(wire.Kind.ACT, {"obs": obs, "reward": np.float32(0), "flags": np.uint8(0)}, seq=seq),
                    lambda: server.serve_once(10))
        assert reply.kind == wire.Kind.ERROR and text in reply.text(), reply.kind
        assert server.stats.rejected[reason] == 1
        assert server.fast.answered == answered
    finally:
        if s is not None:
            s.close()
        server.close()


@pytest.mark.timeout(60)
def test_two_acts_of_a_session_the_loop_holds_in_one_burst_end_it_as_pipelined(ctx, endpoint):
    from zrl.server import AgentServer

    cfg = serve_box_config("server.action_space={type: discrete, n: 2}")
    server = AgentServer(cfg, f"{endpoint}-pipe", ctx=ctx, console=False)
    s = None
    try:
        s, seq = started_session(server, ctx, 4)
        steps = server.stats.steps
        for k in range(2):  # the second before the reply to the first
            s.send(wire.encode(wire.Kind.ACT, {"obs": np.ones(4, np.float32), "reward": np.float32(1), "flags": np.uint8(0)}, seq=seq + k))
        wait_for(lambda: (server.serve_once(10), s.poll(0))[1], 10, "the reply")
        reply = wire.decode(s.recv())
        assert reply.kind == wire.Kind.ERROR and reply.text().startswith("pipelined"), reply.kind
        assert server.stats.rejected["pipelined"] == 1 and len(server.sessions) == 0
        assert server.stats.steps == steps + 1  # (the first was taken as a step before the second showed it was not waited for)
    finally:
        if s is not None:
            s.close()
        server.close()


class RefusingLink(CapturedChunks):
    """A learner link whose queue refuses every `every`-th message: the chunk comes back to the
    server as Pusher returns a refused one (its frame, still the recorder's buffer) and waits in
    the backlog, which the next serve_once offers again."""

    def __init__(self, every: int):
        super().__init__()
        self.every, self.offered, self.timeout_s = every, 0, 1e9

    def _refused(self) -> bool:
        self.offered += 1
        return self.offered % self.every == 0

    def send(self, msg, sender_id, seq, policy_version, rows=None, wait=False):
        frame = msg.finish(sender_id=sender_id, seq=seq, policy_version=policy_version, rows=rows)
        if self._refused():
            return frame
        self.frames.append(bytes(frame))
        return None

    def try_send(self, frame) -> bool:
        if self._refused():
            return False
        self.frames.append(bytes(frame))
        return True

    def poll_weights(self) -> None:
        pass

    def finish(self) -> None:
        pass


@pytest.mark.timeout(60)
@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("every", [2, 3])
def test_chunks_refused_under_back_pressure_go_out_later_whole(ctx, endpoint, native, every):
    """Each chunk the learner's queue refuses goes out later as it was: the observations the
    client sent in order, the actions it was answered with, and their behaviour log-probabilities."""
    from zrl.server import AgentServer

    cfg = serve_box_config("server.action_space={type: discrete, n: 2}", f"server.native_loop={str(native).lower()}")
    server = AgentServer(cfg, f"{endpoint}-bp", ctx=ctx, console=False, seed=3)
    link = server.sender.link = server.link = RefusingLink(every)
    serve = lambda: server.serve_once(10)  # noqa: E731
    s = raw_client(ctx, server)
    rng = np.random.default_rng(0)
    sent, answered = [], []
    try:
        obs_space = {"type": "box", "shape": [4], "dtype": "float32", "low": None, "high": None}
        assert ask(s, raw_hello(obs_space, {"type": "discrete", "n": 2}), serve).kind == wire.Kind.HELLO_REPLY
        for t in range(201):  # (the reward of ACT t is t: it names the step)
            sent.append(rng.normal(0, 1, 4).astype(np.float32))
            act = {"obs": sent[-1], "reward": np.float32(t), "flags": np.uint8(FIRST if t == 0 else 0)}
            answered.append(int(ask(s, wire.encode(wire.Kind.ACT, act, seq=t + 2), serve).arrays["action"]))
        wait_for(lambda: (server.serve_once(1), not server.backlog)[1], 10, "the backlog sent")
        chunks = link.messages()
    finally:
        s.close()
        server.close()
    assert len(chunks) == 200 // 5 and server.stats.dropped_messages == 0
    assert link.offered - len(link.frames) >= len(chunks) // every  # (refused, kept in the backlog, offered again)
    steps = np.concatenate([c.arrays["reward"][:, 0] for c in chunks]).astype(int)
    np.testing.assert_array_equal(np.sort(steps), np.arange(1, 201))  # each step once
    for c in chunks:
        a = c.arrays
        for i, t in enumerate(a["reward"][:, 0].astype(int)):
            np.testing.assert_array_equal(a["obs"][i + 1, 0], sent[t])
            np.testing.assert_array_equal(a["obs"][i, 0], sent[t - 1])
            assert a["action"][i, 0] == answered[t - 1]
    check_behaviour_logp(server, chunks)
