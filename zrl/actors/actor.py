"""The actor process: step K envs with a CPU copy of the policy, stream chunks.

An actor knows one address, the learner's control endpoint. It says hello
there (who it is, its specs, its model hash) and the reply tells it where to
PUSH trajectories, where to SUB for weights, and carries the current
weights. Then it loops: apply the newest weights if any arrived (never
waiting for them), act on all K envs in one batched forward pass, step, let
the algorithm cut messages, send them.

Sends wait on ZeroMQ's high-water mark (back-pressure from a busy learner).
If a send cannot go through for `actor.learner_timeout_s`, the actor asks
the learner's control endpoint whether it is alive: a busy learner answers
and the actor keeps waiting; a lost one does not, and the actor says so and
keeps saying hello, with a deadline per attempt, until one comes back, then
reconnects to whatever endpoints that learner reports. If no weights arrive
for `actor.learner_timeout_s` while sends go through, it asks too (without
waiting for the answer): a learner restarted on the same endpoints (an ipc
path, fixed ports) is a new instance, which takes no data before a hello.
"""
from __future__ import annotations

import logging
import threading

import torch
import zmq

from zrl import algorithms, transport
from zrl.actors.episode_stats import EpisodeStats
from zrl.actors.link import HelloError, HelloProbe, LearnerFinished, LearnerLink, hello_meta, say_hello
from zrl.actors.sender import Sender
from zrl.actors.streams import ReadyStreams
from zrl.algorithms.base import ActorAlgo, NullRecorder, resolve_precision
from zrl.config import Config, ConfigError
from zrl.envs import make_vector_env
from zrl.models.int8 import int8_conv_supported, use_int8_first_conv
from zrl.models.int8_torso import use_int8_torso

# The learner link's names stay importable from here (zrl.server, zrl.launch and tests use them).
__all__ = ["Actor", "HelloError", "HelloProbe", "LearnerFinished", "LearnerLink", "hello_meta", "make_ready_env", "say_hello", "use_int8"]

log = logging.getLogger("zrl.actor")


def use_int8(setting: bool | str, model: torch.nn.Module, torso: bool = False) -> bool:
    """actor.int8_first_conv (or with torso=True, actor.int8_torso) applied to `model`: whether its
    CNN now acts with an int8 first conv (an int8 torso). Raises ValueError for true on a CPU (or
    PyTorch) without native int8 convolutions."""
    key = "actor.int8_torso" if torso else "actor.int8_first_conv"
    if setting is False:
        return False
    if setting is True and not int8_conv_supported():
        raise ValueError(f"{key}: true, but this is not an x86 CPU with AVX2 or newer, or this PyTorch's oneDNN "
                         "int8 convolution failed zrl's probe; set it to auto or false")
    used = use_int8_torso(model) if torso else use_int8_first_conv(model)
    if setting is True and not used:
        what = "no shallow CNN torso" if torso else "no CNN first conv"
        log.warning("%s: true, but the model has %s to run in int8; acting without it", key, what)
    return used


class Actor:
    def __init__(
        self,
        config: Config,
        learner: str,
        index: int = 0,
        num_actors: int = 1,
        seed: int | None = None,
        *,
        ctx: zmq.Context | None = None,
        stop: threading.Event | None = None,
        console: bool = True,
        max_steps: int | None = None,
        eval_mode: bool = False,
    ):
        self.config = config
        self.learner = learner
        self.index = index
        self.num_actors = num_actors
        self.seed = config.run.seed if seed is None else seed
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.stop = stop or threading.Event()
        self.console = console
        self.max_steps = max_steps
        # An evaluation actor acts greedily, feeds no data, and reports its episodes as eval_*.
        self.eval_mode = eval_mode
        self.link: LearnerLink | None = None
        self.env_steps = 0
        self.model: torch.nn.Module | None = None
        self.recorders: list = []

    @property
    def policy_version(self) -> int:
        return self.link.policy_version if self.link is not None else -1

    @property
    def weights_applied(self) -> int:
        return self.link.weights_applied if self.link is not None else 0

    def _say(self, text: str) -> None:
        if self.console:
            print(f"[actor {self.index}] {text}", flush=True)
        log.info("actor %d: %s", self.index, text)

    def _on_weights(self, version: int) -> None:
        for r in self.recorders:
            r.policy_version = version

    # ------------------------------------------------------------------ main loop

    def run(self) -> int:
        """Runs until stopped, the learner shuts down, or max_steps; returns env steps taken."""
        cfg = self.config
        torch.set_num_threads(cfg.actor.torch_threads)
        K = cfg.run.eval_num_envs if self.eval_mode else cfg.actor.num_envs
        G = 1 if self.eval_mode else cfg.actor.env_groups
        width = K // G  # envs per group: the columns of one chunk
        seed = self.seed * 10_000 + (5_000 if self.eval_mode else 0) + self.index * K
        torch.manual_seed(seed)
        envs = []
        ready = cfg.actor.env_batching == "first_ready" and G > 1  # (one group: the same as groups)
        try:
            batch = cfg.actor.act_batch or width  # (first_ready) envs per act() call
            if ready:
                envs = [make_ready_env(cfg, K, batch, seed)]
            else:
                envs = [make_vector_env(cfg.env, width, seed + g * width) for g in range(G)]
            obs_spec, action_spec = envs[0].observation_spec, envs[0].action_spec
            algo, precision = self._build_model(obs_spec, action_spec)
            meta = hello_meta(cfg, "eval" if self.eval_mode else "actor", self.index, obs_spec, action_spec, width)
            self.link = LearnerLink(self.ctx, self.learner, meta, self.model, timeout_s=cfg.actor.learner_timeout_s,
                                    send_hwm=cfg.actor.send_hwm, stop=self.stop, say=self._say, on_weights=self._on_weights,
                                    curve=transport.Curve.from_config(cfg.security), keepalive_s=cfg.learner.actor_timeout_s / 2)
            if not self.link.connect():
                return 0
            sender = Sender(link=self.link)  # sends chunks through link.pusher, as the id the learner gave
            if self.eval_mode:
                policy, self.recorders = algo.make_eval_policy(self.model, greedy=True), [NullRecorder()]
            else:
                policy = algo.make_policy(self.model, actor_index=self.index, num_actors=self.num_actors, seed=seed)
                self.recorders = [algo.make_recorder(self.model, num_envs=width, sender=sender) for _ in range(G)]
            for r in self.recorders:
                r.policy_version = self.policy_version
            what = "evaluating greedily" if self.eval_mode else "acting"
            groups = f" in {G} groups" if G > 1 else ""
            if ready:
                groups = f", acting on the first {batch} ready, chunks of {G} fixed groups of {width}"
            self._say(f"connected to {self.learner}: {K} x {cfg.env.id}{groups}, {what} ({precision}), policy version {self.policy_version}")
            if ready:
                return self._loop_ready(envs[0], ReadyStreams(policy, self.recorders, width), sender)
            return self._loop(envs, policy, sender)
        except LearnerFinished as e:
            self._say(f"learner finished ({e}); exiting")
            return self.env_steps
        finally:
            for env in envs:
                env.close()
            if self.link is not None:
                self.link.finish()
            if self._own_ctx:
                self.ctx.term()

    def _build_model(self, obs_spec, action_spec):
        """The algorithm and the acting model (`self.model`) in actor.precision, with the int8
        paths the config asks for; returns (algorithm, a description of the precision)."""
        cfg = self.config
        try:
            algo = algorithms.get(cfg.algo.name)(cfg, obs_spec, action_spec)
            self.model = algo.build_model()
        except ValueError as e:  # e.g. a CNN for vector observations: the config cannot run here
            raise ConfigError(f"{cfg.env.id}: {e}") from None
        precision = resolve_precision(cfg.actor.precision, torch.device("cpu"))
        if precision == "bf16":
            # The model itself in bf16: the link casts the weights it receives straight into it.
            self.model.to(torch.bfloat16)
        self.model.eval()
        if use_int8(cfg.actor.int8_torso, self.model, torso=True):
            precision += ", int8 torso"
        elif use_int8(cfg.actor.int8_first_conv, self.model):
            precision += ", int8 first conv"
        return algo, precision

    def _loop(self, envs, policy, sender: Sender) -> int:
        """Steps the env groups in turn, every group but one always in flight.

        Each group's actions go to its emulator threads (step_async) as soon as
        the policy has them; then the actor waits for the next group (step_wait),
        records its step (a full chunk goes out from there if the queue has room)
        and acts on it. With G > 1 groups the other G - 1 groups keep the emulator
        busy while the policy runs; a chunk that has to wait for room waits only
        once the group's next step is under way.
        """
        G = len(envs)
        width = envs[0].num_envs
        stats = EpisodeStats(self, sender, G * width)
        streams = [ActorAlgo(policy, r) for r in self.recorders]  # policy state + recorder per group
        for env, stream in zip(envs, streams):
            obs = env.reset()
            stream.begin(obs)
            env.step_async(stream.act(obs))
        g = 0
        while not self.stop.is_set():
            self.link.poll_weights()
            step = envs[g].step_wait()
            frames = streams[g].observe(step)  # chunks that found the queue full
            need = self.recorders[g].version_needed()
            if need is not None and self.link.policy_version < need:
                frames = self._wait_for_version(frames, need, stats)
            envs[g].step_async(streams[g].act(step.obs))
            for frame in frames:
                self.link.send(frame, drop=stats.drop)
            self.env_steps += width
            stats.add(range(g * width, (g + 1) * width), step.reward.tolist(), (step.terminated | step.truncated).tolist())
            g = (g + 1) % G
            if self.max_steps is not None and self.env_steps >= self.max_steps:
                break
        return self.env_steps  # a step still in flight is abandoned: close() stops the env

    def _wait_for_version(self, frames: list, version: int, stats: EpisodeStats) -> list:
        """A synchronous algorithm's actor: sends its chunk, then waits until the learner has
        published `version` (it acts with no older one). Returns the frames left to send."""
        for frame in frames:
            self.link.send(frame, drop=stats.drop)
        self.link.wait_for_version(version)
        return []

    def _loop_ready(self, env, streams: ReadyStreams, sender: Sender) -> int:
        """actor.env_batching first_ready: acts on whichever batch of envs finished first.

        The same loop as `_loop` with one env whose batches are the first W envs
        to finish (ale_py's asynchronous mode); `ReadyStreams` files their steps
        under the fixed groups' recorders. Rows that are an env's first
        observation (after the reset) are acted on but are no step.
        """
        stats = EpisodeStats(self, sender, streams.num_envs)
        ids, obs = env.reset_batch()
        streams.begin(ids, obs)
        env.step_async(streams.act(ids, obs))
        while not self.stop.is_set():
            self.link.poll_weights()
            step = env.step_wait()
            frames, stepped = streams.observe(step)
            need = streams.version_needed()
            if need is not None and self.link.policy_version < need:
                frames = self._wait_for_version(frames, need, stats)
            env.step_async(streams.act(step.env_ids, step.obs))
            for frame in frames:
                self.link.send(frame, drop=stats.drop)
            # In Python lists: a batch is a few rows, and numpy's per-call cost (several calls
            # per batch) was most of this bookkeeping's next to the emulator threads.
            rows = stepped.tolist()  # False: an env's first observation, not a step
            done = (step.terminated | step.truncated).tolist()
            stats.add(step.env_ids.tolist(), step.reward.tolist(), done, rows)
            self.env_steps += sum(rows)
            if self.max_steps is not None and self.env_steps >= self.max_steps:
                break
        return self.env_steps


def make_ready_env(cfg: Config, num_envs: int, batch: int, seed: int):
    """actor.env_batching first_ready's env: the K envs in one ale_py AtariVectorEnv that returns
    batches of the first `batch` to finish. ConfigError where the env is not ale_vector's."""
    from zrl.envs.atari import AleVectorEnv, uses_ale_vector  # lazy: it loads gymnasium, which only Atari actors need

    if not uses_ale_vector(cfg.env):
        raise ConfigError(f"actor.env_batching: first_ready needs ale_py's AtariVectorEnv (an Atari env.id with env.backend "
                          f"auto or ale_vector), not {cfg.env.id!r} with backend {cfg.env.backend}; use groups")
    return AleVectorEnv(cfg.env, num_envs, seed, batch_size=batch)
