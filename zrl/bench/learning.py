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

Each run's curve (seconds from its start, env steps, mean return of the last
100 episodes) goes into learning.json and is drawn in DIR/learning.png: zrl's
from the learner's TensorBoard scalars (logged every CURVE_LOG_S in these runs,
not the configs' 2 s, so a 9 s run has a curve, and once more as training
stops), SB3's from its callback.
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

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from zrl.bench.harness import BenchOptions, BenchResult, run_group

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ["cartpole_impala", "cartpole_apex"]
TARGET = 475.0
CURVE_LOG_S = 0.5  # the learner's log interval in these runs (a log costs well under a millisecond)

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
        self.curve = []  # (s from T0, env steps, mean return), at most every 0.25 s, and at the target
    def _on_step(self):
        ended = False
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(info["episode"]["r"])
                ended = True
        now = time.time() - T0
        if ended and (not self.curve or now - self.curve[-1][0] >= 0.25):
            self.curve.append([round(now, 3), int(self.num_timesteps), round(float(np.mean(self.returns)), 2)])
        if len(self.returns) == 100 and np.mean(self.returns) >= target:
            self.reached_s = now
            self.curve.append([round(now, 3), int(self.num_timesteps), round(float(np.mean(self.returns)), 2)])
            return False
        return now < max_s

env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
            learning_rate=lin(1e-3), clip_range=lin(0.2), seed=seed, verbose=0, device="cpu")
cb = Stop()
model.learn(total_timesteps=100_000, callback=cb)
print(json.dumps({"reached": cb.reached_s is not None, "time_s": cb.reached_s if cb.reached_s else max_s,
                  "env_steps": int(model.num_timesteps), "mean_return": float(np.mean(cb.returns)) if cb.returns else None,
                  "curve": cb.curve}))
"""


def zrl_seed(config: str, seed: int, max_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="zrl-learn-") as d:
        argv = [sys.executable, "-m", "zrl", "run", "--config", str(ROOT / "configs" / f"{config}.yaml"), "--seed", str(seed),
                "--logdir", d, "--stop-at-return", str(TARGET), "--max-seconds", str(max_s), "-o", f"learner.log_interval_s={CURVE_LOG_S}"]
        code = run_group(argv, ROOT, timeout=max_s + 120)
        if code != 0:  # a failed run is not a slow seed
            raise RuntimeError(f"zrl run ({config}, seed {seed}) exited with {code}")
        s = json.loads((Path(d) / "summary.json").read_text())
        source = s.get("return_source", "train")
        curve = read_curve(d, "eval/return" if source == "eval" else "episode/return", s["started_at_unix"])
    t = s["time_to_target_s"] if s["reached"] else max_s  # (as the reference's: the cap, whatever stopped it)
    return {"reached": s["reached"], "time_s": t, "env_steps": s["env_steps"], "return_source": source, "curve": curve}


def read_curve(logdir, tag: str, t0: float) -> list[list[float]]:
    """[seconds since t0, env steps, value] for each of the learner's TensorBoard scalars `tag` in logdir."""
    ea = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    ea.Reload()
    if tag not in ea.Tags()["scalars"]:
        return []
    return [[round(e.wall_time - t0, 3), int(e.step), round(float(e.value), 2)] for e in ea.Scalars(tag)]


def plot(runs: dict[str, list[dict]], path: Path) -> bool:
    """learning.png: every run's mean return against seconds from its start and against env
    steps, one colour per system. False (and no file) without matplotlib or any curve."""
    if not any(r.get("curve") for rs in runs.values() for r in rs):
        return False
    try:
        import matplotlib  # lazy: optional (the bench extra)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # lazy: optional, and only after choosing the Agg backend
    except ImportError:
        return False
    fig, (by_time, by_steps) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (system, rs) in enumerate(runs.items()):
        labelled = False
        for r in rs:
            c = r.get("curve") or []
            if not c:
                continue
            style = {"color": colours[i % len(colours)], "alpha": 0.8, "lw": 1.2, "label": None if labelled else system}
            by_time.plot([p[0] for p in c], [p[2] for p in c], **style)
            by_steps.plot([max(p[1], 1) for p in c], [p[2] for p in c], **style)
            labelled = True
    for ax in (by_time, by_steps):
        ax.axhline(TARGET, ls="--", lw=1, color="grey")
        ax.grid(alpha=0.3)
    by_time.set_xlabel("seconds from the command's start (start-up included)")
    by_time.set_ylabel("mean return, last 100 episodes")
    by_steps.set_xlabel("env steps")
    by_steps.set_xscale("log")
    by_time.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"CartPole-v1 to {TARGET:g}: each seed's curve ({os.cpu_count()} cores)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def sb3_seed(seed: int, max_s: float) -> dict | None:
    try:
        import stable_baselines3  # noqa: F401  # lazy: optional (the bench extra): the reference is skipped without it
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
    if plot(runs, opts.out / "learning.png"):
        result.notes.append(f"Curves: learning.png (beside this table); zrl's learner logged every {CURVE_LOG_S:g} s in these runs "
                            "(-o learner.log_interval_s), the configs' own interval being 2 s.")
    elif any(r.get("curve") for rs in runs.values() for r in rs):
        result.notes.append("matplotlib is not installed: no plot of the curves (pip install -e .[bench]); learning.json has them.")
    result.extra["runs"] = runs
    return result
