"""`zrl bench learning`: wall time and env steps to solve CartPole-v1 (mean return
of the last 100 episodes >= 475), start-up included, for each shipped CartPole
config, 3 seeds each, medians; Stable-Baselines3 PPO with rl-baselines3-zoo's
CartPole-v1 hyper-parameters in the same run as the reference (when
stable-baselines3 is installed: `pip install -e .[bench]`).

zrl: `zrl run --config C --seed S --stop-at-return 475` in a subprocess; the
time is summary.json's time_to_target_s (from the command's start to the
moment the target was reached). SB3: a subprocess that imports, builds and
trains PPO and stops at the same rule (the mean of the last 100 finished
training episodes); its time runs from the subprocess's start too.
Value-based configs (Ape-X) count a greedy evaluation actor's episodes, as
their exploring actors cannot reach 475 (summary.json says which).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zrl.bench.harness import BenchOptions, BenchResult, run_group

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ["cartpole_impala", "cartpole_apex"]
TARGET = 475.0

# PPO as rl-baselines3-zoo sets it for CartPole-v1 (hyperparams/ppo.yml): 8 envs
# (DummyVecEnv), n_steps 32, batch 256, gae_lambda 0.8, gamma 0.98, 20 epochs,
# ent_coef 0, learning rate and clip range linear from 1e-3 / 0.2 over 1e5 steps.
SB3_PPO = r"""
import time
T0 = time.time()
import json, sys
from collections import deque
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
seed, target, max_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
torch.set_num_threads(2)
lin = lambda v: (lambda progress_remaining: progress_remaining * v)

class Stop(BaseCallback):
    def __init__(self):
        super().__init__()
        self.returns = deque(maxlen=100)
        self.reached_s = None
    def _on_step(self):
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(info["episode"]["r"])
        if len(self.returns) == 100 and np.mean(self.returns) >= target:
            self.reached_s = time.time() - T0
            return False
        return time.time() - T0 < max_s

env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
            learning_rate=lin(1e-3), clip_range=lin(0.2), seed=seed, verbose=0, device="cpu")
cb = Stop()
model.learn(total_timesteps=100_000, callback=cb)
print(json.dumps({"reached": cb.reached_s is not None, "time_s": cb.reached_s if cb.reached_s else max_s,
                  "env_steps": int(model.num_timesteps), "mean_return": float(np.mean(cb.returns)) if cb.returns else None}))
"""


def zrl_seed(config: str, seed: int, max_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="zrl-learn-") as d:
        argv = [sys.executable, "-m", "zrl", "run", "--config", str(ROOT / "configs" / f"{config}.yaml"), "--seed", str(seed),
                "--logdir", d, "--stop-at-return", str(TARGET), "--max-seconds", str(max_s)]
        code = run_group(argv, ROOT, timeout=max_s + 120)
        if code != 0:  # a failed run is not a slow seed
            raise RuntimeError(f"zrl run ({config}, seed {seed}) exited with {code}")
        s = json.loads((Path(d) / "summary.json").read_text())
    t = s["time_to_target_s"] if s["reached"] else max_s  # (as the reference's: the cap, whatever stopped it)
    return {"reached": s["reached"], "time_s": t, "env_steps": s["env_steps"], "return_source": s.get("return_source", "train")}


def sb3_seed(seed: int, max_s: float) -> dict | None:
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return None
    # SB3's logger makes a folder (SB3_LOGDIR, else a new tempdir/SB3-<time> left behind):
    # one of ours, removed with the run.
    with tempfile.TemporaryDirectory(prefix="zrl-learn-sb3-") as logdir:
        p = subprocess.run([sys.executable, "-c", SB3_PPO, str(seed), str(TARGET), str(max_s)], cwd=ROOT, capture_output=True,
                           text=True, timeout=max_s + 120, env={**os.environ, "SB3_LOGDIR": logdir})
    if p.returncode != 0:
        raise RuntimeError(f"SB3 reference failed: {p.stderr[-1000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run(opts: BenchOptions) -> BenchResult:
    seeds = [1] if opts.quick else [1, 2, 3]
    max_s = 60.0 if opts.quick else 300.0
    result = BenchResult(
        name="learning",
        title=f"Learning: wall time (start-up included) and env steps to a mean return of {TARGET:g} over 100 episodes on CartPole-v1",
        columns=["system", "seeds_reached", "median_s", "min_s", "max_s", "median_env_steps", "per_seed_s"],
    )
    runs: dict[str, list[dict]] = {}
    for seed in seeds:  # interleave systems per seed, so machine noise spreads over all of them
        for config in CONFIGS:
            runs.setdefault(f"zrl {config}", []).append(zrl_seed(config, seed, max_s))
        ref = sb3_seed(seed, max_s)
        if ref is not None:
            runs.setdefault("SB3 PPO (rl-zoo)", []).append(ref)
    for system, rs in runs.items():
        times = [r["time_s"] for r in rs]
        result.add(
            system=system,
            seeds_reached=f"{sum(r['reached'] for r in rs)}/{len(rs)}",
            median_s=statistics.median(times),
            min_s=min(times),
            max_s=max(times),
            median_env_steps=statistics.median(r["env_steps"] for r in rs),
            per_seed_s=" ".join(f"{t:.1f}" for t in times),
        )
    if "SB3 PPO (rl-zoo)" not in runs:
        result.notes.append("stable-baselines3 is not installed (pip install -e .[bench]): no reference in this run.")
    result.notes.append(f"Seeds {seeds}; a seed that does not reach the target counts the cap ({max_s:g} s), zrl's and the reference's alike "
                        "(SB3 also stops at 100k steps).")
    result.notes.append("zrl: time_to_target_s of summary.json (command start to target, start-up included); "
                        "cartpole_apex counts a greedy evaluation actor's episodes.")
    result.notes.append("SB3: PPO, rl-baselines3-zoo's CartPole-v1 settings, 2 torch threads, from its process start.")
    result.extra["runs"] = runs
    return result
