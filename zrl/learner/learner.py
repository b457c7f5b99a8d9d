"""The learner process: receive, batch, train, publish weights, checkpoint.

Sockets (all bound here; actors are only told the control endpoint):
  - control ROUTER (`bind`): hellos in, hello-replies (endpoints, agreed specs,
    current weights) or errors out;
  - trajectory PULL: trajectory chunks and stats from actors / agent servers;
  - weights PUB: version-tagged flat weights, and SHUTDOWN at the end.

A receiver thread owns the control and trajectory sockets. It decodes and
checks every message (wire.decode, then the algorithm's schema); a bad one is
counted by reason, logged and dropped, and never reaches training. Good
trajectories go to a bounded queue (stream algorithms) or straight into
replay (replay algorithms). When the queue is full the receiver stops reading
the PULL socket, so ZeroMQ's high-water marks push back on the actors while
hellos are still answered. The training thread (the caller of `run`) takes
batches, steps the optimiser, publishes weights every N updates, writes
checkpoints and metrics, and decides when to stop.

The model is built from the specs of the first hello, or from the checkpoint
when resuming, so the learner never builds an environment.
"""
from __future__ import annotations

import collections
import contextlib
import json
import logging
import math
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
import zmq

from zrl import checkpoint, spaces, transport, wire
from zrl.config import Config
from zrl.learner import algorithms
from zrl.learner.algorithms.base import RejectedChunks, resolve_precision
from zrl.learner.prefetch import Prefetcher
from zrl.metrics import MetricsWriter, Rate
from zrl.models import flatten_parameters

log = logging.getLogger("zrl.learner")

STATS_MAX_VALUES = 4096  # per array in one stats message
STATS_MAX_CUSTOM = 64  # distinct custom scalar names accepted (TensorBoard tags are not unbounded)
DATA_KINDS = frozenset({int(wire.Kind.TRAJECTORY), int(wire.Kind.STATS)})  # what actors send on the PULL socket
# The receiver waits for data inside the drain (a blocking receive, no poll) and looks at
# the control socket (hellos) at least this often: a hello waits at most this long.
CONTROL_EVERY_MS = 10


class HelloRefused(Exception):
    """A hello the learner answers with an error (the text goes back to the peer)."""


@dataclass
class LearnerResult:
    env_steps: int
    updates: int
    episodes: int
    train_seconds: float
    final_mean_return: float | None
    reached: bool
    stop_reason: str
    return_source: str = "train"  # "eval": the greedy evaluation actor's episodes
    perf: dict | None = None  # whole-run rates from the first batch on (see Learner._perf)
    reached_after_s: float | None = None  # seconds into run() when the target was reached
    reached_at_unix: float | None = None  # wall clock then (zrl run measures from its own start)
    resumed_env_steps: int = 0  # env_steps counts these, from the checkpoint resumed

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"learner.device: {name} requested but CUDA is not available")
    return dev


def publishable(flat: torch.Tensor) -> np.ndarray:
    """The flat weights as a host float32 array (a view on CPU, one copy from a GPU)."""
    return flat.detach().to("cpu", torch.float32).numpy()


class HostWeights:
    """The flat weights on the host, for publishing, without making the training loop wait.

    On CPU the host array is the buffer itself: `start(v)` makes version v ready at once.
    On a GPU, `start(v)` queues a copy into pinned memory behind the update and records an
    event; `ready()` hands the copy over once the stream has passed the event. The next
    update's V-trace round trip waits for the stream anyway, so a version is published one
    update late at no extra synchronisation (a blocking `.cpu()` per update was a second
    round trip). While a copy is in flight, `start` skips: a newer version follows. The
    last copy of a run may go unpublished; the final checkpoint has those weights.
    """

    def __init__(self, flat: torch.Tensor):
        self.flat = flat
        self.pending: int | None = None
        self.gpu = flat.device.type == "cuda"
        if self.gpu:
            self.host = torch.empty(flat.shape, dtype=torch.float32, pin_memory=True)
            self.event = torch.cuda.Event()
            self.stream = torch.cuda.current_stream(flat.device)  # the learner's, on its own GPU (cuda:N too)

    def start(self, version: int) -> None:
        if self.pending is not None:
            return
        if self.gpu:
            with torch.cuda.stream(self.stream):
                self.host.copy_(self.flat.detach(), non_blocking=True)
            self.event.record(self.stream)
        self.pending = version

    def ready(self) -> tuple[int, np.ndarray] | None:
        """(version, float32 weights) once a started copy has landed, else None. The array
        is valid until the next `start` (the caller encodes it into a frame right away)."""
        if self.pending is None or (self.gpu and not self.event.query()):
            return None
        version, self.pending = self.pending, None
        return version, (self.host.numpy() if self.gpu else publishable(self.flat))


class WeightsFrames:
    """WEIGHTS frames of float32 weights, for one thread: one copy into a frame of a
    wire.Layout, which hands a frame's buffer out again only once nothing holds it any
    more (ZeroMQ, a view of it), so a frame is never written while anyone reads it. On the
    2-core CPU, for Pong's 678k weights: ~0.06 ms against 0.23 for wire.encode and bytes()
    (a zeroed buffer, a copy, and a copy of the frame), which a GPU learner with a small
    net pays per update."""

    def __init__(self):
        self.layout: wire.Layout | None = None

    def frame(self, version: int, params: np.ndarray) -> memoryview:
        """The frame of `params` (any shape: sent flat), read-only."""
        layout = self.layout
        if layout is None or layout.shapes[0][0] != params.size:
            layout = self.layout = wire.Layout(wire.Kind.WEIGHTS, [("params", np.float32, (params.size,))])
        out = layout.allocate()
        out.arrays["params"][...] = params.reshape(-1)
        return out.finish(sender_id=0, seq=0, policy_version=version).toreadonly()


def parameter_count(algo) -> int | None:
    """The number of parameters algo.build_model() makes, counted on the meta device (no
    memory, no random numbers drawn); None where the model cannot be built there."""
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            return sum(p.numel() for p in algo.build_model().parameters())
    except Exception:  # noqa: BLE001 - an init that meta tensors cannot run: the real build decides
        return None


def check_training_fits(algo, device: torch.device) -> None:
    """Raises MemoryError when the model's float32 weights, gradients and the optimiser's two
    moments would not fit in the device's free memory. The specs come from a peer's hello:
    an observation shape can ask for terabytes of weights, and where the OS overcommits
    memory, allocating them does not fail at once but initialises them for minutes."""
    n = parameter_count(algo)
    if n is None:
        return
    need = 16 * n
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else psutil.virtual_memory().available
    if need > free:
        raise MemoryError(f"its {n:,} parameters need about {need / 2**30:,.1f} GiB for training (float32 weights, "
                          f"gradients and the optimiser's two moments), and {device} has {free / 2**30:,.1f} GiB free")


def _zero_nonfinite_grads(params: list[torch.Tensor], grad_norm: torch.Tensor) -> torch.Tensor:
    """Zeroes every gradient if their norm is not finite (a loss that overflowed: inputs huge
    but finite, a learning rate that diverges), so that the step cannot write NaN into the
    weights and every actor's copy of them; returns 1.0 where it did, else 0.0 (a tensor, so
    no read: on a GPU a branch on it would wait for the backward pass). The optimiser still
    steps, on zero gradients: Adam moves the weights a little along its running moments.
    On a CPU: ~35 us for CartPole's MLP (0.6% of its update), ~170 for Pong's CNN (0.3%)."""
    ok = torch.isfinite(grad_norm)
    bad = ~ok
    for p in params:
        g = p.grad
        if g is None:
            continue
        if g.numel() < 65536:  # (a masked fill costs least on small tensors, two passes on large ones)
            g.masked_fill_(bad, 0.0)
        else:
            torch.nan_to_num_(g, 0.0, 0.0, 0.0).mul_(ok)
    return bad.float()


def update_step(algo, model: torch.nn.Module, opt, params: list[torch.Tensor], batch: dict, max_grad_norm: float):
    """One gradient step on a batch, as the learner takes it: loss, backward, clip, the
    non-finite guard, the optimiser's step, the algorithm's after_update. Returns (the loss's
    stats, the gradients' norm, 1.0 if they were not finite else 0.0), tensors unread.
    (zrl bench pipeline times this very function against a plain PyTorch loop.)"""
    loss, stats = algo.loss(model, batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    nonfinite = _zero_nonfinite_grads(params, grad_norm)
    opt.step()
    algo.after_update(model, batch, stats)
    return stats, grad_norm, nonfinite


class Learner:
    def __init__(
        self,
        config: Config,
        bind: str,
        logdir: str | Path | None = None,
        *,
        resume: bool = False,
        ctx: zmq.Context | None = None,
        console: bool = True,
        stop_at_return: float | None = None,
        max_seconds: float | None = None,
        max_env_steps: int | None = None,
        sink: bool = False,
    ):
        self.config = config
        # Sink mode (benchmarks): answer hellos and count what arrives, but train on nothing,
        # so actors run as fast as they can produce and send.
        self.sink = sink
        self.logdir = Path(logdir) if logdir is not None else None
        self.ckdir = self.logdir / "checkpoints" if self.logdir is not None else None
        if self.logdir is not None:
            try:
                self.logdir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise OSError(f"cannot use logdir {self.logdir}: {e.strerror or e}") from None
        self.console = console
        self.stop_at_return = stop_at_return if stop_at_return is not None else config.run.stop_at_return
        self.max_seconds = max_seconds if max_seconds is not None else config.run.max_seconds
        self.max_env_steps = max_env_steps if max_env_steps is not None else config.run.max_env_steps
        self.device = resolve_device(config.learner.device)
        self.algo_cls = algorithms.get(config.algo.name)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._lock = threading.Lock()

        # Counters: written by the receiver under _lock, read by the trainer.
        self.env_steps = 0
        self.updates = 0
        self.episodes = 0
        self.train_seconds_before = 0.0  # from a resumed checkpoint
        self.resumed_env_steps = 0
        self.returns: collections.deque[float] = collections.deque(maxlen=config.run.return_window)
        self.lengths: collections.deque[float] = collections.deque(maxlen=config.run.return_window)
        self.eval_returns: collections.deque[float] = collections.deque(maxlen=config.run.return_window)
        self.eval_episodes = 0
        # Which returns decide --stop-at-return and the summary: a greedy evaluation
        # actor's when the config has one (exploring actors of value-based methods
        # cannot reach the target on their own episodes), else the actors' own.
        self.return_source = "eval" if config.run.eval_actor else "train"
        self.rejected: collections.Counter[str] = collections.Counter()
        self.senders: dict[int, float] = {}
        self.custom: dict[str, float] = {}
        self.lag_sum = 0.0
        self.lag_n = 0
        self.lag_max = 0
        # Whole-run aggregates for the final report (zrl bench pipeline reads them).
        self.run_wait_s = 0.0
        self.run_train_s = 0.0
        self.run_samples = 0
        self.run_lag_sum = 0.0
        self.run_lag_n = 0
        self.run_lag_max = 0
        self.run_first_batch_at: float | None = None
        self.run_env_steps_at_first_batch = 0
        self.reached_mean: float | None = None
        self.reached_at: float | None = None
        self.reached_unix: float | None = None

        self.model: torch.nn.Module | None = None
        self.algo: algorithms.Algorithm | None = None
        # Told to actors in hello replies: one that sees another one (this process restarted
        # on the same endpoints) says hello again, as a new learner needs before it takes data.
        self.instance = os.urandom(8).hex()
        self.optimizer: torch.optim.Optimizer | None = None
        self.obs_spec: spaces.Spec | None = None
        self.action_spec: spaces.Spec | None = None
        # The receiver's checks of trajectory and stats frames (a C++ fast path for layouts seen
        # before); it holds the trajectory schema once a hello has agreed the specs.
        self.gate = wire.Gate(config.learner.max_message_bytes, DATA_KINDS)
        self._latest_weights: tuple[int, np.ndarray] | None = None
        # While no update publishes weights (Ape-X's warm-up, no data, a sink), the latest are
        # published again this often, so actors' watchdogs (actor.learner_timeout_s) hear from us.
        self._heartbeat_s = max(0.5, config.actor.learner_timeout_s / 3)
        self._published_at = time.monotonic()
        self._published: bytes | memoryview | None = None  # the last WEIGHTS frame sent, which a heartbeat sends again
        self._weights_frames = WeightsFrames()  # the training loop's WEIGHTS frames (_publish)
        self._resume_state: dict[str, Any] | None = None
        self._ckdir_claimed = False  # a fresh run moves an earlier run's checkpoints aside before its first save
        if resume:
            self._load_for_resume()

        self.queue: queue.Queue = queue.Queue(maxsize=config.learner.queue_size)
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        lc = config.learner
        self.curve = transport.Curve.from_config(config.security)
        self._auth = self.curve.start_authenticator(self.ctx) if self.curve else None
        self.control = transport.socket(self.ctx, zmq.ROUTER)
        self.control.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.pull = transport.socket(self.ctx, zmq.PULL, hwm=lc.pull_hwm)
        self.pull.setsockopt(zmq.MAXMSGSIZE, lc.max_message_bytes)
        self.pub = transport.socket(self.ctx, zmq.PUB, hwm=4)
        try:
            if self.curve:
                for sock in (self.control, self.pull, self.pub):
                    self.curve.server(sock)
            self.control_endpoint = transport.bind(self.control, bind)
            self.trajectory_endpoint = transport.bind(self.pull, lc.trajectory_bind or transport.derive_endpoint(bind, "traj"))
            self.weights_endpoint = transport.bind(self.pub, lc.weights_bind or transport.derive_endpoint(bind, "weights"))
        except BaseException:
            self._close_sockets()
            raise
        self._receiver = threading.Thread(target=self._receive_loop, name="zrl-receiver", daemon=True)
        self._receiver_error: BaseException | None = None
        if self._resume_state is not None:
            st = self._resume_state
            try:
                self._build(spaces.from_json(st["obs_spec"]), spaces.from_json(st["action_spec"]))
            except BaseException:  # (a checkpoint that does not fit the model): unbind, then raise
                self._close_sockets()
                raise

    # ------------------------------------------------------------------ set-up

    def _load_for_resume(self) -> None:
        if self.ckdir is None:
            raise ValueError("--resume needs a logdir")
        found = checkpoint.load_latest(self.ckdir)
        if found is None:
            self._say(f"no checkpoint in {self.ckdir}; starting fresh")
            return
        path, state = found
        obs, act = state.get("obs_spec"), state.get("action_spec")
        checkpoint.check_compatible(path, state, self.config.model_hash(obs, act), self.config.model_shaping(obs, act))
        for key, theirs, ours in checkpoint.algo_changes(state, self.config):
            self._say(f"warning: {path} was trained with algo.{key} {theirs!r}, this config has {ours!r}")
        trained_on = state["config"].get("env", {}).get("id")
        if trained_on != self.config.env.id:  # (allowed: another version of the same env, say)
            self._say(f"warning: {path} was trained on env.id {trained_on!r}, this config has {self.config.env.id!r}; "
                      "actors whose observations or actions differ from the checkpoint's will be refused")
        if checkpoint.optimizer_of(state) == self.config.learner.optimizer:
            for key, theirs, ours in checkpoint.optimizer_changes(state, self.config):
                self._say(f"{path} was trained with learner.{key} {theirs!r}; resuming with this config's {ours!r}")
        self._resume_state = state
        self._resume_path = path

    def _build(self, obs_spec: spaces.Spec, action_spec: spaces.Spec) -> None:
        """Builds model, optimiser and algorithm for the agreed specs (once)."""
        torch.manual_seed(self.config.run.seed)
        algo = self.algo_cls(self.config, obs_spec, action_spec)
        check_training_fits(algo, self.device)
        model = algo.build_model().to(self.device)
        self.flat = flatten_parameters(model)  # publishing reads this buffer
        self.host_weights = HostWeights(self.flat)
        lc = self.config.learner
        if lc.optimizer == "adam":
            settings = {"lr": lc.learning_rate, "betas": tuple(lc.adam_betas), "eps": lc.adam_eps}
            opt = torch.optim.Adam(model.parameters(), **settings)
        else:
            settings = {"lr": lc.learning_rate, "alpha": lc.rmsprop_alpha, "eps": lc.rmsprop_eps, "momentum": lc.rmsprop_momentum}
            opt = torch.optim.RMSprop(model.parameters(), **settings)
        st = self._resume_state
        if st is not None:
            try:
                model.load_state_dict(st["model"])
                theirs = checkpoint.optimizer_of(st)
                if theirs == lc.optimizer:
                    # The moments carry over; the settings are the config's (load_state_dict
                    # would bring back the checkpoint's learning rate, eps, betas, ...).
                    opt.load_state_dict(st["optimizer"])
                    for group in opt.param_groups:
                        group.update(settings)
                        if group.get("momentum", 0) > 0:  # RMSprop given momentum now: its buffers start at zero
                            for p in group["params"]:
                                state = opt.state[p]
                                if state and "momentum_buffer" not in state:
                                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                else:
                    self._say(f"warning: {self._resume_path} was trained with learner.optimizer {theirs}, this config "
                              f"has {lc.optimizer}: the optimiser starts afresh (the model's weights carry over)")
                algo.load_state_dict(st.get("algo", {}))
            except (RuntimeError, ValueError, KeyError) as e:
                raise checkpoint.CheckpointError(f"{self._resume_path}: does not fit the model: {e}") from None
            c = st["counters"]
            self.updates, self.env_steps, self.episodes = int(c["updates"]), int(c["env_steps"]), int(c["episodes"])
            self.resumed_env_steps = self.env_steps
            self.train_seconds_before = float(c.get("train_seconds", 0.0))
            self.returns.extend(c.get("recent_returns", []))
            self.eval_returns.extend(c.get("recent_eval_returns", []))
            self._say(f"resumed from {self._resume_path} at update {self.updates}, env step {self.env_steps}")
            returns = self._target_returns()
            if self.stop_at_return is not None and len(returns) >= self.config.run.return_window and np.mean(returns) >= self.stop_at_return:
                self._say(f"note: the resumed run's last {self.config.run.return_window} returns (mean {np.mean(returns):.1f}) already reach the target "
                          f"{self.stop_at_return:g}, so it stops at once; raise --stop-at-return (run.stop_at_return) to train on")
        self.obs_spec, self.action_spec = obs_spec, action_spec
        self.algo, self.model, self.optimizer = algo, model, opt
        self.gate.set_trajectory_checks(algo.trajectory_schema(self.config.learner.batch_size), algo.check_values, algo.gate_rules(),
                                        at_join=algo.join_checks())
        self._latest_weights = (self.updates, publishable(self.flat).copy())
        self._ready.set()

    def _say(self, text: str) -> None:
        if self.console:
            print(f"[learner] {text}", flush=True)
        log.info(text)

    # ------------------------------------------------------------------ handshake

    def _on_hello(self, msg: wire.Message) -> bytes | bytearray:
        try:
            hello, obs_spec, action_spec = wire.read_hello(msg, "learner")
        except wire.HelloInvalid as e:
            raise HelloRefused(str(e)) from None
        role = hello.get("role")
        if role not in ("actor", "server", "eval"):
            raise HelloRefused(f"unknown role {role!r} (expected actor, server or eval)")
        if hello.get("algo") != self.config.algo.name:
            raise HelloRefused(f"algorithm {hello.get('algo')!r} differs from the learner's {self.config.algo.name!r}")
        T = self.config.actor.unroll_length
        if role != "eval" and hello.get("unroll_length") != T:
            raise HelloRefused(f"unroll_length {hello.get('unroll_length')!r} differs from the learner's actor.unroll_length {T}")
        K = hello.get("num_envs")
        B = self.config.learner.batch_size
        if role != "eval" and (not isinstance(K, int) or K < 1):
            raise HelloRefused(f"num_envs {K!r} must be a positive int")
        if role != "eval" and not getattr(self.config.algo, "uses_replay", False) and B % K != 0:
            # (A replay learner samples its batches: a chunk's width need not divide them.)
            raise HelloRefused(f"num_envs {K!r} must divide the learner's batch_size {B}")
        want_hash = self.config.model_hash(obs_spec.to_json(), action_spec.to_json())
        if hello.get("model_hash") != want_hash:
            theirs, ours = hello.get("model"), self.config.model_shaping()["model"]
            diffs = [f"model.{k}: {theirs.get(k)!r} here, {ours.get(k)!r} on the learner" for k in sorted(set(theirs) | set(ours))
                     if theirs.get(k) != ours.get(k)] if isinstance(theirs, dict) else []
            raise HelloRefused(f"model config differs from the learner's ({'; '.join(diffs) or 'model_hash mismatch'}): "
                               "start actors with the learner's config")
        with self._lock:
            if self.model is None:
                try:
                    self._build(obs_spec, action_spec)
                except checkpoint.CheckpointError:
                    raise  # the run cannot go on (resuming a checkpoint of another model)
                except Exception as e:  # noqa: BLE001 - the specs are the peer's: refuse them, keep serving
                    raise HelloRefused(f"cannot build the model for obs {obs_spec.to_json()} and actions "
                                       f"{action_spec.to_json()}: {e}") from None
                self._say(f"model built for obs {obs_spec.to_json()} and actions {action_spec.to_json()}")
            elif obs_spec != self.obs_spec or action_spec != self.action_spec:
                raise HelloRefused(
                    f"specs differ from the agreed ones: obs {obs_spec.to_json()} vs {self.obs_spec.to_json()}, "
                    f"action {action_spec.to_json()} vs {self.action_spec.to_json()}"
                )
            index = hello.get("index", 0)
            if isinstance(index, int) and 0 <= index < 2**32:
                self.senders[index] = time.monotonic()
            version, params = self._latest_weights
        reply = {
            "ok": True,
            "trajectory_endpoint": self.trajectory_endpoint,
            "weights_endpoint": self.weights_endpoint,
            "obs_space": self.obs_spec.to_json(),
            "action_space": self.action_spec.to_json(),
            "policy_version": version,
            "learner_instance": self.instance,
        }
        return wire.encode(wire.Kind.HELLO_REPLY, {"params": params}, reply, policy_version=version)

    # ------------------------------------------------------------------ receiver thread

    def _reject(self, reason: str, detail: str) -> None:
        with self._lock:
            self.rejected[reason] += 1
            n = self.rejected[reason]
        if n <= 5 or n in (10, 100, 1000) or n % 10000 == 0:
            log.warning("rejected message (%s, %d so far): %s", reason, n, detail)

    def _receive_loop(self) -> None:
        try:
            self._receive_loop_inner()
        except BaseException as e:  # a bug here must not hang the trainer
            self._receiver_error = e
            log.exception("receiver thread failed")
            self._stop.set()

    def _receive_loop_inner(self) -> None:
        max_bytes = self.config.learner.max_message_bytes
        control_kinds = frozenset({int(wire.Kind.HELLO)})
        next_control = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_control:
                while self.control.poll(0, zmq.POLLIN):
                    self._handle_control(control_kinds, max_bytes)
                next_control = now + CONTROL_EVERY_MS / 1000
            # A burst, checked (wire.Gate.drain), its first message waited for inside the
            # drain: a blocking receive costs one system call where a poll before the
            # receive costs three. A burst for the queue takes no more than the queue has
            # room for: what the learner cannot take yet stays in ZeroMQ, so actors feel
            # back-pressure and the lag stays bounded.
            queued = not (self.sink or self.algo is None or self.algo.uses_replay)
            burst = max(1, self.queue.maxsize - self.queue.qsize()) if queued else 64
            for checked in self.gate.drain(self.pull, min(burst, 64), CONTROL_EVERY_MS):
                item = self._handle_data(checked)
                if item is not None:
                    self._enqueue(item, control_kinds, max_bytes)

    def _enqueue(self, item, control_kinds, max_bytes) -> None:
        """Blocks while the queue is full (so the PULL socket fills and actors feel
        back-pressure), waking as soon as the trainer takes a batch, and keeps
        answering hellos meanwhile so actors can tell a busy learner from a lost one."""
        while not self._stop.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return
            except queue.Full:
                while self.control.poll(0, zmq.POLLIN):
                    self._handle_control(control_kinds, max_bytes)

    def _handle_control(self, kinds, max_bytes) -> None:
        try:
            parts = self.control.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        if len(parts) != 2:
            self._reject(wire.Reason.BAD_HEADER.value, f"control message with {len(parts)} frames")
            return
        identity, frame = parts
        try:
            msg = wire.decode(frame, max_bytes=max_bytes, allowed_kinds=kinds)
            reply = self._on_hello(msg)
        except wire.WireError as e:
            self._reject(e.reason.value, e.detail)
            reply = wire.encode(wire.Kind.ERROR, meta=f"bad hello: {e}")
        except HelloRefused as e:
            self._reject("hello_refused", str(e))
            reply = wire.encode(wire.Kind.ERROR, meta=str(e))
        try:
            self.control.send_multipart([identity, reply], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # peer gone; nothing to do

    def _handle_data(self, checked):
        """One message as the gate checked it ((message, bindings) or the WireError):
        stats are recorded here, trajectories returned for the queue."""
        if isinstance(checked, wire.WireError):
            self._reject(checked.reason.value, checked.detail)
            return
        msg, bindings = checked
        if bindings is None:  # STATS, the only other data kind
            try:
                self._on_stats(msg)
            except wire.WireError as e:
                self._reject(e.reason.value, e.detail)
            return
        steps = self.algo.env_steps(msg, bindings)
        with self._lock:
            self.env_steps += steps
            self.senders[msg.sender_id] = time.monotonic()
        if self.sink:
            return None
        if self.algo.uses_replay:
            self.algo.ingest(msg, bindings)
            return None
        return (msg, bindings)

    def _on_stats(self, msg: wire.Message) -> None:
        arrays = {}
        for info in msg.infos:
            if info.dtype != np.float64 or len(info.shape) != 1 or info.shape[0] > STATS_MAX_VALUES:
                raise wire.WireError(wire.Reason.BAD_SHAPE, f"stats array {info.name!r} must be float64 [n <= {STATS_MAX_VALUES}]")
        for name, a in msg.arrays.items():
            if not np.all(np.isfinite(a)):
                raise wire.WireError(wire.Reason.BAD_VALUE, f"stats array {name!r} has non-finite values")
            arrays[name] = a
        rets, lens = arrays.pop("episode_return", None), arrays.pop("episode_length", None)
        eval_rets, _ = arrays.pop("eval_return", None), arrays.pop("eval_length", None)
        with self._lock:
            if rets is not None:
                self.returns.extend(rets.tolist())
                self.episodes += len(rets)
            if lens is not None:
                self.lengths.extend(lens.tolist())
            if eval_rets is not None:
                self.eval_returns.extend(eval_rets.tolist())
                self.eval_episodes += len(eval_rets)
            for name, a in arrays.items():
                if a.size and (name in self.custom or len(self.custom) < STATS_MAX_CUSTOM):
                    self.custom[name] = float(a[-1])
            self.senders[msg.sender_id] = time.monotonic()

    # ------------------------------------------------------------------ training thread

    def request_stop(self) -> None:
        self._stop.set()

    def _target_returns(self) -> collections.deque:
        return self.eval_returns if self.return_source == "eval" else self.returns

    def mean_return(self) -> float | None:
        with self._lock:
            r = self._target_returns()
            return float(np.mean(r)) if r else None

    def _target_reached(self) -> bool:
        """True once the mean of the last return_window episodes reaches the target; the
        mean that did it is kept (`reached_mean`), since episodes keep arriving afterwards."""
        if self.stop_at_return is None:
            return False
        if self.reached_mean is not None:
            return True
        with self._lock:
            window = self.config.run.return_window
            returns = self._target_returns()
            if len(returns) >= window:
                mean = float(np.mean(returns))
                if mean >= self.stop_at_return:
                    self.reached_mean = mean
                    self.reached_at = time.perf_counter()
                    self.reached_unix = time.time()
                    return True
        return False

    def _next_batch(self, deadline_check, idle) -> list[tuple[wire.Message, dict]] | None:
        B = self.config.learner.batch_size
        items, cols = [], 0
        pending, self._leftover = self._leftover, []
        for j, item in enumerate(pending):  # chunks put back: a batch's overflow, or the mates of a rejected chunk
            c = self.algo.columns(*item)
            if items and cols + c > B:
                self._leftover = pending[j:]
                return items
            items.append(item)
            cols += c
        while cols < B:
            try:
                item = self.queue.get(timeout=0.05)
            except queue.Empty:
                if self._stop.is_set() or deadline_check():
                    return None
                idle()
                continue
            c = self.algo.columns(*item)
            if cols + c > B:
                self._leftover.append(item)
                break
            items.append(item)
            cols += c
        return items

    def run(self) -> LearnerResult:
        """Trains until a stop condition; returns what happened. Call `close()` afterwards."""
        self._leftover: list = []
        self._receiver.start()
        t_start = time.perf_counter()
        self._say(f"listening on {self.control_endpoint} (trajectories {self.trajectory_endpoint}, weights {self.weights_endpoint}); device {self.device}, {resolve_precision(self.config.learner.precision, self.device)}")
        metrics = MetricsWriter(self.logdir, console=self.console)
        stop_reason = "interrupted"
        try:
            if not self.config.learner.torch_threads == torch.get_num_threads():
                torch.set_num_threads(self.config.learner.torch_threads)

            def time_up() -> bool:
                return self.max_seconds is not None and time.perf_counter() - t_start >= self.max_seconds

            while not self._ready.wait(0.05):
                if self._stop.is_set() or time_up():
                    stop_reason = "time limit" if time_up() else self._stop_reason()
                    break
            else:
                stop_reason = self._sink_until_stopped(time_up) if self.sink else self._train(metrics, t_start, time_up)
            # Stop receiving first, so the counters in the final checkpoint and the result agree.
            self._stop.set()
            self._receiver.join(timeout=5)
            return self._finish(metrics, t_start, stop_reason)
        finally:
            metrics.close()

    def _train(self, metrics: MetricsWriter, t_start: float, time_up) -> str:
        prefetcher = None
        depth = self.config.learner.prefetch_for(self.device)
        if depth and not self.algo.uses_replay:
            prefetcher = Prefetcher(self._make_batch, depth)
        try:
            return self._train_loop(metrics, t_start, time_up, prefetcher)
        finally:
            if prefetcher is not None:
                prefetcher.close()

    def _make_batch(self, stop: threading.Event):
        """For the Prefetcher's thread: the next batch on the learner's device and its chunks'
        policy versions, or None when stopping. It alone takes from the queue then."""
        items = self._next_batch(stop.is_set, lambda: None)
        if items is None:
            return None
        # (A thread starts on the current device, cuda:0.)
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            batch = self._collate(items)
        return None if batch is None else (batch, [m.policy_version for m, _ in items])

    def _collate(self, items: list) -> dict | None:
        """The batch of these chunks, or None when some broke a rule checked as they were
        joined (`Algorithm.checked_at_join`): those are counted as rejected and dropped, and
        the rest go back to the front of the queue for the next batch."""
        try:
            return self.algo.collate([m for m, _ in items], self.device)
        except RejectedChunks as e:
            for err in e.errors.values():
                self._reject(err.reason.value, err.detail)
            with self._lock:  # counted on receipt; a chunk rejected here was no env step trained on
                self.env_steps -= sum(self.algo.env_steps(*items[i]) for i in e.errors)
            self._leftover = [item for i, item in enumerate(items) if i not in e.errors] + self._leftover
            return None

    def _waited(self, t_wait: float) -> float:
        """Seconds since t_wait, a wait for data that brought no batch; counted in the run's total."""
        dt = time.perf_counter() - t_wait
        if self.run_first_batch_at is not None:
            self.run_wait_s += dt
        return dt

    def _train_loop(self, metrics: MetricsWriter, t_start: float, time_up, prefetcher: Prefetcher | None) -> str:
        lc = self.config.learner
        model, opt, algo = self.model, self.optimizer, self.algo
        params = list(model.parameters())
        model.train()
        last_log = last_ckpt = time.perf_counter()
        env_rate, sample_rate = Rate(self.env_steps), Rate(0)
        samples = 0
        wait_s = 0.0
        stats_acc: dict[str, Any] = {}
        n_acc = 0
        last_wait_log = last_log

        def idle() -> None:
            # No data to train on: keep actors' watchdogs fed, and say what we wait for.
            nonlocal last_wait_log
            self._heartbeat()
            now = time.perf_counter()
            if now - max(last_log, last_wait_log) >= lc.log_interval_s:
                self._log_waiting(metrics, now - t_start)
                last_wait_log = now

        def log(now: float) -> None:  # the stretch since last_log
            self._log(metrics, now - t_start, env_rate, sample_rate, samples, wait_s / (now - last_log), stats_acc, n_acc)

        def last(reason: str) -> str:
            # Logged as training stops too: TensorBoard's curves (and the console) end where
            # training did, with the return that stopped it, not up to a log interval before.
            now = time.perf_counter()
            if now > last_log:
                log(now)
            return reason

        while True:
            if self._stop.is_set():
                return last(self._stop_reason())
            if time_up():
                return last("time limit")
            if self.max_env_steps is not None and self.env_steps >= self.max_env_steps:
                return last("env step limit")
            if self._target_reached():
                return last("target reached")
            t_wait = time.perf_counter()
            if algo.uses_replay:
                batch = algo.sample(self.device)
                if batch is None:  # replay not warm yet: wait for the receiver to fill it
                    idle()
                    self._stop.wait(0.005)
                    wait_s += self._waited(t_wait)
                    continue
                lag_versions = batch.pop("_policy_version", None)
            elif prefetcher is not None:
                got = prefetcher.get(0.05)
                if got is None:
                    idle()
                    wait_s += self._waited(t_wait)
                    continue
                batch, lag_versions = got
            else:
                items = self._next_batch(lambda: time_up() or (self.max_env_steps is not None and self.env_steps >= self.max_env_steps), idle)
                if items is None:
                    continue
                batch = self._collate(items)
                if batch is None:
                    continue
                lag_versions = [m.policy_version for m, _ in items]
            t_got = time.perf_counter()
            wait_s += t_got - t_wait
            if self.run_first_batch_at is None:
                self.run_first_batch_at = t_got
                self.run_env_steps_at_first_batch = self.env_steps
            else:
                self.run_wait_s += t_got - t_wait

            if lc.lr_decay_env_steps is not None:
                progress = min(1.0, self.env_steps / lc.lr_decay_env_steps)
                frac = 1.0 - progress * (1.0 - lc.lr_final_scale)
                for g in opt.param_groups:
                    g["lr"] = lc.learning_rate * frac
            stats, grad_norm, nonfinite = update_step(algo, model, opt, params, batch, lc.max_grad_norm)
            with self._lock:
                self.updates += 1
                if lag_versions is not None and len(lag_versions):
                    lag = (self.updates - 1) - np.asarray(lag_versions, dtype=np.int64)
                    self.lag_sum += float(lag.sum())
                    self.lag_n += len(lag)
                    self.lag_max = max(self.lag_max, int(lag.max()))
                    self.run_lag_sum += float(lag.sum())
                    self.run_lag_n += len(lag)
                    self.run_lag_max = max(self.run_lag_max, int(lag.max()))
            n_samples = _batch_samples(batch)
            samples += n_samples
            self.run_samples += n_samples
            self.run_train_s += time.perf_counter() - t_got
            # Publish what has landed, then start this update's copy (on CPU it lands at once).
            self._publish_ready()
            if self.updates % lc.publish_interval == 0:
                self.host_weights.start(self.updates)
                self._publish_ready()
            # Summed as tensors and read only when logging: float() here would
            # synchronise with a GPU on every update.
            for k, v in stats.items():
                stats_acc[k] = stats_acc.get(k, 0.0) + (v.detach() if isinstance(v, torch.Tensor) else v)
            stats_acc["grad_norm"] = stats_acc.get("grad_norm", 0.0) + torch.nan_to_num(grad_norm.detach(), 0.0, 0.0, 0.0)
            stats_acc["nonfinite_grads"] = stats_acc.get("nonfinite_grads", 0.0) + nonfinite
            n_acc += 1

            now = time.perf_counter()
            if now - last_log >= lc.log_interval_s:
                log(now)
                stats_acc.clear()
                n_acc = 0
                wait_s = 0.0
                last_log = now
            if self.ckdir is not None and now - last_ckpt >= lc.checkpoint_interval_s:
                self.save_checkpoint(now - t_start)
                last_ckpt = now

    def _stop_reason(self) -> str:
        return "interrupted" if self._receiver_error is None else f"receiver failed: {self._receiver_error}"

    def _sink_until_stopped(self, time_up) -> str:
        while not self._stop.wait(0.05):
            if time_up():
                return "time limit"
            self._heartbeat()
        return "interrupted"

    def _heartbeat(self) -> None:
        """Publishes the latest weights again if none went out for `_heartbeat_s`: an actor
        takes weights of the version it has as a sign of life, and copies nothing."""
        if self._latest_weights is None or time.monotonic() - self._published_at < self._heartbeat_s:
            return
        if self._published is None:  # (nothing published yet: the built or resumed weights)
            version, params = self._latest_weights
            self._published = bytes(wire.encode(wire.Kind.WEIGHTS, {"params": params}, policy_version=version))
        self._send_weights(self._published)

    def _connected(self, now: float) -> int:
        """Senders heard from within learner.actor_timeout_s (call with the lock held)."""
        return sum(1 for t in self.senders.values() if now - t < self.config.learner.actor_timeout_s)

    def _log_waiting(self, metrics: MetricsWriter, elapsed: float) -> None:
        """The console line while no update runs: what the learner waits for."""
        with self._lock:
            env_steps, updates, rejected = self.env_steps, self.updates, sum(self.rejected.values())
            now = time.monotonic()
            connected = self._connected(now)
        what = self.algo.waiting_for() if self.algo is not None else None
        metrics.line(
            f"{elapsed:6.1f}s  steps {env_steps:,}  updates {updates:,}  waiting for {what or 'data'}  "
            f"queue {self.queue.qsize()}/{self.queue.maxsize}  actors {connected}" + (f"  rejected {rejected}" if rejected else "")
        )

    def _publish_ready(self) -> None:
        landed = self.host_weights.ready()
        if landed is not None:
            self._publish(*landed)

    def _publish(self, version: int, params: np.ndarray) -> None:
        """Sends version `version` of the weights (the training loop's thread alone calls this).

        The frame (WeightsFrames) is reused once nothing holds it: ZeroMQ, a hello reply
        being built from it, the heartbeat's last frame."""
        frame = self._weights_frames.frame(version, params)
        # Hello replies carry these weights: a read-only view into the frame, which nothing
        # writes until it is free again, so the receiver thread never reads a buffer being written.
        self._latest_weights = (version, wire.decode(frame).arrays["params"])
        self._send_weights(frame)

    def _send_weights(self, frame: bytes | memoryview) -> None:
        self._published, self._published_at = frame, time.monotonic()
        try:
            self.pub.send(frame, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            pass  # a slow subscriber's queue is full: it gets a newer version later

    def _log(self, metrics, elapsed, env_rate, sample_rate, samples, wait_frac, stats_acc, n_acc) -> None:
        with self._lock:
            env_steps, updates = self.env_steps, self.updates
            rejected = dict(self.rejected)
            lag_mean = self.lag_sum / self.lag_n if self.lag_n else None
            lag_max = self.lag_max if self.lag_n else None
            self.lag_sum, self.lag_n, self.lag_max = 0.0, 0, 0
            now = time.monotonic()
            connected = self._connected(now)
            mean_ret = float(np.mean(self.returns)) if self.returns else None
            mean_len = float(np.mean(self.lengths)) if self.lengths else None
            n_ret = len(self.returns)
            eval_ret = float(np.mean(self.eval_returns)) if self.eval_returns else None
            n_eval = len(self.eval_returns)
            episodes = self.episodes
            custom = dict(self.custom)
        fps = env_rate.read(env_steps)
        lfps = sample_rate.read(samples)
        scalars = {k: float(v) / max(n_acc, 1) for k, v in stats_acc.items()}
        scalars.update(
            {
                "perf/env_steps_per_s": fps,
                "perf/learner_samples_per_s": lfps,
                "perf/wait_for_data_frac": wait_frac,
                "perf/queue_depth": self.queue.qsize(),
                "actors/connected": connected,
                "policy_lag/mean": lag_mean,
                "policy_lag/max": lag_max,
                "episode/return": mean_ret,
                "eval/return": eval_ret,
                "episode/length": mean_len,
                "episode/count": episodes,
                "updates": updates,
            }
        )
        scalars.update({f"rejected/{k}": float(v) for k, v in rejected.items()})
        scalars.update({f"custom/{k}": v for k, v in custom.items()})
        metrics.scalars(scalars, env_steps)
        ret = f"{mean_ret:.1f} ({n_ret} eps)" if mean_ret is not None else "-"
        if self.return_source == "eval":
            ret += f"  eval {eval_ret:.1f} ({n_eval} eps)" if eval_ret is not None else "  eval -"
        lag = f"{lag_mean:.1f}/{lag_max}" if lag_mean is not None else "-"
        rej = sum(rejected.values())
        blocked = sum(v for k, v in custom.items() if k.endswith("/blocked_s"))
        dropped = sum(v for k, v in custom.items() if k.endswith("/dropped_chunks"))
        bp = f"  backpressure: blocked {blocked:.1f}s dropped {dropped:,.0f}" if blocked >= 0.5 or dropped else ""
        metrics.line(
            f"{elapsed:6.1f}s  steps {env_steps:,}  {fps:,.0f} steps/s  updates {updates:,}  return {ret}  "
            f"lag {lag}  queue {self.queue.qsize()}/{self.queue.maxsize}  actors {connected}" + (f"  rejected {rej}" if rej else "") + bp
        )

    def save_checkpoint(self, elapsed: float) -> Path | None:
        if self.ckdir is None or self.model is None:
            return None
        if self._resume_state is None and self.updates == 0:
            return None  # a fresh run that has not trained: nothing worth keeping, and nothing moved aside
        if self._resume_state is None and not self._ckdir_claimed:
            moved = checkpoint.set_aside(self.ckdir)
            if moved is not None:
                self._say(f"{self.ckdir} held an earlier run's checkpoints; moved them to {moved} (use --resume to continue a run)")
            self._ckdir_claimed = True
        obs, act = self.obs_spec.to_json(), self.action_spec.to_json()
        with self._lock:
            counters = {
                "updates": self.updates,
                "env_steps": self.env_steps,
                "episodes": self.episodes,
                "train_seconds": self.train_seconds_before + elapsed,
                "recent_returns": list(self.returns),
                "recent_eval_returns": list(self.eval_returns),
            }
        state = {
            "model_hash": self.config.model_hash(obs, act),
            "model_shaping": self.config.model_shaping(obs, act),
            "config": self.config.to_dict(),
            "obs_spec": obs,
            "action_spec": act,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "algo": self.algo.state_dict(),
            "counters": counters,
        }
        return checkpoint.save(self.ckdir, counters["updates"], state, self.config.learner.keep_checkpoints)

    def _finish(self, metrics: MetricsWriter, t_start: float, stop_reason: str) -> LearnerResult:
        elapsed = time.perf_counter() - t_start
        if self.model is not None and self.ckdir is not None:
            path = self.save_checkpoint(elapsed)
            if path is not None:
                self._say(f"checkpoint {path}")
        reached = self._target_reached()
        mean = self.reached_mean if reached else self.mean_return()
        result = LearnerResult(
            env_steps=self.env_steps,
            updates=self.updates,
            episodes=self.episodes,
            train_seconds=elapsed,
            final_mean_return=mean,
            reached=reached,
            stop_reason=stop_reason,
            return_source=self.return_source,
            perf=self._perf(),
            reached_after_s=self.reached_at - t_start if self.reached_at is not None else None,
            reached_at_unix=self.reached_unix,
            resumed_env_steps=self.resumed_env_steps,
        )
        if self.logdir is not None:
            self.logdir.mkdir(parents=True, exist_ok=True)
            tmp = self.logdir / ".learner_final.json.tmp"
            tmp.write_text(json.dumps(result.to_json(), indent=2) + "\n")
            os.replace(tmp, self.logdir / "learner_final.json")
        mean_s = f"{mean:.1f}" if mean is not None else "-"
        self._say(f"done ({stop_reason}): {self.env_steps:,} env steps, {self.updates:,} updates, mean return {mean_s}, {elapsed:.1f}s")
        return result

    def _perf(self) -> dict:
        """Rates over the run from the first batch on (start-up excluded)."""
        if self.run_first_batch_at is None:
            return {}
        span = max(time.perf_counter() - self.run_first_batch_at, 1e-9)
        return {
            "seconds": round(span, 3),
            "env_steps_per_s": round((self.env_steps - self.run_env_steps_at_first_batch) / span, 1),
            "learner_samples_per_s": round(self.run_samples / span, 1),
            "train_samples_per_s": round(self.run_samples / self.run_train_s, 1) if self.run_train_s else None,
            "wait_for_data_frac": round(self.run_wait_s / span, 4),
            "policy_lag_mean": round(self.run_lag_sum / self.run_lag_n, 3) if self.run_lag_n else None,
            "policy_lag_max": self.run_lag_max if self.run_lag_n else None,
        }

    def close(self) -> None:
        """Tells actors training is over, stops the receiver, closes sockets."""
        self._stop.set()
        try:
            self.pub.send(wire.encode(wire.Kind.SHUTDOWN, meta="learner finished"), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        if self._receiver.is_alive():
            self._receiver.join(timeout=5)
        self._close_sockets()

    def _close_sockets(self) -> None:
        for s in (self.control, self.pull, self.pub):
            s.close(linger=0)
        if self._auth is not None:
            self._auth.release()
            self._auth = None
        if self._own_ctx:
            self.ctx.term()


def _batch_samples(batch: dict[str, torch.Tensor]) -> int:
    a = batch.get("action")
    if a is None:
        return 0
    return int(a.shape[0] * a.shape[1]) if a.dim() >= 2 else int(a.shape[0])
