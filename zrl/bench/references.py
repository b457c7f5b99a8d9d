"""The Stable-Baselines3 references of `zrl bench learning` and `zrl bench atari`, with rl-baselines3-zoo's
hyper-parameters (rl_zoo3's hyperparams/ppo.yml and sac.yml) for their envs.

Each reference is a Python script run in a subprocess of its own, so its time, like
zrl's, runs from a process start and includes the imports. The script takes one
argument, a JSON object: seed, env_id, window and either target and max_s (train until
the mean return of the last `window` finished training episodes reaches target, or
max_s from the start) or budget_s, eval_episodes and eval_seed (train for budget_s from
the start, then play eval_episodes greedy episodes). Its last line of output is a JSON
object: time to target (reached, time_s) or the greedy return (eval_return,
eval_returns, trained_s), and env_steps, mean_return and curve ([seconds from the
start, env steps, mean return of the last `window` training episodes]) either way.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What every script starts with: the clock, the arguments, and the callback that keeps the
# training episodes' returns and ends training at the target or when its time is up.
_HEAD = r'''
import time
T0 = time.time()  # before the imports: the reference's time includes its start-up, as zrl's does
import json, sys
from collections import deque
import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
args = json.loads(sys.argv[1])
seed, env_id, window = int(args["seed"]), args["env_id"], int(args["window"])
target = args.get("target")  # None: no target, train until the time is up
max_s = float(args["max_s"] if "max_s" in args else args["budget_s"])
torch.set_num_threads(2)

class Watch(BaseCallback):
    def __init__(self):
        super().__init__()
        self.returns = deque(maxlen=window)
        self.reached_s = None
        self.stopped_s = None
        self.curve = []  # (s from T0, env steps, mean return), at most every 0.25 s, and at the target

    def mean(self):
        return round(float(np.mean(self.returns)), 2) if self.returns else None

    def _on_step(self):
        ended = False
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(info["episode"]["r"])
                ended = True
        now = time.time() - T0
        if ended and (not self.curve or now - self.curve[-1][0] >= 0.25):
            self.curve.append([round(now, 3), int(self.num_timesteps), self.mean()])
        if target is not None and len(self.returns) == window and np.mean(self.returns) >= target:
            self.reached_s = now
            self.curve.append([round(now, 3), int(self.num_timesteps), self.mean()])
            return False
        if now >= max_s:
            self.stopped_s = now
            return False
        return True

watch = Watch()
'''

# The end of a time-to-target script: `model` has learned with callback=watch.
_REPORT_TIME = r'''
print(json.dumps({"reached": watch.reached_s is not None, "time_s": watch.reached_s if watch.reached_s else max_s,
                  "env_steps": int(model.num_timesteps), "mean_return": watch.mean(), "curve": watch.curve}))
'''

# The end of a return-after-a-budget script: greedy episodes on a fresh env, one after another.
_REPORT_GREEDY = r'''
trained_s = time.time() - T0
import gymnasium as gym
env = gym.make(env_id)
returns = []
for i in range(int(args["eval_episodes"])):
    obs, _ = env.reset(seed=int(args["eval_seed"]) + i)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(model.predict(obs, deterministic=True)[0])
        total += float(reward)
        done = terminated or truncated
    returns.append(round(total, 2))
env.close()
print(json.dumps({"eval_return": float(np.mean(returns)), "eval_returns": returns, "trained_s": round(trained_s, 3),
                  "env_steps": int(model.num_timesteps), "mean_return": watch.mean(), "curve": watch.curve}))
'''

# PPO, CartPole-v1 (ppo.yml): 8 envs (DummyVecEnv), n_steps 32, batch 256, gae_lambda 0.8,
# gamma 0.98, 20 epochs, ent_coef 0, learning rate and clip range linear from 1e-3 / 0.2
# over its n_timesteps, 1e5, where it stops.
_PPO_CARTPOLE = r'''
from stable_baselines3 import PPO
lin = lambda v: (lambda progress_remaining: progress_remaining * v)
env = make_vec_env(env_id, n_envs=8, seed=seed)
model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
            learning_rate=lin(1e-3), clip_range=lin(0.2), seed=seed, verbose=0, device="cpu")
model.learn(total_timesteps=100_000, callback=watch)
'''

# SAC, Pendulum-v1 (sac.yml): learning rate 1e-3, SB3's defaults otherwise (1 env, buffer
# 1e6, batch 256, learning_starts 100, tau 0.005, gamma 0.99, one gradient step per env
# step, entropy coefficient learned). Not held to its n_timesteps (2e4): it trains until
# the target or max_s, as zrl does.
_SAC_PENDULUM = r'''
from stable_baselines3 import SAC
env = make_vec_env(env_id, n_envs=1, seed=seed)
model = SAC("MlpPolicy", env, learning_rate=1e-3, seed=seed, verbose=0, device="cpu")
model.learn(total_timesteps=10**9, callback=watch)
'''

# PPO, LunarLander-v3 (ppo.yml): 16 envs (DummyVecEnv), n_steps 1024, batch 64,
# gae_lambda 0.98, gamma 0.999, 4 epochs, ent_coef 0.01; stops at its n_timesteps, 1e6.
_PPO_LUNARLANDER = r'''
from stable_baselines3 import PPO
env = make_vec_env(env_id, n_envs=16, seed=seed)
model = PPO("MlpPolicy", env, n_steps=1024, batch_size=64, gae_lambda=0.98, gamma=0.999, n_epochs=4, ent_coef=0.01,
            seed=seed, verbose=0, device="cpu")
model.learn(total_timesteps=1_000_000, callback=watch)
'''

# PPO, Acrobot-v1 (ppo.yml): 16 envs under VecNormalize, n_steps 256, gae_lambda 0.94,
# gamma 0.99, 4 epochs, no entropy bonus; stops at their 1M steps.
_PPO_ACROBOT = r'''
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import VecNormalize
env = VecNormalize(make_vec_env(env_id, n_envs=16, seed=seed))
model = PPO("MlpPolicy", env, n_steps=256, gae_lambda=0.94, gamma=0.99, n_epochs=4, ent_coef=0.0, seed=seed, verbose=0, device="cpu")
model.learn(total_timesteps=1_000_000, callback=watch)
'''

# SAC, HalfCheetah (sac.yml's MuJoCo defaults, listed for HalfCheetah-v4): learning_starts
# 1e4, SB3's defaults otherwise (1 env, buffer 1e6, batch 256, lr 3e-4, tau 0.005, gamma
# 0.99, one gradient step per env step); trains until budget_s from its start.
_SAC_HALFCHEETAH = r'''
from stable_baselines3 import SAC
env = make_vec_env(env_id, n_envs=1, seed=seed)
model = SAC("MlpPolicy", env, learning_starts=10_000, seed=seed, verbose=0, device="cpu")
model.learn(total_timesteps=1_000_000, callback=watch)
'''

# PPO, Atari (rl_zoo3's hyperparams/ppo.yml, "atari"): 8 envs (DummyVecEnv), 4 stacked frames,
# n_steps 128, 4 epochs, batch 256, learning rate and clip range linear from 2.5e-4 / 0.1
# over its n_timesteps (1e7), vf_coef 0.5, ent_coef 0.01. The env is zrl's: make_atari_env
# with the ALE's own frame skip off and AtariWrapper's (max-pooled) in its place.
_PPO_ATARI = r'''
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import VecFrameStack, VecTransposeImage
import ale_py, gymnasium
gymnasium.register_envs(ale_py)
env_kw = {"frameskip": 1, "repeat_action_probability": args["repeat_action_probability"], "full_action_space": False,
          "max_num_frames_per_episode": args["max_episode_frames"]}
wrapper_kw = {"noop_max": args["noop_max"], "frame_skip": args["frame_skip"], "screen_size": args["screen_size"],
              "terminal_on_life_loss": args["episodic_life"], "clip_reward": True}
env = VecTransposeImage(VecFrameStack(make_atari_env(env_id, n_envs=8, seed=seed, env_kwargs=env_kw, wrapper_kwargs=wrapper_kw),
                                      n_stack=args["frame_stack"]))
lin = lambda v: (lambda progress_remaining: progress_remaining * v)
model = PPO("CnnPolicy", env, n_steps=128, n_epochs=4, batch_size=256, learning_rate=lin(2.5e-4), clip_range=lin(0.1),
            vf_coef=0.5, ent_coef=0.01, seed=seed, verbose=0, device="auto")
model.learn(total_timesteps=10_000_000, callback=watch)
'''


@dataclass(frozen=True)
class Reference:
    """An SB3 script run beside zrl's configs, and what the notes say of it."""

    system: str  # its row's name
    script: str  # Python source, as the module docstring describes
    settings: str  # where its hyper-parameters come from and how it stops, for the notes


PPO_CARTPOLE = Reference("SB3 PPO (rl-zoo)", _HEAD + _PPO_CARTPOLE + _REPORT_TIME,
                         "SB3 PPO, rl-baselines3-zoo's CartPole-v1 settings (also stops at their 100k steps)")
SAC_PENDULUM = Reference("SB3 SAC (rl-zoo)", _HEAD + _SAC_PENDULUM + _REPORT_TIME,
                         "SB3 SAC, rl-baselines3-zoo's Pendulum-v1 settings (lr 1e-3), allowed past their 20k steps")
PPO_LUNARLANDER = Reference("SB3 PPO (rl-zoo)", _HEAD + _PPO_LUNARLANDER + _REPORT_TIME,
                            "SB3 PPO, rl-baselines3-zoo's LunarLander-v3 settings (also stops at their 1M steps)")
PPO_ACROBOT = Reference("SB3 PPO (rl-zoo)", _HEAD + _PPO_ACROBOT + _REPORT_TIME,
                        "SB3 PPO, rl-baselines3-zoo's Acrobot-v1 settings (VecNormalize; also stops at their 1M steps)")
SAC_HALFCHEETAH = Reference("SB3 SAC (rl-zoo)", _HEAD + _SAC_HALFCHEETAH + _REPORT_GREEDY,
                            "SB3 SAC, rl-baselines3-zoo's HalfCheetah settings (learning_starts 1e4)")
PPO_ATARI = Reference("SB3 PPO (rl-zoo)", _HEAD + _PPO_ATARI + _REPORT_TIME,
                      "SB3 PPO, rl-baselines3-zoo's Atari settings (8 envs, n_steps 128, 4 epochs, batch 256, lr and clip "
                      "linear from 2.5e-4 and 0.1, ent_coef 0.01), on zrl's env settings")
REFERENCES = (PPO_CARTPOLE, SAC_PENDULUM, PPO_LUNARLANDER, PPO_ACROBOT, SAC_HALFCHEETAH, PPO_ATARI)


def sb3_installed() -> bool:
    """Whether the references can run (stable-baselines3 is the bench extra's)."""
    return importlib.util.find_spec("stable_baselines3") is not None


def run_reference(reference: Reference, args: dict, timeout: float) -> dict:
    """One run of `reference` with `args` (the script's JSON argument); its result, or
    {"failed": why} when the script fails (a failed run is not a slow seed)."""
    # SB3's logger makes a folder (SB3_LOGDIR, else a new tempdir/SB3-<time> left behind):
    # one of ours, removed with the run.
    with tempfile.TemporaryDirectory(prefix="zrl-learn-sb3-") as logdir:
        try:
            p = subprocess.run([sys.executable, "-c", reference.script, json.dumps(args)], cwd=ROOT, capture_output=True,
                               text=True, timeout=timeout, env={**os.environ, "SB3_LOGDIR": logdir})
        except subprocess.TimeoutExpired:
            return {"failed": f"{reference.system} ran past {timeout:g} s"}
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        return {"failed": f"{reference.system} exited with {p.returncode}: {p.stderr[-1000:]}"}
    return json.loads(lines[-1])
