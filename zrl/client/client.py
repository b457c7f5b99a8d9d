"""Python client for the agent server (`zrl serve`), RELAAX-style.

    client = Client("tcp://127.0.0.1:5557", {"type": "box", "shape": [4], "dtype": "float32"},
                    {"type": "discrete", "n": 2})
    action = client.init(obs)                 # starts an episode
    action = client.send(reward, obs)         # one step inside it
    total = client.reset(reward)              # ends it (terminated); returns its total reward
    total = client.reset(reward, truncated=True, final_obs=obs)   # cut by a time limit
    client.metrics().scalar("score", 42.0)    # reaches the learner's TensorBoard as custom/score
    client.disconnect()

Every call has a timeout. A lost server raises `ClientTimeout`; the next call
opens a fresh socket and says hello again (an episode in progress is lost
then, so start again with `init`). A client is not thread-safe: one per thread.
Nothing is pickled: messages are zrl wire frames (docs/PROTOCOL.md).
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import zmq

from zrl import spaces, transport, wire
from zrl.client.errors import ClientError, ClientTimeout, ServerError, UsageError

__all__ = ["Client", "Metrics"]

FIRST, LAST, TRUNCATED = 1, 2, 4


def _spec(x, per_element_bounds: bool = False) -> spaces.Spec:
    if isinstance(x, (spaces.BoxSpec, spaces.DiscreteSpec)):
        return x
    if isinstance(x, dict):
        d = dict(x)
        if d.get("type") == "box":
            d.setdefault("dtype", "float32")
        return spaces.from_json(d)
    return spaces.from_gym(x, per_element_bounds)  # a gymnasium space


class Metrics:
    def __init__(self, client: "Client"):
        self._client = client

    def scalar(self, name: str, value: float) -> None:
        """Records a scalar; it reaches the learner's TensorBoard as custom/<name>. No reply is awaited."""
        self._client._send_stats(name, float(value))


class Client:
    def __init__(self, endpoint: str, obs_spec, action_spec, timeout: float = 10.0, name: str = "python", ctx: zmq.Context | None = None,
                 server_public_key: str | None = None, client_secret_key: str | None = None):
        """`server_public_key` / `client_secret_key`: key files (`zrl keys generate`) when the server uses CURVE."""
        problem = transport.endpoint_problem(endpoint, binding=False)
        if problem:
            raise UsageError(problem)
        self.endpoint = endpoint
        if (server_public_key is None) != (client_secret_key is None):
            raise UsageError("CURVE needs both server_public_key and client_secret_key")
        self._curve = transport.Curve(server_public_key=server_public_key, client_secret_key=client_secret_key) if server_public_key else None
        self.obs_spec = _spec(obs_spec)
        self.action_spec = _spec(action_spec, per_element_bounds=True)
        if not isinstance(self.obs_spec, spaces.BoxSpec) or self.obs_spec.dtype not in ("float32", "uint8"):
            raise UsageError(f"observations must be a float32 or uint8 box, got {self.obs_spec.to_json()}")
        self.timeout = float(timeout)
        self.name = name
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self._sock: zmq.Socket | None = None
        self._seq = 0
        self._in_episode = False
        self._total = 0.0
        self.policy_version = 0
        self.client_id: int | None = None
        self._metrics = Metrics(self)
        self._obs_dtype = np.dtype(self.obs_spec.dtype)
        self._obs_shape = tuple(self.obs_spec.shape)

    # -- connection
    def _connect(self) -> None:
        self._close_socket()
        self._sock = transport.socket(self.ctx, zmq.DEALER)
        if self._curve is not None:
            self._curve.client(self._sock)
        self._sock.connect(self.endpoint)
        meta = {"role": "client", "protocol": wire.PROTOCOL_VERSION, "name": self.name, "obs_space": self.obs_spec.to_json(), "action_space": self.action_spec.to_json()}
        reply = self._request(wire.encode(wire.Kind.HELLO, meta=meta, seq=self._next_seq()), expect=wire.Kind.HELLO_REPLY)
        info = reply.json()
        self.client_id = info.get("client_id")
        self.policy_version = reply.policy_version

    def _close_socket(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _lost(self, why: str) -> ClientTimeout:
        self._close_socket()  # the next call reconnects and says hello again
        self._in_episode = False
        return ClientTimeout(f"{why} (agent server at {self.endpoint}): closed the socket, the next call says hello again")

    def _left_ms(self, deadline: float) -> int:
        return max(0, math.ceil((deadline - time.monotonic()) * 1000))

    def _send(self, frame, deadline: float, what: str) -> None:
        """Queues a frame without blocking; while the queue is full (the server has been
        unreachable a while), waits for room up to the deadline, then raises ClientTimeout."""
        while True:
            try:
                self._sock.send(frame, zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                pass
            if not self._sock.poll(self._left_ms(deadline), zmq.POLLOUT) and time.monotonic() >= deadline:
                raise self._lost(f"could not queue {what} within {self.timeout:g}s")

    def _request(self, frame, expect: wire.Kind) -> wire.Message:
        """Sends one request and waits for the reply with its seq, up to the timeout."""
        header = wire.HEADER.unpack_from(frame, 0)
        kind, seq = wire.Kind(header[2]), header[5]
        deadline = time.monotonic() + self.timeout
        self._send(frame, deadline, kind.name)
        while True:
            if not self._sock.poll(self._left_ms(deadline), zmq.POLLIN):
                raise self._lost(f"no reply to {kind.name} within {self.timeout:g}s")
            try:
                msg = wire.decode(self._sock.recv(copy=False))
            except wire.WireError as e:
                raise ClientError(f"malformed reply from {self.endpoint}: {e}") from None
            if msg.kind == wire.Kind.ERROR and msg.seq in (seq, 0):
                # seq 0: the server could not even read our request. Either way the
                # session may be gone (e.g. dropped as idle): the next call says hello again.
                self._close_socket()
                self._in_episode = False
                raise ServerError(f"agent server at {self.endpoint}: {msg.text()}")
            if msg.seq != seq:
                continue  # a late reply to an earlier request
            if msg.kind != expect:
                raise ClientError(f"expected {expect.name} from {self.endpoint}, got {msg.kind.name}")
            return msg

    def _act(self, flags: int, reward: float, obs) -> wire.Message:
        with np.errstate(over="ignore"):  # 1e300 is inf as the float32 that is sent: refused
            r = np.float32(reward)
        if not np.isfinite(r):
            raise UsageError(f"the reward must be finite as a float32, got {reward}")
        if self._sock is None:
            self._connect()
        arrays: dict[str, Any] = {}
        if obs is not None:
            arrays["obs"] = obs  # (checked by the caller: _check_obs)
        arrays["reward"] = r
        arrays["flags"] = np.uint8(flags)
        return self._request(wire.encode(wire.Kind.ACT, arrays, seq=self._next_seq()), expect=wire.Kind.ACTION)

    def _check_obs(self, obs) -> np.ndarray:
        a = np.asarray(obs)
        if a.dtype != self._obs_dtype:
            if a.dtype.kind == "f" and self._obs_dtype == np.float32:
                with np.errstate(over="ignore"):  # 1e300 becomes inf, refused below
                    a = a.astype(np.float32)
            else:
                raise UsageError(f"observation dtype {a.dtype}, the spec says {self._obs_dtype}")
        if a.shape != self._obs_shape:
            raise UsageError(f"observation shape {a.shape}, the spec says {self._obs_shape}")
        if a.dtype.kind == "f" and not np.isfinite(a).all():  # after the cast: 1e300 is inf in float32
            raise UsageError("the observation has a NaN or infinite value")
        return a

    def _action(self, msg: wire.Message):
        a = msg.arrays.get("action")
        if a is None:
            raise ClientError("reply carries no action")
        self.policy_version = msg.policy_version
        return int(a) if isinstance(self.action_spec, spaces.DiscreteSpec) else np.array(a, np.float32)

    # -- the API
    def init(self, obs):
        """Starts an episode at `obs`; returns the first action."""
        msg = self._act(FIRST, 0.0, self._check_obs(obs))
        self._in_episode = True
        self._total = 0.0
        return self._action(msg)

    def send(self, reward: float, obs):
        """Reports the reward of the last action and the new observation; returns the next action."""
        if not self._in_episode:
            raise UsageError("send() outside an episode: call init(obs) first (a timeout also ends the episode)")
        msg = self._act(0, reward, self._check_obs(obs))
        self._total += float(reward)
        return self._action(msg)

    def reset(self, reward: float, truncated: bool = False, final_obs=None) -> float:
        """Ends the episode (terminated, or truncated with its final observation); returns its total reward."""
        if not self._in_episode:
            raise UsageError("reset() outside an episode: call init(obs) first (a timeout also ends the episode)")
        if truncated and final_obs is None:
            raise UsageError("reset(truncated=True) needs final_obs, the observation the episode was cut at")
        self._act(LAST | (TRUNCATED if truncated else 0), reward, self._check_obs(final_obs) if truncated else None)
        self._in_episode = False
        self._total += float(reward)
        return self._total

    def metrics(self) -> Metrics:
        return self._metrics

    def _send_stats(self, name: str, value: float) -> None:
        if not math.isfinite(value):
            raise UsageError(f"metrics().scalar({name!r}): the value must be finite, got {value}")
        if self._sock is None:
            self._connect()
        frame = wire.encode(wire.Kind.STATS, {name: np.array([value], np.float64)}, seq=self._next_seq())
        self._send(frame, time.monotonic() + self.timeout, "metrics().scalar()'s STATS")

    def disconnect(self) -> None:
        """Says goodbye and closes the socket (and the context, if the client made it)."""
        if self._sock is not None:
            try:
                self._sock.send(wire.encode(wire.Kind.BYE, seq=self._next_seq()), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        self._close_socket()
        self._in_episode = False
        if self._own_ctx and not self.ctx.closed:
            self.ctx.term()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.disconnect()
