"""The sections of a config, one frozen dataclass each, with a docstring on every field.

env, model, actor, learner, run, server and security (the algorithm's own
section lives in its package under zrl.algorithms). Invariants are checked
in `__post_init__` with the reason; zrl.config assembles the sections into a
Config and loads them from YAML. Import-light: no torch, no numpy, no zmq.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar, Optional

from zrl.protocol.endpoints import endpoint_problem
from zrl.typed_config import ConfigError, check

# learner.prefetch_batches auto on a CUDA device (bench/PIPELINE.md, "the learner on a GPU").
AUTO_PREFETCH_CUDA = 2


def _check_endpoint(endpoint: str | None, key: str) -> None:
    problem = bool(endpoint) and endpoint_problem(endpoint, binding=True)  # None or "": derived
    if problem:
        raise ConfigError(f"{key}: {problem}")


def _check_space(d: dict | None, key: str) -> None:
    """A server.*_space spec parses (zrl.spaces, as the agent server will), so a bad one
    fails when the config is loaded, naming its key, not when the server starts."""
    if d is None:  # the spec of env.id
        return
    from zrl import spaces  # lazy: numpy, kept off `zrl --help` and config loading
    try:
        spec = spaces.from_json(d)
    except ValueError as e:  # spaces.SpecError
        raise ConfigError(f"{key}: {e}") from None
    if key == "server.observation_space" and isinstance(spec, spaces.BoxSpec):
        check(spec.dtype in spaces.CLIENT_OBS_DTYPES, key, f"clients send float32 or uint8 observations, not {spec.dtype}")


@dataclass(frozen=True)
class EnvConfig:
    id: str = "CartPole-v1"
    """Gymnasium environment id (Atari ids such as ALE/Pong-v5 need ale-py). Your own env:
    `my_pkg.envs:MyEnv-v0` imports my_pkg.envs (which registers it) and makes MyEnv-v0;
    docs/ENVS.md."""
    packages: tuple[str, ...] = ()
    """Python modules to import before any env is made, in every process (learner, actors,
    agent server, eval): modules that register your own Gymnasium envs. `--env-package PKG`
    sets it. Each must be importable in each process (installed, or on PYTHONPATH)."""
    kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments for gymnasium.make."""
    max_episode_steps: Optional[int] = None
    """Override the env's time limit (episodes are truncated there, and bootstrapped)."""
    backend: str = "auto"
    """auto (Atari ids use ale_vector, others gymnasium), gymnasium, or ale_vector
    (ale_py's C++ AtariVectorEnv, which preprocesses in its own threads)."""
    # Atari preprocessing (DeepMind's), used for ALE ids only:
    frame_skip: int = 4
    """Atari: repeat each action this many frames, max-pooling the last two."""
    noop_max: int = 30
    """Atari: up to this many no-op actions at the start of an episode."""
    frame_stack: int = 4
    """Atari: observations stack the last this many frames."""
    screen_size: int = 84
    """Atari: frames are resized to screen_size x screen_size grayscale."""
    episodic_life: bool = False
    """Atari: a lost life ends the episode for learning (terminated)."""
    repeat_action_probability: float = 0.0
    """Atari: sticky actions (0 for DeepMind's setting; ALE v5 defaults to 0.25)."""
    max_episode_frames: int = 108_000
    """Atari: truncate an episode after this many emulator frames (30 minutes)."""
    num_threads: int = 0
    """Atari ale_vector: emulator threads (0: as many as cores)."""
    thread_nice: int = 5
    """Atari ale_vector: the emulator threads run as batch threads (SCHED_BATCH), this much
    nicer than the thread that creates them, so that the actor's policy is not preempted
    each time it hands the emulators work (0: leave them as they are; Linux only)."""

    def __post_init__(self):
        check(bool(self.id), "env.id", "must name a gymnasium environment")
        check(self.max_episode_steps is None or self.max_episode_steps > 0, "env.max_episode_steps", "must be > 0")
        check(self.backend in ("auto", "gymnasium", "ale_vector"), "env.backend", "must be auto, gymnasium or ale_vector")
        check(self.frame_skip >= 1, "env.frame_skip", "must be >= 1")
        check(self.noop_max >= 0, "env.noop_max", "must be >= 0")
        check(self.frame_stack >= 1, "env.frame_stack", "must be >= 1")
        check(self.screen_size >= 8, "env.screen_size", "must be >= 8")
        check(0.0 <= self.repeat_action_probability <= 1.0, "env.repeat_action_probability", "must be in [0, 1]")
        check(self.max_episode_frames >= 1, "env.max_episode_frames", "must be >= 1")
        check(self.num_threads >= 0, "env.num_threads", "must be >= 0")
        check(0 <= self.thread_nice <= 19, "env.thread_nice", "must be in [0, 19]")


@dataclass(frozen=True)
class ModelConfig:
    network: str = "mlp"
    """Torso: mlp (vector observations), impala_shallow or impala_deep (images, IMPALA's CNNs)."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the MLP torso."""
    activation: str = "tanh"
    """tanh or relu."""
    shared_torso: bool = False
    """One torso for policy and value (True) or one each (False); CNNs always share one."""
    cnn_channels: tuple[int, ...] = (16, 32, 32)
    """impala_deep: channels of its three residual stages."""
    cnn_hidden: int = 256
    """CNNs: width of the fully connected layer after the convolutions."""
    lstm_size: int = 0
    """An LSTM core of this size after the torso (0: none)."""
    normalize_obs: bool = False
    """Standardise observations with a running mean and variance (clipped to +-10), as
    Sample Factory's normalize_input does: the learner keeps the statistics from the
    observations it trains on (A3C: the moments its actors send), sends them with the
    weights and checkpoints them. MLP torsos (vector observations); impala, appo, ppo
    and a3c."""

    def __post_init__(self):
        check(self.network in ("mlp", "impala_shallow", "impala_deep"), "model.network", f"unknown network {self.network!r} (known: mlp, impala_shallow, impala_deep)")
        check(len(self.cnn_channels) >= 1, "model.cnn_channels", "must list at least one channel count (one per residual stage)")
        check(all(c > 0 for c in self.cnn_channels), "model.cnn_channels", "must be > 0")
        check(self.cnn_hidden > 0, "model.cnn_hidden", "must be > 0")
        check(self.lstm_size >= 0, "model.lstm_size", "must be >= 0")
        check(all(h > 0 for h in self.hidden_sizes), "model.hidden_sizes", "widths must be > 0")
        check(self.activation in ("tanh", "relu"), "model.activation", "must be tanh or relu")
        check(not self.normalize_obs or self.network == "mlp", "model.normalize_obs",
              f"needs model.network mlp (vector observations), not {self.network}")


@dataclass(frozen=True)
class ActorConfig:
    num_envs: int = 32
    """K: environments stepped together in one actor process (batched inference)."""
    unroll_length: int = 20
    """T: steps per trajectory chunk (a chunk carries T+1 observations)."""
    send_hwm: int = 1
    """High-water mark of the trajectory PUSH socket, in messages."""
    torch_threads: int = 1
    """Torch intra-op threads in each actor."""
    learner_timeout_s: float = 10.0
    """Deadline of one hello attempt, and how long a send may wait before the actor checks the learner."""
    stats_interval_s: float = 0.25
    """Finished episodes are sent to the learner at most this often."""
    env_groups: int = 1
    """Split the K envs into this many groups stepped in turn, so the policy runs for
    one group while another steps (double-buffered sampling; pays off when the envs
    step in their own threads, as ale_vector's do). Chunks are then K / env_groups wide."""
    env_batching: str = "groups"
    """groups or first_ready: how the policy's batches of K / env_groups envs are made.
    groups: the fixed groups of actor.env_groups, stepped in turn (any env backend).
    first_ready: whichever K / env_groups envs finished their step first (ale_py's
    asynchronous AtariVectorEnv, env.backend ale_vector only), so the emulator threads
    never wait for the slowest env of a group while the policy runs; chunks are still
    the fixed groups' (zrl.actors.streams). The emulator threads idle far less than with
    fixed groups (bench/PIPELINE.md)."""
    act_batch: int = 0
    """With env_batching first_ready: how many envs the policy acts on at once, the first
    that many to finish a step (0: K / env_groups, a chunk's width; else 1 to K - 1).
    Chunks stay the fixed groups' whatever it is. Larger batches spread the actor
    thread's per-batch work (Python, the policy's fixed costs) over more env steps."""
    backpressure: str = "block"
    """When the learner cannot take more data: block (stop stepping until it can) or
    drop (keep stepping, drop the chunk, count it). Either way memory stays flat."""
    precision: str = "fp32"
    """fp32, bf16 or auto: the precision the actor's policy runs in. With bf16 the actor's
    model is bfloat16 and the weights it receives are cast into it on arrival; the
    recorded log mu(a|x) is that model's, so V-trace corrects for the difference.
    auto: bf16 where the CPU does it natively (AVX-512 BF16 or AMX), else fp32. It
    pays off for CNNs (a quarter less CPU per forward pass next to the emulator
    threads); tiny MLPs gain nothing."""
    int8_first_conv: bool | str = False
    """true, false or auto: a CNN policy's first convolution acts on the uint8 pixels
    with int8 weights (per output channel; oneDNN's int8 convolution, the rest of the
    network in actor.precision). The pixels are exact in uint8, so only the weights
    are rounded, to 1/254 of each channel's largest (~1% error in the conv's output,
    about twice bf16's; 1/126 on CPUs without int8 dot products, whose int8 kernels
    sum pairs of products in int16); the recorded log mu(a|x) is the acting model's,
    so V-trace corrects for the difference. auto: on x86 CPUs with AVX2 or newer where
    PyTorch's oneDNN int8 conv passes a probe (speed-ups: bench/PIPELINE.md). true where
    that does not hold is an error; models without a CNN ignore it."""

    int8_torso: bool | str = False
    """true, false or auto: a shallow CNN policy (model.network impala_shallow) acts in
    int8 end to end: both convolutions and the FC take 8-bit activations and int8
    weights, each layer's activation scale calibrated on the frames being acted on
    (on every weights update and every 128 calls; see zrl.models.int8_torso.Int8Torso),
    where int8_first_conv quantizes only the first conv's weights. The recorded
    log mu(a|x) is the acting model's, so V-trace corrects for the difference.
    auto: where int8_first_conv's auto would hold. On CPUs with AVX2 but no int8 dot
    products the layers run in zrl's own AVX2 kernel (`_core.int8_layer`), elsewhere in
    oneDNN's (speed-ups and the cost per weights update: bench/PIPELINE.md). A CNN it
    does not fit (the deep ResNet) gets int8_first_conv instead; true where the CPU
    or PyTorch has no int8 convolution is an error."""

    def __post_init__(self):
        check(self.backpressure in ("block", "drop"), "actor.backpressure", "must be block or drop")
        check(self.env_batching in ("groups", "first_ready"), "actor.env_batching", f"must be groups or first_ready; got {self.env_batching!r}")
        check(self.int8_torso in (True, False, "auto"), "actor.int8_torso", "must be true, false or auto")
        check(self.precision in ("fp32", "bf16", "auto"), "actor.precision", "must be fp32, bf16 or auto")
        check(self.int8_first_conv in (True, False, "auto"), "actor.int8_first_conv", "must be true, false or auto")
        check(self.env_groups >= 1 and self.num_envs % self.env_groups == 0, "actor.env_groups",
               f"must be >= 1 and divide actor.num_envs ({self.num_envs}); got {self.env_groups}")
        check(self.num_envs >= 1, "actor.num_envs", "must be >= 1")
        check(self.act_batch == 0 or 1 <= self.act_batch < self.num_envs, "actor.act_batch",
               f"must be 0 (a chunk's width) or 1 to actor.num_envs - 1 ({self.num_envs - 1}); got {self.act_batch}")
        check(self.unroll_length >= 1, "actor.unroll_length", "must be >= 1")
        check(self.send_hwm >= 1, "actor.send_hwm", "must be >= 1")
        check(self.torch_threads >= 1, "actor.torch_threads", "must be >= 1")
        check(self.learner_timeout_s > 0, "actor.learner_timeout_s", "must be > 0")
        check(self.stats_interval_s >= 0, "actor.stats_interval_s", "must be >= 0")


@dataclass(frozen=True)
class LearnerConfig:
    infinity_allowed: ClassVar[frozenset[str]] = frozenset({"max_grad_norm", "max_abs_return"})  # .inf: no limit
    batch_size: int = 64
    """B: env columns per training batch ([T, B]); a multiple of every actor's num_envs."""
    optimizer: str = "adam"
    """adam or rmsprop. Losses are means over the batch (not sums, as in the IMPALA
    paper), so RMSProp needs a much smaller eps than the paper's 0.01."""
    learning_rate: float = 1e-3
    lr_decay_env_steps: Optional[int] = None
    """Decay the learning rate linearly over this many env steps (None: constant)."""
    lr_final_scale: float = 0.0
    """Where the decay ends, as a fraction of learning_rate; it stays there afterwards."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    rmsprop_alpha: float = 0.99
    rmsprop_eps: float = 0.01
    rmsprop_momentum: float = 0.0
    max_grad_norm: float = 40.0
    """Clip the global gradient norm to this."""
    publish_interval: int = 1
    """Publish weights every this many updates."""
    queue_size: int = 2
    """Received chunks buffered before the receiver stops reading (back-pressure)."""
    pull_hwm: int = 2
    """High-water mark of the trajectory PULL socket, in messages."""
    prefetch_batches: int | str = "auto"
    """0: the training loop joins each batch itself, between updates. N >= 1: a thread of
    its own joins batches (and starts their copies to the GPU) up to N ahead, beside the
    updates: meant for a GPU learner with cores to spare (on-policy algorithms; a replay
    learner samples in line). Each batch held ahead adds to the policy lag. auto: 2 on a
    CUDA device, 0 on a CPU (measured: bench/PIPELINE.md, "the learner on a GPU")."""
    device: str = "auto"
    """auto (cuda if available), cpu or cuda[:N]."""
    torch_threads: int = 1
    """Torch intra-op threads of the learner on CPU."""
    precision: str = "fp32"
    """fp32; bf16: the learner's forward passes under bfloat16 autocast (weights,
    gradients, optimiser and the losses after the network stay fp32); auto: bf16
    where the hardware does it natively (a CPU with AVX-512 BF16 or AMX, a CUDA
    device with bf16), else fp32. On such a CPU bf16 about halves a CNN update;
    elsewhere it is emulated and slower. Actors: actor.precision."""
    checkpoint_interval_s: float = 300.0
    """Write a checkpoint this often (also on SIGINT/SIGTERM and at the end)."""
    keep_checkpoints: int = 3
    """How many of the newest checkpoints to keep; checkpoints/best.pt, the one saved with
    the highest mean return, is kept besides them."""
    log_interval_s: float = 2.0
    """Console progress line and TensorBoard scalars this often."""
    max_message_bytes: int = 64 * 1024 * 1024
    """Messages larger than this are dropped (counted as too_large)."""
    trajectory_bind: Optional[str] = None
    """Endpoint of the trajectory PULL socket (default: derived from --bind, any free port)."""
    weights_bind: Optional[str] = None
    """Endpoint of the weights PUB socket (default: derived from --bind, any free port)."""
    actor_timeout_s: float = 30.0
    """An actor silent for this long no longer counts as connected (and its sender id
    may be reused once learner.max_senders is reached)."""
    # The control endpoint is the one socket every peer reaches first: these bound what a
    # stranger can make the learner hold (docs/DEPLOY.md, "what the defaults protect").
    max_hello_bytes: int = 64 * 1024
    """Control messages (hellos) larger than this are cut off by ZeroMQ before they are
    read into memory; the connection is dropped and counted (control_dropped)."""
    control_hwm: int = 4
    """Per peer on the control socket: hellos queued in, and replies queued out to a peer
    that does not read them; replies beyond it are dropped and counted (reply_unread)."""
    max_senders: int = 4096
    """Sender ids handed out in hello replies, live at once (actors, agent servers, the
    evaluation actor). When full, the id silent longest (beyond actor_timeout_s) is
    reused; with none silent, hellos are refused (too_many_senders)."""
    new_senders_per_s: float = 200.0
    """New sender ids handed out per second, on average (a token bucket)."""
    new_senders_burst: int = 1024
    """New sender ids that may be handed out at once, before new_senders_per_s applies."""
    max_abs_return: float = 1e7
    """Episode returns in actors' stats beyond +-this are refused as implausible (.inf: any finite one)."""
    num_learners: int = 1
    """Learner processes that train as one (zrl.learner.group; IMPALA and APPO): `zrl run`
    spreads the actors over them, each trains on its share of every batch (batch_size is
    the global batch, split evenly) and their gradients are averaged, so all take the same
    step. The first publishes to its actors, checkpoints and writes the summary; the
    others publish the same weights to theirs."""
    group_timeout_s: float = 60.0
    """How long a learner of a group waits for the others (to join, or at each update)
    before it gives up: a learner that dies stops the group within this."""

    def prefetch_for(self, device) -> int:
        """prefetch_batches resolved for a learner on `device` (a torch.device)."""
        if self.prefetch_batches == "auto":
            return AUTO_PREFETCH_CUDA if device.type == "cuda" else 0
        return self.prefetch_batches

    def __post_init__(self):
        check(self.batch_size >= 1, "learner.batch_size", "must be >= 1")
        check(self.num_learners >= 1, "learner.num_learners", "must be >= 1")
        check(self.batch_size % self.num_learners == 0, "learner.batch_size",
              f"must be a multiple of learner.num_learners ({self.num_learners}): each learner trains on an equal share")
        check(self.group_timeout_s > 0, "learner.group_timeout_s", "must be > 0")
        check(self.optimizer in ("adam", "rmsprop"), "learner.optimizer", "must be adam or rmsprop")
        check(self.learning_rate > 0, "learner.learning_rate", "must be > 0")
        check(self.lr_decay_env_steps is None or self.lr_decay_env_steps > 0, "learner.lr_decay_env_steps", "must be > 0")
        check(0.0 <= self.lr_final_scale <= 1.0, "learner.lr_final_scale", "must be in [0, 1]")
        check(self.max_grad_norm > 0, "learner.max_grad_norm", "must be > 0")
        # torch.optim.Adam / RMSprop's own checks, here so that a bad value fails when the config
        # loads, not when the learner builds its optimiser; eps must be > 0 (torch takes 0, which
        # divides by zero where a gradient's running average is 0)
        for i, beta in enumerate(self.adam_betas):
            check(0.0 <= beta < 1.0, "learner.adam_betas", f"each beta must be in [0, 1); got {beta} at index {i}")
        check(self.adam_eps > 0, "learner.adam_eps", "must be > 0")
        check(0.0 <= self.rmsprop_alpha <= 1.0, "learner.rmsprop_alpha", "must be in [0, 1]")
        check(self.rmsprop_eps > 0, "learner.rmsprop_eps", "must be > 0")
        check(self.rmsprop_momentum >= 0, "learner.rmsprop_momentum", "must be >= 0")
        check(self.publish_interval >= 1, "learner.publish_interval", "must be >= 1")
        check(self.queue_size >= 1, "learner.queue_size", "must be >= 1")
        check(self.pull_hwm >= 1, "learner.pull_hwm", "must be >= 1")
        check(self.prefetch_batches == "auto" or (isinstance(self.prefetch_batches, int) and not isinstance(self.prefetch_batches, bool)
                                                   and 0 <= self.prefetch_batches <= 8),
               "learner.prefetch_batches", f"must be auto or an integer in [0, 8], not {self.prefetch_batches!r}")
        check(re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device) is not None, "learner.device", f"must be auto, cpu or cuda[:N], not {self.device!r}")
        check(self.torch_threads >= 1, "learner.torch_threads", "must be >= 1")
        check(self.precision in ("fp32", "bf16", "auto"), "learner.precision", "must be fp32, bf16 or auto")
        for key in ("trajectory_bind", "weights_bind"):
            _check_endpoint(getattr(self, key), f"learner.{key}")
        check(self.checkpoint_interval_s > 0, "learner.checkpoint_interval_s", "must be > 0")
        check(self.keep_checkpoints >= 1, "learner.keep_checkpoints", "must be >= 1")
        check(self.log_interval_s > 0, "learner.log_interval_s", "must be > 0")
        check(self.max_message_bytes >= 4096, "learner.max_message_bytes", "must be >= 4096")
        check(self.actor_timeout_s > 0, "learner.actor_timeout_s", "must be > 0")
        check(self.max_hello_bytes >= 4096, "learner.max_hello_bytes", "must be >= 4096")
        check(self.control_hwm >= 1, "learner.control_hwm", "must be >= 1")
        check(self.max_senders >= 1, "learner.max_senders", "must be >= 1")
        check(self.new_senders_per_s > 0, "learner.new_senders_per_s", "must be > 0")
        check(self.new_senders_burst >= 1, "learner.new_senders_burst", "must be >= 1")
        check(self.max_abs_return > 0, "learner.max_abs_return", "must be > 0")


MAX_SEED = (2**31 - 10_000 - 1) // 10_000  # the largest run.seed: seed * 10_000 + 10_000 < 2**31


@dataclass(frozen=True)
class RunConfig:
    infinity_allowed: ClassVar[frozenset[str]] = frozenset({"stop_at_return", "max_seconds"})  # .inf: no limit
    num_actors: int = 2
    """Actor processes started by `zrl run`."""
    seed: int = 1
    """Base seed: actor i, with K envs, seeds its envs and sampling with seed * 10_000 + i * K
    (+ 5_000 for the evaluation actor), its env k with that + k. In [0, 214_747], so that
    env seeds stay below 2**31 (ale_py takes int32 seeds)."""
    logdir: Optional[str] = None
    """Where runs of this config go: each run without `--logdir` writes its TensorBoard
    events, checkpoints, config.yaml and summary.json to a new directory <UTC time>/ in
    it, and `--resume` without `--logdir` continues the newest one. None:
    runs/<config file's name>. `--logdir DIR` names the run's directory itself."""
    stop_at_return: Optional[float] = None
    """Stop once return_window episodes have finished and their mean return reaches this."""
    return_window: int = 100
    """Episodes in the moving mean return."""
    max_seconds: Optional[float] = None
    """Stop after this many seconds of training."""
    max_env_steps: Optional[int] = None
    """Stop after this many env steps."""
    eval_actor: bool = False
    """`zrl run` also starts a greedy evaluation actor that feeds no data; the mean
    return (stop_at_return, summary.json) is then the evaluation actors' return.
    Value-based algorithms need it: their exploring actors cannot score the target."""
    eval_num_envs: int = 8
    """Environments of the evaluation actor."""
    agent_server: bool = False
    """`zrl run` also starts an agent server (`zrl serve`) bound at server.bind."""

    def __post_init__(self):
        check(self.num_actors >= 0, "run.num_actors", "must be >= 0")
        check(0 <= self.seed and self.seed * 10_000 + 10_000 < 2**31, "run.seed",
               f"must be in [0, {MAX_SEED}] (actors seed their envs from seed * 10_000 + up to 10_000, which must stay "
               f"below 2**31); got {self.seed}")
        check(self.eval_num_envs >= 1, "run.eval_num_envs", "must be >= 1")
        check(self.return_window >= 1, "run.return_window", "must be >= 1")
        check(self.max_seconds is None or self.max_seconds > 0, "run.max_seconds", "must be > 0")
        check(self.max_env_steps is None or self.max_env_steps > 0, "run.max_env_steps", "must be > 0")


@dataclass(frozen=True)
class ServerConfig:
    """The agent server (`zrl serve`) for simulators that embed a zrl client."""

    bind: str = "tcp://127.0.0.1:5557"
    """Endpoint (ROUTER) that clients connect to."""
    observation_space: Optional[dict] = None
    """Observation spec clients must declare, e.g. {type: box, shape: [4], dtype: float32}
    (default: the spec of env.id)."""
    action_space: Optional[dict] = None
    """Action spec, e.g. {type: discrete, n: 2} (default: the spec of env.id)."""
    max_batch: int = 256
    """Most requests read in one loop iteration; those that need an action are answered
    by one forward pass."""
    client_timeout_s: float = 60.0
    """A client silent for this long is dropped with its partial trajectory."""
    max_clients: int = 4096
    """Live sessions at most. When full, a hello evicts the session that has waited longest
    for its first ACT; with none such (every session is acting), it is refused (server_full).
    An acting session is never evicted for a newcomer."""
    first_act_timeout_s: float = 10.0
    """A session that sends no ACT within this many seconds of its hello is dropped
    (first_act_timeout). Clients send their first ACT right after the hello."""
    new_sessions_per_s: float = 200.0
    """New sessions opened per second, on average (a token bucket); hellos beyond it are
    refused (hello_rate), and a client may say hello again a moment later."""
    new_sessions_burst: int = 1024
    """New sessions that may open at once before new_sessions_per_s applies (the default
    lets 1,024 clients start together)."""
    client_hwm: int = 16
    """Per client: requests queued in, and replies queued out to a client that does not read
    them; replies beyond it are dropped and counted (reply_unread)."""
    index: int = 1000
    """The server's index in its hello to the learner (shown in the learner's logs; the
    learner hands out the sender id its frames carry)."""
    backlog: int = 64
    """Trajectory messages kept while the learner applies back-pressure; the oldest are dropped beyond it."""
    native_loop: bool = True
    """Serve routine ACTs (mid-episode steps) in C++ where the policy allows it (an MLP
    actor-critic without LSTM, IMPALA or APPO, float32 observations; zrl.server.fast_path);
    false: every request takes the Python path. Both draw from the same policy, record the
    same steps and refuse the same requests."""
    native_budget_ms: float = 5.0
    """The longest the C++ loop serves before Python's periodic work (new weights, the
    backlog to the learner, session timeouts) runs again."""

    def __post_init__(self):
        check(self.max_batch >= 1, "server.max_batch", "must be >= 1")
        check(self.native_budget_ms > 0, "server.native_budget_ms", "must be > 0")
        check(self.client_timeout_s > 0, "server.client_timeout_s", "must be > 0")
        check(self.max_clients >= 1, "server.max_clients", "must be >= 1")
        check(self.first_act_timeout_s > 0, "server.first_act_timeout_s", "must be > 0")
        check(self.new_sessions_per_s > 0, "server.new_sessions_per_s", "must be > 0")
        check(self.new_sessions_burst >= 1, "server.new_sessions_burst", "must be >= 1")
        check(0 <= self.index < 2**32, "server.index", "must be in [0, 2**32)")
        check(self.backlog >= 1, "server.backlog", "must be >= 1")
        check(self.client_hwm >= 1, "server.client_hwm", "must be >= 1")
        _check_endpoint(self.bind, "server.bind")
        for key in ("observation_space", "action_space"):
            _check_space(getattr(self, key), f"server.{key}")


@dataclass(frozen=True)
class SecurityConfig:
    """CURVE encryption and authentication on every socket (off by default).

    Key files are ZeroMQ certificates as `zrl keys generate DIR` writes them
    (zmq.auth's format). The learner and the agent server are CURVE servers:
    they hold `server_secret_key`. Each admits only its own role's peers:
    the learner's sockets the actors and agent servers in `authorized_keys`,
    the agent server's client socket the simulator clients in `client_keys`.
    Actors and the agent server towards the learner hold `client_secret_key`
    and check the server against `server_public_key`. A peer whose key is not
    in the socket's allow-list gets nothing in and nothing out (docs/DEPLOY.md,
    the trust model).
    """

    curve: bool = False
    """Turn CURVE on for every socket."""
    server_secret_key: Optional[str] = None
    """Learner / agent server: its secret key file (e.g. keys/server.key_secret)."""
    authorized_keys: Optional[str] = None
    """Learner: a folder of the public keys (*.key) of actors and agent servers, the peers its
    control, trajectory and weights sockets admit (e.g. keys/actors)."""
    client_keys: Optional[str] = None
    """Agent server: a folder of the public keys (*.key) of simulator clients, the peers its
    client socket admits (e.g. keys/clients); required when an agent server runs with CURVE."""
    server_public_key: Optional[str] = None
    """Actors, the agent server's learner link: the server's public key file (e.g. keys/server.key)."""
    client_secret_key: Optional[str] = None
    """Actors, the agent server's learner link: their secret key file (e.g. keys/actor.key_secret);
    its public key must be in the learner's authorized_keys."""

    def __post_init__(self):
        if self.curve:
            for k in ("server_secret_key", "authorized_keys", "server_public_key", "client_secret_key"):
                check(getattr(self, k) is not None, f"security.{k}", "is required when security.curve is true (make keys with `zrl keys generate DIR`)")
