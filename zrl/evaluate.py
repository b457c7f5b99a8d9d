"""`zrl eval`: run a checkpoint's policy for N episodes and report returns (and, with a
video directory, write an .mp4 of each: zrl.video)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from zrl import checkpoint, spaces, video
from zrl.agent import restore
from zrl.config import EnvConfig
from zrl.envs import make_vector_env, probe_specs
from zrl.algorithms.base import ActorAlgo, NullRecorder


def evaluate(model, algo, env_cfg: EnvConfig, episodes: int, greedy: bool = True, seed: int = 12345, num_envs: int = 8,
             video_dir: str | Path | None = None) -> dict:
    """Plays `episodes` episodes; returns their mean, min and max (and with `video_dir`, the
    videos written there: one env then plays every episode, in order).

    Each of the E envs plays its own share (episodes / E, the first envs one more), its
    first episodes in order. Taking whichever episodes finished first across the envs
    instead would favour short ones (a policy that loses fast would look better)."""
    if episodes < 1:
        raise ValueError("episodes must be >= 1")
    recorders = []
    if video_dir is not None:
        video.require_writer()
        env_cfg, num_envs = video.video_env_config(env_cfg), 1
    env = make_vector_env(env_cfg, min(num_envs, episodes), seed)
    if video_dir is not None:
        recorders = video.record(env, env_cfg, Path(video_dir))
    E = env.num_envs
    quota = [episodes // E + (k < episodes % E) for k in range(E)]
    stream = ActorAlgo(algo.make_eval_policy(model, greedy), NullRecorder())
    returns: list[list[float]] = [[] for _ in range(E)]
    try:
        obs = env.reset()
        stream.begin(obs)
        ep_ret = np.zeros(E)
        while any(len(r) < q for r, q in zip(returns, quota)):
            step = env.step(stream.act(obs))
            stream.observe(step)
            done = step.terminated | step.truncated
            ep_ret += step.reward
            for k in np.flatnonzero(done):
                if len(returns[k]) < quota[k]:  # (an env done with its share plays on, unrecorded)
                    returns[k].append(float(ep_ret[k]))
                ep_ret[k] = 0.0
            obs = step.obs
    finally:
        env.close()
    r = np.array([x for per_env in returns for x in per_env])
    result = {"mean_return": float(r.mean()), "min_return": float(r.min()), "max_return": float(r.max()), "episodes": len(r)}
    if video_dir is not None:
        result["videos"] = [str(p) for rec in recorders for p in rec.written]
    return result


def evaluate_checkpoint(path: str | Path, episodes: int = 10, greedy: bool = True, seed: int = 12345, num_envs: int = 8,
                        best: bool = False, video_dir: str | Path | None = None) -> dict:
    """Plays a checkpoint's policy: a file, or a logdir's newest checkpoint (with `best`, its
    best.pt: the highest mean return when saved)."""
    if video_dir is not None:
        video.require_writer()  # (before the checkpoint loads: the hint comes at once)
    r = restore(path, best)
    check_env_fits(r.path, r.config, (r.algo.obs_spec, r.algo.action_spec))
    result = evaluate(r.model, r.algo, r.config.env, episodes, greedy, seed, num_envs, video_dir)
    result["checkpoint"] = str(r.path)
    return result


def check_env_fits(path: Path, cfg, specs: tuple[spaces.Spec, spaces.Spec]) -> None:
    """Refuses a checkpoint whose weights were trained for other observations or actions than
    the env of its config (the one played) gives, saying which: a checkpoint written by a
    resume under another env.id, say."""
    env_specs = probe_specs(cfg.env)
    if tuple(env_specs) != tuple(specs):
        raise checkpoint.CheckpointError(
            f"{path}: its weights take obs {specs[0].to_json()} and actions {specs[1].to_json()}, but the env of its "
            f"config (env.id {cfg.env.id!r}) gives obs {env_specs[0].to_json()} and actions {env_specs[1].to_json()}: "
            "the checkpoint's config does not match its weights, so its policy cannot be played")
