"""One typed configuration shared by every zrl process.

A config is a YAML file with one mapping per section (`env`, `model`, `algo`,
`actor`, `learner`, `run`); each section is a frozen dataclass below with a
comment on every field. `algo.name` selects the algorithm, and the remaining
`algo` keys are that algorithm's hyper-parameters (`ALGO_CONFIGS`). Unknown
keys and wrong types are errors that name the key and the file; invariants
are checked in `__post_init__` with the reason. `-o section.key=value`
overrides (values parsed as YAML) are applied before validation.

Everything here is import-light (no torch), so the CLI can validate a config
before starting any process.
"""
from __future__ import annotations

import dataclasses
import decimal
import hashlib
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import yaml

__all__ = [
    "ConfigError",
    "Config",
    "EnvConfig",
    "ModelConfig",
    "ImpalaConfig",
    "ApexDQNConfig",
    "ActorConfig",
    "LearnerConfig",
    "RunConfig",
    "ServerConfig",
    "SecurityConfig",
    "ALGO_CONFIGS",
    "load_config",
    "config_from_dict",
    "default_config_path",
]


class ConfigError(ValueError):
    """A bad config: the message names the file and the key."""


def _check(cond: bool, key: str, why: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {why}")


def _check_endpoint(endpoint: str | None, key: str) -> None:
    from zrl.transport import endpoint_problem

    problem = bool(endpoint) and endpoint_problem(endpoint, binding=True)  # None or "": derived
    if problem:
        raise ConfigError(f"{key}: {problem}")


def _check_space(d: dict | None, key: str) -> None:
    """A server.*_space spec parses (zrl.spaces, as the agent server will), so a bad one
    fails when the config is loaded, naming its key, not when the server starts."""
    from zrl import spaces

    if d is None:  # the spec of env.id
        return
    try:
        spec = spaces.from_json(d)
    except ValueError as e:  # spaces.SpecError
        raise ConfigError(f"{key}: {e}") from None
    if key == "server.observation_space" and isinstance(spec, spaces.BoxSpec):
        _check(spec.dtype in spaces.CLIENT_OBS_DTYPES, key, f"clients send float32 or uint8 observations, not {spec.dtype}")


@dataclass(frozen=True)
class EnvConfig:
    id: str = "CartPole-v1"
    """Gymnasium environment id (Atari ids such as ALE/Pong-v5 need ale-py)."""
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
        _check(bool(self.id), "env.id", "must name a gymnasium environment")
        _check(self.max_episode_steps is None or self.max_episode_steps > 0, "env.max_episode_steps", "must be > 0")
        _check(self.backend in ("auto", "gymnasium", "ale_vector"), "env.backend", "must be auto, gymnasium or ale_vector")
        _check(self.frame_skip >= 1, "env.frame_skip", "must be >= 1")
        _check(self.noop_max >= 0, "env.noop_max", "must be >= 0")
        _check(self.frame_stack >= 1, "env.frame_stack", "must be >= 1")
        _check(self.screen_size >= 8, "env.screen_size", "must be >= 8")
        _check(0.0 <= self.repeat_action_probability <= 1.0, "env.repeat_action_probability", "must be in [0, 1]")
        _check(self.max_episode_frames >= 1, "env.max_episode_frames", "must be >= 1")
        _check(self.num_threads >= 0, "env.num_threads", "must be >= 0")
        _check(0 <= self.thread_nice <= 19, "env.thread_nice", "must be in [0, 19]")


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

    def __post_init__(self):
        _check(self.network in ("mlp", "impala_shallow", "impala_deep"), "model.network", f"unknown network {self.network!r} (known: mlp, impala_shallow, impala_deep)")
        _check(len(self.cnn_channels) >= 1, "model.cnn_channels", "must list at least one channel count (one per residual stage)")
        _check(all(c > 0 for c in self.cnn_channels), "model.cnn_channels", "must be > 0")
        _check(self.cnn_hidden > 0, "model.cnn_hidden", "must be > 0")
        _check(self.lstm_size >= 0, "model.lstm_size", "must be >= 0")
        _check(all(h > 0 for h in self.hidden_sizes), "model.hidden_sizes", "widths must be > 0")
        _check(self.activation in ("tanh", "relu"), "model.activation", "must be tanh or relu")


@dataclass(frozen=True)
class ImpalaConfig:
    """IMPALA: V-trace actor-critic on a stream of fresh trajectories."""

    name: str = "impala"
    discount: float = 0.99
    """gamma."""
    vtrace_lambda: float = 1.0
    """lambda of V-trace's traces (c_i = lambda * min(c bar, pi/mu))."""
    clip_rho_threshold: Optional[float] = 1.0
    """rho bar (None: no clipping)."""
    clip_pg_rho_threshold: Optional[float] = 1.0
    """rho bar of the policy-gradient advantage (None: no clipping)."""
    clip_c_threshold: Optional[float] = 1.0
    """c bar (None: no clipping)."""
    baseline_cost: float = 0.5
    """Weight of the value loss 0.5 * (vs - V)^2."""
    entropy_cost: float = 0.01
    """Weight of the entropy bonus."""
    reward_clip: Optional[float] = None
    """Clip rewards to [-x, x] on the learner (None: no clipping)."""
    reward_scale: float = 1.0
    """Multiply rewards by this on the learner, after clipping, so that the value net fits
    returns of a smaller size: Adam moves each weight by about the learning rate per step,
    so values in the hundreds take thousands of updates to reach. Episode returns in logs
    and stop targets stay unscaled; values and losses (vtrace/mean_vs, loss/baseline) are
    in scaled units."""
    normalize_advantages: bool = False
    """Standardise policy-gradient advantages over the batch."""

    def __post_init__(self):
        _check(0.0 <= self.discount <= 1.0, "algo.discount", "must be in [0, 1]")
        _check(0.0 <= self.vtrace_lambda <= 1.0, "algo.vtrace_lambda", "must be in [0, 1]")
        for k in ("clip_rho_threshold", "clip_pg_rho_threshold", "clip_c_threshold"):
            v = getattr(self, k)
            _check(v is None or v > 0, f"algo.{k}", "must be > 0 or null")
        _check(self.baseline_cost >= 0, "algo.baseline_cost", "must be >= 0")
        _check(self.entropy_cost >= 0, "algo.entropy_cost", "must be >= 0")
        _check(self.reward_clip is None or self.reward_clip > 0, "algo.reward_clip", "must be > 0 or null")
        _check(0 < self.reward_scale < math.inf, "algo.reward_scale", "must be > 0 and finite")


@dataclass(frozen=True)
class ApexDQNConfig:
    """Ape-X DQN (Horgan et al. 2018): many epsilon-greedy actors, one prioritised replay."""

    uses_replay = True  # not a field: the learner samples from replay, not from a stream
    lstm_core = False  # not a field: its Q-network has no LSTM core (model.lstm_size must be 0)
    name: str = "apex_dqn"
    discount: float = 0.99
    """gamma."""
    n_step: int = 3
    """Returns over n steps, computed at the actor."""
    double_q: bool = True
    """Double DQN targets: the online net picks a*, the target net scores it."""
    dueling: bool = True
    """Dueling head: V(s) + A(s, a) - mean_a A(s, a)."""
    batch_size: int = 256
    """Transitions sampled per update."""
    target_update_interval: int = 500
    """Copy the online net into the target net every this many updates."""
    replay_capacity: int = 100_000
    """Transitions kept (FIFO eviction)."""
    min_replay_size: int = 2_000
    """Learning starts once the replay holds this many transitions."""
    priority_alpha: float = 0.6
    """Prioritisation exponent alpha (0: uniform)."""
    priority_beta: float = 0.4
    """Importance-sampling exponent beta."""
    priority_eps: float = 1e-6
    """Added to |TD error| so that no priority is 0."""
    eps_base: float = 0.4
    """Actor i of N explores with eps_base ** (1 + eps_alpha * i / (N - 1)); one actor uses eps_base."""
    eps_alpha: float = 7.0
    huber_delta: float = 1.0
    """Huber loss threshold on the TD error."""
    reward_scale: float = 1.0
    """Multiply the n-step rewards by this in the TD targets (learner) and the initial
    priorities (actors), so that Q-values are of a smaller size (as algo.reward_scale of
    IMPALA). Episode returns in logs and stop targets stay unscaled; Q-values and TD errors
    (q/mean, q/td_abs, priorities) are in scaled units."""
    replay_checkpoint: bool = False
    """Save the replay contents with each checkpoint and restore them on resume (into a
    replay of another replay_capacity or priority_alpha too: oldest first, with their raw
    priorities, the newest kept if it is smaller)."""
    max_transitions_per_message: int = 4096
    """Largest batch of transitions one actor message may carry."""

    def __post_init__(self):
        _check(0.0 <= self.discount <= 1.0, "algo.discount", "must be in [0, 1]")
        _check(self.n_step >= 1, "algo.n_step", "must be >= 1")
        _check(self.batch_size >= 1, "algo.batch_size", "must be >= 1")
        _check(self.target_update_interval >= 1, "algo.target_update_interval", "must be >= 1")
        _check(self.replay_capacity >= 1, "algo.replay_capacity", "must be >= 1")
        _check(1 <= self.min_replay_size <= self.replay_capacity, "algo.min_replay_size", "must be in [1, replay_capacity]")
        _check(self.priority_alpha >= 0, "algo.priority_alpha", "must be >= 0")
        _check(0.0 <= self.priority_beta <= 1.0, "algo.priority_beta", "must be in [0, 1]")
        _check(self.priority_eps > 0, "algo.priority_eps", "must be > 0")
        _check(0.0 <= self.eps_base <= 1.0, "algo.eps_base", "must be in [0, 1]")
        _check(self.eps_alpha >= 0, "algo.eps_alpha", "must be >= 0")
        _check(self.huber_delta > 0, "algo.huber_delta", "must be > 0")
        _check(0 < self.reward_scale < math.inf, "algo.reward_scale", "must be > 0 and finite")
        _check(self.max_transitions_per_message >= 1, "algo.max_transitions_per_message", "must be >= 1")


# algo.name -> its hyper-parameter dataclass. An algorithm adds itself here and
# one file under zrl/learner/algorithms/.
ALGO_CONFIGS: dict[str, type] = {"impala": ImpalaConfig, "apex_dqn": ApexDQNConfig}


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
    the fixed groups' (zrl.actors.streams). On 2 cores with Pong (24 envs, batches of
    8) the emulator threads idle ~0.02 cores against ~0.2 for 3 fixed groups."""
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
    PyTorch's oneDNN int8 conv passes a probe. On 2 cores with Pong's shallow CNN, a
    bf16 actor's act() on 8 frames 333 -> 275 us (AVX-512 VNNI). true where that does
    not hold is an error; models without a CNN ignore it."""

    int8_torso: bool | str = False
    """true, false or auto: a shallow CNN policy (model.network impala_shallow) acts in
    int8 end to end: both convolutions and the FC take 8-bit activations and int8
    weights, each layer's activation scale calibrated on the frames being acted on
    (on every weights update and every 128 calls; see zrl.models.cnn.Int8Torso),
    where int8_first_conv quantizes only the first conv's weights. The recorded
    log mu(a|x) is the acting model's, so V-trace corrects for the difference.
    auto: where int8_first_conv's auto would hold. On CPUs with AVX2 but no int8 dot
    products the layers run in zrl's own AVX2 kernel (`_core.int8_layer`), elsewhere in
    oneDNN's. On 2 cores with Pong, the torso on 8 frames ~265 -> ~195 us (bf16 -> int8,
    AVX-512 VNNI, oneDNN) and ~1,000 -> ~350 us (fp32 -> int8, AVX2 only: zrl's kernel;
    oneDNN's int8 took ~600), at ~0.8 ms (AVX-512 VNNI) to ~4 ms (AVX2 only) per weights
    update received. A CNN it
    does not fit (the deep ResNet) gets int8_first_conv instead; true where the CPU
    or PyTorch has no int8 convolution is an error."""

    def __post_init__(self):
        _check(self.backpressure in ("block", "drop"), "actor.backpressure", "must be block or drop")
        _check(self.env_batching in ("groups", "first_ready"), "actor.env_batching", f"must be groups or first_ready; got {self.env_batching!r}")
        _check(self.int8_torso in (True, False, "auto"), "actor.int8_torso", "must be true, false or auto")
        _check(self.precision in ("fp32", "bf16", "auto"), "actor.precision", "must be fp32, bf16 or auto")
        _check(self.int8_first_conv in (True, False, "auto"), "actor.int8_first_conv", "must be true, false or auto")
        _check(self.env_groups >= 1 and self.num_envs % self.env_groups == 0, "actor.env_groups",
               f"must be >= 1 and divide actor.num_envs ({self.num_envs}); got {self.env_groups}")
        _check(self.num_envs >= 1, "actor.num_envs", "must be >= 1")
        _check(self.act_batch == 0 or 1 <= self.act_batch < self.num_envs, "actor.act_batch",
               f"must be 0 (a chunk's width) or 1 to actor.num_envs - 1 ({self.num_envs - 1}); got {self.act_batch}")
        _check(self.unroll_length >= 1, "actor.unroll_length", "must be >= 1")
        _check(self.send_hwm >= 1, "actor.send_hwm", "must be >= 1")
        _check(self.torch_threads >= 1, "actor.torch_threads", "must be >= 1")
        _check(self.learner_timeout_s > 0, "actor.learner_timeout_s", "must be > 0")
        _check(self.stats_interval_s >= 0, "actor.stats_interval_s", "must be >= 0")


@dataclass(frozen=True)
class LearnerConfig:
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
    """How many checkpoints to keep."""
    log_interval_s: float = 2.0
    """Console progress line and TensorBoard scalars this often."""
    max_message_bytes: int = 64 * 1024 * 1024
    """Messages larger than this are dropped (counted as too_large)."""
    trajectory_bind: Optional[str] = None
    """Endpoint of the trajectory PULL socket (default: derived from --bind, any free port)."""
    weights_bind: Optional[str] = None
    """Endpoint of the weights PUB socket (default: derived from --bind, any free port)."""
    actor_timeout_s: float = 30.0
    """An actor silent for this long no longer counts as connected."""

    def prefetch_for(self, device) -> int:
        """prefetch_batches resolved for a learner on `device` (a torch.device)."""
        if self.prefetch_batches == "auto":
            return AUTO_PREFETCH_CUDA if device.type == "cuda" else 0
        return self.prefetch_batches

    def __post_init__(self):
        _check(self.batch_size >= 1, "learner.batch_size", "must be >= 1")
        _check(self.optimizer in ("adam", "rmsprop"), "learner.optimizer", "must be adam or rmsprop")
        _check(self.learning_rate > 0, "learner.learning_rate", "must be > 0")
        _check(self.lr_decay_env_steps is None or self.lr_decay_env_steps > 0, "learner.lr_decay_env_steps", "must be > 0")
        _check(0.0 <= self.lr_final_scale <= 1.0, "learner.lr_final_scale", "must be in [0, 1]")
        _check(self.max_grad_norm > 0, "learner.max_grad_norm", "must be > 0")
        # torch.optim.Adam / RMSprop's own checks, here so that a bad value fails when the config
        # loads, not when the learner builds its optimiser; eps must be > 0 (torch takes 0, which
        # divides by zero where a gradient's running average is 0)
        for i, beta in enumerate(self.adam_betas):
            _check(0.0 <= beta < 1.0, "learner.adam_betas", f"each beta must be in [0, 1); got {beta} at index {i}")
        _check(self.adam_eps > 0, "learner.adam_eps", "must be > 0")
        _check(0.0 <= self.rmsprop_alpha <= 1.0, "learner.rmsprop_alpha", "must be in [0, 1]")
        _check(self.rmsprop_eps > 0, "learner.rmsprop_eps", "must be > 0")
        _check(self.rmsprop_momentum >= 0, "learner.rmsprop_momentum", "must be >= 0")
        _check(self.publish_interval >= 1, "learner.publish_interval", "must be >= 1")
        _check(self.queue_size >= 1, "learner.queue_size", "must be >= 1")
        _check(self.pull_hwm >= 1, "learner.pull_hwm", "must be >= 1")
        _check(self.prefetch_batches == "auto" or (isinstance(self.prefetch_batches, int) and not isinstance(self.prefetch_batches, bool)
                                                   and 0 <= self.prefetch_batches <= 8),
               "learner.prefetch_batches", f"must be auto or an integer in [0, 8], not {self.prefetch_batches!r}")
        _check(re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device) is not None, "learner.device", f"must be auto, cpu or cuda[:N], not {self.device!r}")
        _check(self.torch_threads >= 1, "learner.torch_threads", "must be >= 1")
        _check(self.precision in ("fp32", "bf16", "auto"), "learner.precision", "must be fp32, bf16 or auto")
        for key in ("trajectory_bind", "weights_bind"):
            _check_endpoint(getattr(self, key), f"learner.{key}")
        _check(self.checkpoint_interval_s > 0, "learner.checkpoint_interval_s", "must be > 0")
        _check(self.keep_checkpoints >= 1, "learner.keep_checkpoints", "must be >= 1")
        _check(self.log_interval_s > 0, "learner.log_interval_s", "must be > 0")
        _check(self.max_message_bytes >= 4096, "learner.max_message_bytes", "must be >= 4096")
        _check(self.actor_timeout_s > 0, "learner.actor_timeout_s", "must be > 0")


MAX_SEED = (2**31 - 10_000 - 1) // 10_000  # the largest run.seed: seed * 10_000 + 10_000 < 2**31


@dataclass(frozen=True)
class RunConfig:
    num_actors: int = 2
    """Actor processes started by `zrl run`."""
    seed: int = 1
    """Base seed: actor i, with K envs, seeds its envs and sampling with seed * 10_000 + i * K
    (+ 5_000 for the evaluation actor), its env k with that + k. In [0, 214_747], so that
    env seeds stay below 2**31 (ale_py takes int32 seeds)."""
    logdir: str = "runs/default"
    """TensorBoard events, checkpoints and summary.json."""
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
        _check(self.num_actors >= 0, "run.num_actors", "must be >= 0")
        _check(0 <= self.seed and self.seed * 10_000 + 10_000 < 2**31, "run.seed",
               f"must be in [0, {MAX_SEED}] (actors seed their envs from seed * 10_000 + up to 10_000, which must stay "
               f"below 2**31); got {self.seed}")
        _check(self.eval_num_envs >= 1, "run.eval_num_envs", "must be >= 1")
        _check(self.return_window >= 1, "run.return_window", "must be >= 1")
        _check(self.max_seconds is None or self.max_seconds > 0, "run.max_seconds", "must be > 0")
        _check(self.max_env_steps is None or self.max_env_steps > 0, "run.max_env_steps", "must be > 0")


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
    """Most requests answered by one forward pass."""
    client_timeout_s: float = 60.0
    """A client silent for this long is dropped with its partial trajectory."""
    max_clients: int = 4096
    """Hellos beyond this many live sessions are refused."""
    index: int = 1000
    """The server's sender id towards the learner."""
    backlog: int = 64
    """Trajectory messages kept while the learner applies back-pressure; the oldest are dropped beyond it."""

    def __post_init__(self):
        _check(self.max_batch >= 1, "server.max_batch", "must be >= 1")
        _check(self.client_timeout_s > 0, "server.client_timeout_s", "must be > 0")
        _check(self.max_clients >= 1, "server.max_clients", "must be >= 1")
        _check(0 <= self.index < 2**32, "server.index", "must be in [0, 2**32)")
        _check(self.backlog >= 1, "server.backlog", "must be >= 1")
        _check_endpoint(self.bind, "server.bind")
        for key in ("observation_space", "action_space"):
            _check_space(getattr(self, key), f"server.{key}")


@dataclass(frozen=True)
class SecurityConfig:
    """CURVE encryption and authentication on every socket (off by default).

    Key files are ZeroMQ certificates as `zrl keys generate DIR` writes them
    (zmq.auth's format). The learner and the agent server are CURVE servers:
    they hold `server_secret_key` and accept only peers whose public key is
    in `authorized_keys`. Actors, the agent server towards the learner, and
    clients hold `client_secret_key` and check the server against
    `server_public_key`. A peer without an authorised key gets nothing in
    and nothing out.
    """

    curve: bool = False
    """Turn CURVE on for every socket."""
    server_secret_key: Optional[str] = None
    """Learner / agent server: its secret key file (e.g. keys/server.key_secret)."""
    authorized_keys: Optional[str] = None
    """Learner / agent server: a folder of authorised client public keys (*.key)."""
    server_public_key: Optional[str] = None
    """Actors, the agent server's learner link, clients: the server's public key file (e.g. keys/server.key)."""
    client_secret_key: Optional[str] = None
    """Actors, the agent server's learner link, clients: their secret key file (e.g. keys/client.key_secret)."""

    def __post_init__(self):
        if self.curve:
            for k in ("server_secret_key", "authorized_keys", "server_public_key", "client_secret_key"):
                _check(getattr(self, k) is not None, f"security.{k}", "is required when security.curve is true (make keys with `zrl keys generate DIR`)")


# The smallest frames (env.screen_size) each CNN takes; impala_deep's padded convolutions and
# max-pools take any size. zrl.models.cnn's dry run catches other image shapes (the agent server's).
CNN_MIN_SCREEN_SIZE: dict[str, int] = {"impala_shallow": 20}
CNN_MIN_SCREEN_WHY: dict[str, str] = {"impala_shallow": "an 8x8 convolution of stride 4, then a 4x4 one of stride 2"}


def _is_atari(env_id: str) -> bool:
    """zrl.envs.atari.is_atari, imported only when asked (it loads gymnasium and ale_py)."""
    try:
        from zrl.envs.atari import is_atari
    except ImportError:  # no gymnasium: the ids that are surely Atari's
        return env_id.startswith("ALE/")
    return is_atari(env_id)


SECTIONS: dict[str, type] = {
    "env": EnvConfig,
    "model": ModelConfig,
    "actor": ActorConfig,
    "learner": LearnerConfig,
    "run": RunConfig,
    "server": ServerConfig,
    "security": SecurityConfig,
}


@dataclass(frozen=True)
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algo: Any = field(default_factory=ImpalaConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    run: RunConfig = field(default_factory=RunConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    source: str = field(default="<defaults>", compare=False)
    """Where this config came from (for messages)."""

    def __post_init__(self):
        width = self.actor.num_envs // self.actor.env_groups  # the columns one chunk fills
        if not getattr(self.algo, "uses_replay", False) and self.learner.batch_size % width != 0:
            raise ConfigError(
                f"learner.batch_size ({self.learner.batch_size}) must be a multiple of "
                f"actor.num_envs / actor.env_groups ({width})"
            )
        _check(self.model.lstm_size == 0 or getattr(self.algo, "lstm_core", True), "model.lstm_size",
               f"must be 0 with algo.name {self.algo.name} (its network has no LSTM core); got {self.model.lstm_size}")
        least = CNN_MIN_SCREEN_SIZE.get(self.model.network, 1)
        if self.env.screen_size < least and _is_atari(self.env.id):  # screen_size only sizes Atari frames
            raise ConfigError(
                f"env.screen_size: must be >= {least} for model.network {self.model.network} "
                f"({CNN_MIN_SCREEN_WHY[self.model.network]}); got {self.env.screen_size}"
            )

    def to_dict(self) -> dict[str, Any]:
        d = {name: _to_plain(dataclasses.asdict(getattr(self, name))) for name in ("env", "model", "algo", "actor", "learner", "run", "server", "security")}
        return d

    def model_shaping(self, obs_spec: dict | None = None, action_spec: dict | None = None) -> dict[str, Any]:
        """What shapes the model's parameters (a checkpoint is only loadable under the same)."""
        return {
            "model": _to_plain(dataclasses.asdict(self.model)),
            "algo": self.algo.name,
            "obs": obs_spec,
            "action": action_spec,
        }

    def model_hash(self, obs_spec: dict | None = None, action_spec: dict | None = None) -> str:
        shaping = self.model_shaping(obs_spec, action_spec)
        return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]

    def replace(self, **sections: Any) -> "Config":
        return dataclasses.replace(self, **sections)


def _to_plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _to_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_plain(v) for v in x]
    return x


def default_config_path() -> Path:
    """configs/cartpole_impala.yaml: next to the package (a source checkout, an editable
    install), else the copy an installed package ships (zrl/configs/), else in the
    working directory."""
    package = Path(__file__).resolve().parent
    for here in (package.parent / "configs", package / "configs"):
        if (here / "cartpole_impala.yaml").exists():
            return here / "cartpole_impala.yaml"
    return Path("configs") / "cartpole_impala.yaml"


# ---------------------------------------------------------------------------
# Loading: YAML -> raw dict -> overrides -> typed dataclasses


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Reads a YAML config (default: configs/cartpole_impala.yaml) and applies `section.key=value` overrides."""
    p = Path(path) if path is not None else default_config_path()
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {p}: {e.strerror or e}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections, got {type(raw).__name__}")
    raw = apply_overrides(raw, overrides, str(p))
    try:
        return config_from_dict(raw, source=str(p))
    except ConfigError as e:
        raise _blame_override(e, str(p), overrides) from None


def _blame_override(e: ConfigError, source: str, overrides) -> ConfigError:
    """The error attributed to the override that set the key it names (the last one, as it
    is the one that counts), rather than to the file."""
    msg = str(e)
    detail = msg[len(source) + 2 :] if msg.startswith(f"{source}: ") else msg
    for item in reversed(list(overrides)):
        key = item.split("=", 1)[0].strip()
        # only an error about this key ("KEY: why", "KEY (value) ...", "unknown key KEY ..."),
        # not one that merely mentions it beside the key at fault
        section = key.split(".", 1)[0]
        if re.match(rf"(unknown key )?{re.escape(key)}(:| \(| |$)", detail) or re.match(rf"unknown section\(s\) \[.*'{re.escape(section)}'", detail):
            return ConfigError(f"override {item!r}: {detail}")
    return e


def apply_overrides(raw: dict, overrides: list[str] | tuple[str, ...], source: str) -> dict:
    raw = json.loads(json.dumps(raw))  # deep copy of plain data
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected section.key=value")
        key, value_text = item.split("=", 1)
        parts = key.strip().split(".")
        if len(parts) != 2 or not all(parts):
            raise ConfigError(f"override {item!r}: the key must be section.key (e.g. learner.learning_rate)")
        section, name = parts
        try:
            value = yaml.safe_load(value_text)
        except yaml.YAMLError:
            value = value_text
        sec = raw.setdefault(section, {})
        if sec is None:  # an empty section in the file (its keys commented out), as config_from_dict takes it
            sec = raw[section] = {}
        if not isinstance(sec, dict):
            raise ConfigError(f"{source}: section {section!r} must be a mapping")
        sec[name] = value
    return raw


def config_from_dict(raw: dict, source: str = "<dict>") -> Config:
    """Builds a Config from plain data (a parsed YAML file or Config.to_dict())."""
    unknown = set(raw) - set(SECTIONS) - {"algo"}
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {sorted(unknown)} (known: {sorted([*SECTIONS, 'algo'])})")
    built: dict[str, Any] = {}
    try:
        for name, cls in SECTIONS.items():
            built[name] = _build(cls, raw.get(name) or {}, name, source)
        algo_raw = raw.get("algo") or {}
        if not isinstance(algo_raw, dict):
            raise ConfigError(f"{source}: section 'algo' must be a mapping (e.g. algo: {{name: impala}}), got {type(algo_raw).__name__}")
        algo_raw = dict(algo_raw)
        algo_name = algo_raw.get("name", "impala")
        if algo_name not in ALGO_CONFIGS:
            raise ConfigError(f"{source}: algo.name: unknown algorithm {algo_name!r} (known: {sorted(ALGO_CONFIGS)})")
        built["algo"] = _build(ALGO_CONFIGS[algo_name], algo_raw, "algo", source)
        return Config(**built, source=source)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None


def _build(cls: type, data: Any, section: str, source: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: section {section!r} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise ConfigError(f"{source}: unknown key {section}.{unknown[0]} (known in {section}: {', '.join(names)})")
    kwargs = {k: _coerce(v, hints[k], f"{section}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


# learner.prefetch_batches auto on a CUDA device: on an H100 it took zrl's update against a
# plain loop from 1.41 to 1.19 (Pong's shallow net, 8 columns), 1.93 to 1.29 (32 columns), 1.21
# to 1.12 (deep, 8); on a CPU learner it changed nothing (bench/PIPELINE.md).
AUTO_PREFETCH_CUDA = 2

# Settings where .inf means what null does (no clipping, no limit); every other number
# must be finite (an infinite timeout would reach an int() and crash an actor).
INFINITY_ALLOWED = frozenset({
    "algo.clip_rho_threshold", "algo.clip_pg_rho_threshold", "algo.clip_c_threshold", "algo.reward_clip",
    "run.stop_at_return", "run.max_seconds", "learner.max_grad_norm",
})


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(value, inner[0], key)
        for a in inner:
            try:
                return _coerce(value, a, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: {value!r} does not match {tp}")
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            # YAML 1.1 reads 1e7 (no dot) as a string, as float keys accept: a finite float's worth
            # (so no 1e999999 of a billion digits), integral as written (Decimal: exact, 1e30 is 10**30)
            try:
                number, exact = float(value), decimal.Decimal(value.strip())
            except (ValueError, decimal.InvalidOperation):
                pass
            else:
                if math.isfinite(number) and exact == exact.to_integral_value():
                    return int(exact)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)  # YAML reads 1e-3 without a dot as a string
            except ValueError:
                pass
        if number is None:
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if math.isnan(number) or (math.isinf(number) and key not in INFINITY_ALLOWED):
            raise ConfigError(f"{key}: must be a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], key) for v in value)
        if len(value) != len(args):
            raise ConfigError(f"{key}: expected {len(args)} values, got {len(value)}")
        return tuple(_coerce(v, a, key) for v, a in zip(value, args))
    if tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
        raise ConfigError(f"{key}: expected a mapping, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp}")
