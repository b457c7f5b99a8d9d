"""Atari backends: ale_py's C++ AtariVectorEnv, and a gymnasium fallback with the same layout.

Both give DeepMind-preprocessed observations as uint8 [K, frame_stack, S, S]
(channel-first, S = env.screen_size, grayscale, max-pooled over the last two
skipped frames), raw (unclipped) rewards so episode returns are game scores
(the learner clips: algo.reward_clip), a Discrete spec over the game's
minimal action set, and zrl's same-step autoreset (see zrl.envs).

`AleVectorEnv` (backend ale_vector) steps its envs in ale_py's C++ threads.
It runs AtariVectorEnv in SameStep autoreset mode: a step that ends an
episode returns the new episode's first observation in `obs` and the ended
episode's last one in `info["final_obs"]` ([K, ...]; only the rows of envs
that ended are meaningful, the others hold stale data). That is zrl's
contract as is, so the wrapper only copies the truncated rows out of
`final_obs`, casts the int32 rewards to float32 and otherwise passes the
arrays through: they are fresh per step, so no copy is needed. (NextStep,
ale_py's default, would instead spend one extra `step` per ended episode on
a reset that ignores its action and returns reward 0; undoing that would
cost a step and a model call per episode end, so it is not used.)

`GymAtariVectorEnv` (backend gymnasium) steps K gymnasium `ale_py.AtariEnv`s
(frameskip 1, grayscale) in a loop, each wrapped in `DeepMindAtari`, a numpy
port of the C++ env's preprocessing, and gymnasium's FrameStackObservation
(zero padding, as in C++). With the same actions and no random no-ops it
gives the C++ env's observations (bit for bit on Pong; area-resize rounding
can differ by 1). gymnasium's own AtariPreprocessing is not used: it needs
OpenCV, which zrl does not depend on, and it differs from the C++ env in its
no-op draws, FIRE reset and life handling.

With a `batch_size` B below K, AleVectorEnv runs AtariVectorEnv in ale_py's
asynchronous mode: `reset_batch()` and `step_wait()` return the first B envs to
finish, whichever they are (`Step.env_ids` names them), and `step_async`
gives actions to the envs of the batch last returned. The emulator threads
never wait for the slowest env of a batch, so they idle less while the actor's
policy runs (zrl.actors.streams.ReadyStreams records such batches).

`episodic_life` is DeepMind's: a lost life gives terminated (no bootstrap)
but the game goes on; only a game over (or the frame limit) resets it.
(ale_py's own `episodic_life` flag resets the whole game on every lost life,
so the C++ backend uses its `life_loss_info` flag instead.) The actors'
episode statistics then count lives, not games.
"""
from __future__ import annotations

import logging
import os

import gymnasium as gym
import numpy as np

from zrl import spaces
from zrl.config import ConfigError, EnvConfig
from zrl.env_ids import is_atari, rom_name
from zrl.envs.vector import GymnasiumVectorEnv, Step, VectorEnv

log = logging.getLogger("zrl.envs")

__all__ = ["AleVectorEnv", "GymAtariVectorEnv", "is_atari", "rom_name", "make_atari_env", "uses_ale_vector"]



def _with_kwargs(args: dict, cfg: EnvConfig, free: tuple[str, ...], what: str) -> dict:
    """args plus env.kwargs, which may only set `free` keys: the others carry EnvConfig fields or zrl's contract."""
    owned = sorted(set(cfg.kwargs) & (set(args) - set(free)))
    if owned:
        raise ConfigError(f"env.kwargs: {owned} are set from the env section (or fixed by zrl) for the Atari backends; {what} takes only {sorted(free)} here")
    return {**args, **cfg.kwargs}


def _max_frames(cfg: EnvConfig) -> int:
    """Emulator frames per episode: max_episode_frames, tightened by max_episode_steps (agent steps)."""
    if cfg.max_episode_steps is None:
        return cfg.max_episode_frames
    return min(cfg.max_episode_frames, cfg.max_episode_steps * cfg.frame_skip)


def _thread_ids() -> set[int]:
    """This process's thread ids (Linux); empty where /proc is not there."""
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def _yield_to_caller(new: set[int], expected: int, nice: int) -> list[int]:
    """Makes the emulator threads AtariVectorEnv just started give way to the calling thread.

    The actor's thread hands a group its actions and then runs the policy for the
    next group. Woken emulator threads would preempt it at once (CFS wake-up
    preemption) and leave it waiting for a core with the policy half done, while
    the other group runs out of work. As SCHED_BATCH threads, nice + the caller's
    nice, they never preempt on wake-up and take what the policy leaves: on 2
    cores a Pong actor -> sink went from a median 0.635 of the raw env to 0.700
    (bench/PIPELINE.md). Threads are told apart by appearing
    during the constructor; if more or fewer than the `expected` workers appeared
    (another thread started meanwhile), nothing is changed. Returns the tids changed.
    """
    if nice <= 0 or not new:
        return []
    if len(new) != expected:
        log.info("env.thread_nice not applied: %d threads appeared while AtariVectorEnv started, expected %d", len(new), expected)
        return []
    level = min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)  # PRIO_PROCESS, 0: this thread on Linux
    done = []
    for tid in sorted(new):
        try:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, level)
            with open(f"/proc/self/task/{tid}/comm", "w") as f:
                f.write("zrl-emulator")  # for top -H / ps -L
        except OSError as e:  # the thread ended, or a platform without these calls
            log.info("env.thread_nice not applied to thread %d: %s", tid, e)
            continue
        done.append(tid)
    return done


class AleVectorEnv(VectorEnv):
    """K Atari envs in ale_py's C++ AtariVectorEnv (SameStep autoreset): synchronous batches of
    all K, or with 0 < batch_size < K, batches of the first batch_size envs to finish."""

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int, batch_size: int = 0):
        try:
            from ale_py.vector_env import AtariVectorEnv  # lazy: ale_py is optional; this backend says so without it
        except ImportError as e:
            raise ConfigError(f"env.backend ale_vector needs ale-py with its vector env: {e}") from None
        game = rom_name(cfg.id)
        kwargs = dict(
            num_threads=cfg.num_threads,
            max_num_frames_per_episode=_max_frames(cfg),
            repeat_action_probability=cfg.repeat_action_probability,
            full_action_space=False,
            autoreset_mode="SameStep",
            img_height=cfg.screen_size,
            img_width=cfg.screen_size,
            grayscale=True,
            stack_num=cfg.frame_stack,
            frameskip=cfg.frame_skip,
            maxpool=True,
            noop_max=cfg.noop_max,
            episodic_life=False,
            life_loss_info=cfg.episodic_life,
            reward_clipping=False,
            use_fire_reset=True,
            thread_affinity_offset=-1,
        )
        if not 0 <= batch_size <= num_envs:
            raise ValueError(f"batch_size must be in [0, {num_envs}], got {batch_size}")
        self.batch_size = batch_size or num_envs
        if self.batch_size < num_envs:
            kwargs["batch_size"] = self.batch_size
        kwargs = _with_kwargs(kwargs, cfg, ("full_action_space", "use_fire_reset", "maxpool", "thread_affinity_offset"), "AtariVectorEnv")
        before = _thread_ids()
        try:
            self._vec = AtariVectorEnv(game, num_envs, **kwargs)
        except TypeError as e:
            raise ConfigError(f"env.kwargs: not accepted by ale_py's AtariVectorEnv: {e}") from None
        self.emulator_threads = _yield_to_caller(_thread_ids() - before, kwargs["num_threads"] or min(self.batch_size, os.cpu_count() or 1), cfg.thread_nice)
        self._ale = self._vec.ale
        self.num_envs = num_envs
        self.seed = int(seed)
        self.observation_spec = spaces.from_gym(self._vec.single_observation_space)
        self.action_spec = spaces.from_gym(self._vec.single_action_space, per_element_bounds=True)
        self._paddle = np.ones(self.batch_size, np.float32)  # paddle strength; only paddle games read it
        self._order = np.arange(num_envs, dtype=np.int32)

    @property
    def batched(self) -> bool:
        """Whether batches are the first batch_size envs to finish (ale_py's asynchronous mode)."""
        return self.batch_size < self.num_envs

    def reset(self) -> np.ndarray:
        if self.batched:
            raise RuntimeError("an AleVectorEnv with a batch_size starts with reset_batch()")
        # Env k is seeded with seed + k (ALE's RNG and the no-op draws), like GymnasiumVectorEnv.
        obs, _ = self._vec.reset(seed=self.seed)
        return obs

    def reset_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """Resets every env (env k seeded with seed + k) and returns (env ids [B], obs [B, ...]) of
        the first batch_size to be ready. The others' first observations come out of later
        step_waits, as rows of envs that were given no action yet (reward 0, not done)."""
        obs, info = self._vec.reset(seed=self.seed)
        return np.asarray(info["env_id"]), obs

    def step(self, actions: np.ndarray) -> Step:
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: np.ndarray) -> None:
        """Hands the actions to the emulator threads and returns at once (with a batch_size: to
        the envs of the batch step_wait or reset_batch returned last, in its row order)."""
        a = np.asarray(actions)
        if a.shape != (self.batch_size,):
            raise ValueError(f"expected {self.batch_size} actions, got shape {a.shape}")
        if a.dtype != np.int64 and a.dtype != np.int32:
            a = a.astype(np.int64)
        # Straight to the C++ interface: AtariVectorEnv.step only adds asserts and a paddle array per call.
        self._ale.send(a, self._paddle)

    def step_wait(self) -> Step:
        obs, reward, terminated, truncated, info = self._ale.recv()
        env_id = info["env_id"]
        if not self.batched and not np.array_equal(env_id, self._order):
            # Synchronous batches come back in env order; guard anyway (it costs a compare).
            perm = np.argsort(env_id)
            obs, reward, terminated, truncated = obs[perm], reward[perm], terminated[perm], truncated[perm]
            info = {**info, "final_obs": info["final_obs"][perm]} if "final_obs" in info else info
        final: dict[int, np.ndarray] = {}  # by row (env k's own in synchronous batches)
        if truncated.any():
            fo = info["final_obs"]
            final = {int(k): fo[k].copy() for k in np.flatnonzero(truncated)}
        return Step(obs, reward.astype(np.float32), terminated, truncated, final, env_ids=np.asarray(env_id) if self.batched else None)

    def close(self) -> None:
        vec, self._vec, self._ale = getattr(self, "_vec", None), None, None
        if vec is not None:
            vec.close()


class GymAtariVectorEnv(GymnasiumVectorEnv):
    """K gymnasium AtariEnvs with DeepMind preprocessing in numpy, stepped in a loop.

    Under episodic_life a lost life is `terminated` for learning while the game
    goes on; only the game's real end resets the env.
    """

    def _make_envs(self, cfg: EnvConfig, num_envs: int) -> list:
        game = rom_name(cfg.id)
        return [_make_gym_atari(game, cfg) for _ in range(num_envs)]

    def _episode_over(self, terminated: bool, truncated: bool, info: dict) -> bool:
        return truncated or info["episode_over"]


def _make_gym_atari(game: str, cfg: EnvConfig) -> gym.Env:
    from ale_py.env import AtariEnv  # lazy: ale_py is optional, needed only to make a game

    kwargs = dict(obs_type="grayscale", frameskip=1, repeat_action_probability=cfg.repeat_action_probability, full_action_space=False)
    kwargs = _with_kwargs(kwargs, cfg, ("full_action_space", "mode", "difficulty"), "AtariEnv")
    try:
        env = AtariEnv(game, **kwargs)
    except TypeError as e:
        raise ConfigError(f"env.kwargs: not accepted by ale_py's AtariEnv: {e}") from None
    env = DeepMindAtari(env, cfg)
    return gym.wrappers.FrameStackObservation(env, cfg.frame_stack, padding_type="zero")


class AreaResize:
    """uint8 [H, W] -> [h, w] by area averaging, as OpenCV's INTER_AREA shrinks images.

    Output pixel i of a side averages input [i * s, (i + 1) * s), s = n_in /
    n_out, weighting the pixels at its ends by their overlap. Each output pixel
    reads at most ceil(s) + 1 inputs, so the resize is a few weighted gathers
    per axis; a dense matrix product would be as exact but hands a tiny
    product to BLAS, whose threads cost 30x more than the work on a busy machine.
    """

    def __init__(self, in_hw: tuple[int, int], out_hw: tuple[int, int]):
        self.rows = self._taps(in_hw[0], out_hw[0])
        self.cols = self._taps(in_hw[1], out_hw[1])

    @staticmethod
    def _taps(n_in: int, n_out: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """[(input index [n_out], weight [n_out]) per tap]: output i = sum over taps of w[i] * x[idx[i]]."""
        s = n_in / n_out
        lo = np.arange(n_out)[:, None] * s
        j = np.arange(n_in)[None, :]
        w = np.clip(np.minimum(j + 1, lo + s) - np.maximum(j, lo), 0.0, None) / s  # [n_out, n_in]
        first = np.argmax(w > 0, axis=1)
        taps = int((w > 0).sum(1).max())
        out = []
        for t in range(taps):
            idx = np.minimum(first + t, n_in - 1)
            out.append((idx, np.where(first + t < n_in, w[np.arange(n_out), idx], 0.0).astype(np.float32)))
        return out

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        x = frame.astype(np.float32)
        r = sum(w[:, None] * x[idx] for idx, w in self.rows)
        out = sum(r[:, idx] * w for idx, w in self.cols)
        return np.rint(out, out=out).astype(np.uint8)


class DeepMindAtari(gym.Wrapper):
    """One grayscale AtariEnv (frameskip 1) -> DeepMind's preprocessed frames, as ale_py's C++ env makes them.

    A port of ale_py's PreprocessedEnv, so both backends mean the same by each
    config field: FIRE once after reset where the game has it, then
    uniform [0, noop_max) no-ops (less the FIRE); each action repeated
    frame_skip frames, stopping early at a game over or the frame limit; with
    episodic_life, a life lost during a step ends it as terminated (the game
    goes on; `info["episode_over"]` says when to reset); the max of the last
    two frames, resized to screen_size x screen_size by area averaging
    (`AreaResize`, OpenCV's INTER_AREA).
    """

    def __init__(self, env: gym.Env, cfg: EnvConfig):
        super().__init__(env)
        self.ale = env.unwrapped.ale
        self.frame_skip = cfg.frame_skip
        self.noop_max = cfg.noop_max
        self.episodic_life = cfg.episodic_life
        self.max_frames = _max_frames(cfg)
        self.fire = env.unwrapped.get_action_meanings()[1:2] == ["FIRE"]
        self._resize = AreaResize(env.observation_space.shape, (cfg.screen_size, cfg.screen_size))
        self.observation_space = gym.spaces.Box(0, 255, (cfg.screen_size, cfg.screen_size), np.uint8)
        self.frames = 0
        self.lives = 0

    def reset(self, *, seed=None, options=None):
        frame, info = self.env.reset(seed=seed, options=options)
        noops = int(self.np_random.integers(0, self.noop_max)) if self.noop_max > 0 else 0
        if self.fire:
            frame, *_ = self.env.step(1)
            noops -= 1
        for _ in range(noops):
            frame, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                frame, info = self.env.reset()
        self.frames = 0
        self.lives = self.ale.lives()
        return self._resize(frame), info

    def step(self, action):
        reward, last, prev = 0.0, None, None
        terminated = truncated = False
        for _ in range(self.frame_skip):
            frame, r, terminated, truncated, info = self.env.step(action)
            reward += r
            prev, last = last, frame
            self.frames += 1
            truncated = truncated or self.frames >= self.max_frames
            if terminated or truncated:
                break
        pooled = last if prev is None else np.maximum(prev, last)
        lives = self.ale.lives()
        life_lost = 0 < lives < self.lives
        self.lives = lives
        info["episode_over"] = terminated or truncated  # else a lost life at most: the game goes on
        terminated = terminated or (self.episodic_life and life_lost)
        return self._resize(pooled), reward, terminated, truncated and not terminated, info


def uses_ale_vector(cfg: EnvConfig) -> bool:
    """Whether make_vector_env gives ale_py's AtariVectorEnv for cfg: an Atari id, backend auto or ale_vector."""
    return is_atari(cfg.id) and cfg.backend != "gymnasium"


def make_atari_env(cfg: EnvConfig, num_envs: int, seed: int) -> VectorEnv:
    """The Atari backend that cfg.backend names (auto: ale_vector)."""
    if uses_ale_vector(cfg):
        return AleVectorEnv(cfg, num_envs, seed)
    return GymAtariVectorEnv(cfg, num_envs, seed)
