"""The agent server's routine requests in C++: `FastPath` drives `zrl._core.ServeLoop`
(csrc/server/serve_loop.h).

A routine request is an ACT in the middle of an episode from a session Python has
handed over ("armed"): the loop checks it, batches it through the policy's C++ twin
(`native_mlp`: the same network, read from the model's current weights), draws the
action, writes the step into the session's chunk (its recorder's own arrays, so the
learner gets the frame Python would have written, behaviour log-probabilities
included) and replies, with the GIL released. Everything else comes back to the
server's Python path as received; the session's counters come back first (`reclaim`).

It applies where the policy is an MLP actor-critic without an LSTM core in float32
and the algorithm's recorder exposes its step rows (IMPALA, APPO): `FastPath.create`
says why not otherwise, and the server then serves everything in Python.
"""
from __future__ import annotations

import numpy as np
import torch
import zmq

from zrl import _core, spaces, wire
from zrl.algorithms.base import Policy
from zrl.models import ActorCritic
from zrl.models.heads import CategoricalHead, GaussianHead
from zrl.protocol.native import backend_path, native

ACT_ARRAYS = ("obs", "reward", "flags")


class Unsupported(Exception):
    """Why a server cannot serve routine requests in C++ (it serves them in Python)."""


def native_mlp(model: torch.nn.Module) -> tuple[_core.MlpPolicy, np.ndarray | None]:
    """The C++ twin of `model`'s policy with its current weights, and a Gaussian head's
    log std (None for a categorical head); Unsupported where there is none."""
    if not isinstance(model, ActorCritic) or model.cnn or model.recurrent:
        raise Unsupported("the policy is not an MLP actor-critic without an LSTM core")
    if model.dtype != torch.float32:
        raise Unsupported(f"the policy runs in {model.dtype}, not float32")
    layers, activation = [], None
    for module in model.pi_torso:
        if isinstance(module, torch.nn.Linear):
            layers.append(_linear(module))
        elif isinstance(module, (torch.nn.Tanh, torch.nn.ReLU)):
            name = "tanh" if isinstance(module, torch.nn.Tanh) else "relu"
            if activation not in (None, name):
                raise Unsupported("the torso mixes activations")
            activation = name
        else:
            raise Unsupported(f"the torso holds a {type(module).__name__}")
    head = model.head
    if isinstance(head, CategoricalHead):
        out, log_std = _linear(head.linear), None
    elif isinstance(head, GaussianHead):
        out, log_std = _linear(head.mean), head.log_std.detach().float().numpy().copy()
    else:
        raise Unsupported(f"no C++ twin of a {type(head).__name__}")
    norm = None
    if model.obs_norm is not None:
        n = model.obs_norm
        norm = (n.mean.detach().float().numpy(), n.var.detach().float().numpy(), float(n.clip), float(n.eps))
    policy = _core.MlpPolicy(model.obs_dim, layers, activation or "tanh", out, norm)
    return policy, log_std


def _linear(lin: torch.nn.Linear) -> tuple[np.ndarray, np.ndarray]:
    return lin.weight.detach().float().numpy().copy(), lin.bias.detach().float().numpy().copy()


class FastPath:
    """One server's C++ loop: its policy twin, the one ACT layout it serves, and the
    sessions handed to it (by client_id, until they close)."""

    def __init__(self, loop: _core.ServeLoop, router: zmq.Socket, model: ActorCritic, obs_spec: spaces.BoxSpec, action_spec: spaces.Spec):
        self.loop = loop
        self.router = router
        self.model = model
        self.discrete = isinstance(action_spec, spaces.DiscreteSpec)
        self._act_layout(obs_spec)
        self.answered = 0  # requests the loop answered itself
        self.held: dict[int, object] = {}  # the sessions ever armed, by client_id, until they close
        self.twin: _core.MlpPolicy | None = None
        self.log_std: np.ndarray | None = None
        self._reply_template(action_spec)

    @classmethod
    def create(cls, router: zmq.Socket, model, recorder, obs_spec: spaces.Spec, action_spec: spaces.Spec,
               *, max_bytes: int, seed: int) -> "FastPath":
        """The loop for this server; Unsupported (with the reason) where it cannot serve."""
        if not isinstance(obs_spec, spaces.BoxSpec) or np.dtype(obs_spec.dtype) != np.float32:
            raise Unsupported("observations are not float32")
        native_mlp(model)  # (raises Unsupported for a policy without a twin)
        if recorder.step_rows() is None:
            raise Unsupported("the algorithm's recorder does not expose its step rows")
        if native() is None:
            raise Unsupported("the native ZeroMQ path is off")
        obs_dim = int(np.prod(obs_spec.shape))
        action_dim = 0 if isinstance(action_spec, spaces.DiscreteSpec) else int(np.prod(action_spec.shape))
        loop = _core.ServeLoop(backend_path(), *zmq.zmq_version_info(), router.underlying, obs_dim, action_dim, max_bytes, seed)
        return cls(loop, router, model, obs_spec, action_spec)

    def _reply_template(self, action_spec: spaces.Spec) -> None:
        action = np.zeros((), np.int64) if self.discrete else np.zeros(tuple(action_spec.shape), np.float32)
        frame = bytes(wire.encode(wire.Kind.ACTION, {"action": action}))
        info = wire.decode(frame).infos[0]
        self.loop.set_action_template(frame, info.offset)

    def set_weights(self, version: int) -> None:
        """The model's current weights (and `version`) for the replies from now on."""
        self.twin, self.log_std = native_mlp(self.model)
        self.loop.set_policy(self.twin, self.log_std, version)

    def _act_layout(self, obs_spec: spaces.BoxSpec) -> None:
        """The one layout served in C++: a routine ACT as the wire's encoders write it (Python's
        and libzrl_client's alike); a frame laid out otherwise takes the Python path."""
        obs = np.zeros(tuple(obs_spec.shape), np.float32)
        frame = bytes(wire.encode(wire.Kind.ACT, {"obs": obs, "reward": np.float32(0), "flags": np.uint8(0)}))
        msg = wire.decode(frame)
        infos = {i.name: i for i in msg.infos}
        block = frame[wire.HEADER_SIZE : wire.HEADER_SIZE + wire.DESCRIPTOR_SIZE * len(msg.infos)]
        first = min(i.offset for i in msg.infos)
        end = max(i.offset + i.nbytes for i in msg.infos)
        self.loop.add_act_layout(block, first, end, infos["obs"].offset, infos["reward"].offset, infos["flags"].offset)

    def arm(self, session) -> None:
        """Hands `session` to the loop: its next routine ACT is served in C++."""
        rows = session.recorder.step_rows()
        if rows is None or session.closed is not None or not session.in_episode or session.state is not None:
            return
        self.loop.arm(session.client_id, session.identity, rows, session.recorder.t, session.steps,
                      session.episode_length, session.episode_return, session.last_seen)
        self.held[session.client_id] = session

    def reclaim(self, session) -> bool:
        """Takes `session` back from the loop, with what it did meanwhile; whether the loop held it."""
        got = self.loop.take(session.client_id)
        if got is None:
            return False
        t, session.steps, session.episode_length, session.episode_return, last_seen = got
        session.recorder.t = t
        session.last_seen = max(session.last_seen, last_seen)
        return True

    def forget(self, session) -> None:
        self.loop.forget(session.client_id)
        self.held.pop(session.client_id, None)

    def complete(self, client_id: int, action, behaviour_logp: float) -> tuple[object, list] | None:
        """A chunk the loop filled: the session takes it back, its recorder sends the chunk
        (the frames returned) and records `action`, the first of the next chunk; None if
        the session has gone meanwhile."""
        session = self.held.get(client_id)
        if session is None or not self.reclaim(session) or session.recorder.t != session.recorder.T:
            return None  # (gone, or not the loop's: no chunk of it is ready)
        recorder = session.recorder
        frames = recorder.end_chunk()
        actions = np.array([action], np.int64) if self.discrete else np.asarray(action, np.float32)[None]
        recorder.record(actions, {"behaviour_logp": np.array([behaviour_logp], np.float32)})
        return session, frames

    def refresh_last_seen(self, sessions) -> None:
        """Brings the sessions the loop holds up to date for the timeouts."""
        for s in sessions:
            seen = self.loop.last_seen(s.client_id)
            if seen > s.last_seen:
                s.last_seen = seen

    def serve(self, wait_ms: int, max_batch: int, budget_ms: float):
        """(handed back [[identity, frame, ...]], chunks completed [(client_id, action,
        behaviour_logp)], answered, batches, reply_unread)."""
        if self.router.closed:  # (its address would dangle)
            raise zmq.ZMQError(zmq.ENOTSOCK)
        result = self.loop.serve(wait_ms, max_batch, budget_ms)
        self.answered += result[2]
        return result


class TwinPolicy(Policy):
    """The server's Python path acting through the C++ twin, as ImpalaPolicy acts (its
    draws from torch's generator, its behaviour log-probabilities), without a torch call
    per request: episode starts and everything else the loop hands back."""

    def __init__(self, fast: FastPath):
        self.fast = fast

    def act(self, obs: np.ndarray, state=None):
        params = self.fast.twin.forward(obs.reshape(len(obs), -1))
        if self.fast.log_std is None:
            actions, logp = _core.sample_categorical(params, torch.rand(len(obs), dtype=torch.float64).numpy())
        else:
            normals = torch.randn(params.shape, dtype=torch.float64).numpy()
            actions, logp = _core.sample_gaussian(params, self.fast.log_std, normals)
        return actions, {"behaviour_logp": logp}
