"""`zrl bench learning`: how fast zrl's shipped configs learn, beside their references, in
one sitting. `--task` picks one of TASKS (default cartpole), `--seeds` its seeds.

A task names an env, the shipped configs that train on it, the Stable-Baselines3
references they are judged against (zrl.bench.references: rl-baselines3-zoo's settings)
and what is measured:
- time to target (cartpole, pendulum, lunarlander): wall time from the command's start
  (process start-up included) and env steps until the mean return of the last `window`
  training episodes reaches the target. zrl: `zrl run --config C --seed S
  --stop-at-return R`, its time summary.json's time_to_target_s; value-based configs
  (Ape-X) count a greedy evaluation actor's episodes, as their exploring actors cannot
  reach CartPole's 475 (summary.json says which). A seed that does not reach the target
  counts the cap, zrl's and the reference's alike.
- return after a budget (halfcheetah): each system trains for `limit_s` seconds, then
  plays GREEDY_EPISODES greedy episodes (zrl: `zrl eval` of its last checkpoint).
Every system runs one seed after another, seeds interleaved (seed 1 of every system,
then seed 2, ...), so machine noise spreads over all of them. Where a target is a ratio
(`MedianRatio`) the row reports it; `met` judges the row's targets on this sitting.

A config that does not exist yet, does not load or trains another env, and a task whose
env needs an extra that is not installed (box2d, mujoco) is skipped with a note, and a
run that fails is recorded as failed, so one unfinished algorithm costs its row only.

Each run's curve (seconds from its start, env steps, mean return of the last `window`
episodes) goes into the result's JSON and is drawn in DIR/NAME.png: zrl's from the
learner's TensorBoard scalars (logged every CURVE_LOG_S in these runs, not the configs'
2 s, so a 9 s run has a curve, and once more as training stops), SB3's from its callback.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from zrl.bench import references
from zrl.bench.harness import BenchOptions, BenchResult, run_group
from zrl.bench.references import Reference
from zrl.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
CURVE_LOG_S = 0.5  # the learner's log interval in these runs (a log costs well under a millisecond)
GREEDY_EPISODES = 5  # per run of a task measured by its greedy return after a budget
EVAL_SEED = 12345  # the greedy episodes' env seed, zrl's (`zrl eval`'s default) and the reference's


@dataclass(frozen=True)
class MedianRatio:
    """The row's median time at most `at_most` times its reference's, in the same sitting."""

    reference: str  # the reference's system name
    at_most: float

    def describe(self) -> str:
        return f"median <= {self.at_most:g} x {self.reference}"

    def judge(self, rs: list[dict], runs: dict[str, list[dict]]) -> tuple[float | None, bool | None]:
        own = [r for r in rs if "failed" not in r]
        ref = [r["time_s"] for r in runs.get(self.reference, []) if "failed" not in r]
        if not ref:  # (not run here, or every run of it failed: nothing to hold the row to)
            return None, None
        if not own:
            return None, False
        ratio = statistics.median(r["time_s"] for r in own) / statistics.median(ref)
        # An unreached seed's time is the cap, less than its own: the row's median holds only where
        # it is made of reached seeds. (The reference's caps only make its median smaller, the ratio larger.)
        held = statistics.median(r["time_s"] if r["reached"] else math.inf for r in own) / statistics.median(ref)
        return ratio, held <= self.at_most and len(own) == len(rs)


@dataclass(frozen=True)
class FasterEachSeed:
    """Every seed reaches the target sooner than the reference's run of the same seed."""

    reference: str

    def describe(self) -> str:
        return f"each seed faster than {self.reference}"

    def judge(self, rs: list[dict], runs: dict[str, list[dict]]) -> tuple[float | None, bool | None]:
        ref = {r["seed"]: r for r in runs.get(self.reference, []) if "failed" not in r}
        if any("failed" in r for r in rs):
            return None, False
        if not rs or any(r["seed"] not in ref for r in rs):
            return None, None
        return None, all(r["reached"] and r["time_s"] < ref[r["seed"]]["time_s"] for r in rs)


@dataclass(frozen=True)
class WithinEachSeed:
    """Every seed reaches the target within `seconds`."""

    seconds: float

    def describe(self) -> str:
        return f"each seed within {self.seconds:g} s"

    def judge(self, rs: list[dict], runs: dict[str, list[dict]]) -> tuple[float | None, bool | None]:
        return None, bool(rs) and all("failed" not in r and r["reached"] and r["time_s"] <= self.seconds for r in rs)


def describe(targets: tuple) -> str:
    return "; ".join(t.describe() for t in targets) or "-"


def judge(targets: tuple, rs: list[dict], runs: dict[str, list[dict]]) -> tuple[float | None, bool | None]:
    """The row's ratio (its MedianRatio target's) and whether it met all its targets: None
    where it has none, or where one could not be judged (its reference is missing) and none failed."""
    if not targets:
        return None, None
    judged = [t.judge(rs, runs) for t in targets]
    ratio = next((r for r, _ in judged if r is not None), None)
    met = [m for _, m in judged]
    return ratio, (False if False in met else None if None in met else True)


@dataclass(frozen=True)
class ZrlConfig:
    """A shipped config (configs/NAME.yaml) run on a task, and the targets its row is held to."""

    name: str
    targets: tuple = ()

    @property
    def system(self) -> str:
        return f"zrl {self.name}"


@dataclass(frozen=True)
class Task:
    """One env, the configs that train on it, their references, and what is measured."""

    env_id: str
    window: int  # episodes in the mean return (run.return_window)
    configs: tuple[ZrlConfig, ...]
    references: tuple[Reference, ...]
    limit_s: float  # time to target: each run's cap; return after a budget: the budget
    quick_limit_s: float
    seeds: tuple[int, ...]
    target_return: float | None = None  # None: measured by the greedy return after limit_s
    needs: tuple[tuple[str, str], ...] = ()  # (module, pip extra) that building its env imports
    about: str = ""  # what the notes say of the task as a whole


SB3_PPO, SB3_SAC = references.PPO_CARTPOLE.system, references.SAC_PENDULUM.system
IMPALA = "zrl cartpole_impala"

TASKS: dict[str, Task] = {
    "cartpole": Task(
        env_id="CartPole-v1", window=100, target_return=475.0, limit_s=300.0, quick_limit_s=60.0, seeds=(1, 2, 3),
        configs=(ZrlConfig("cartpole_impala"), ZrlConfig("cartpole_apex"),
                 ZrlConfig("cartpole_ppo", (FasterEachSeed(IMPALA), MedianRatio(SB3_PPO, 0.4))),
                 ZrlConfig("cartpole_appo", (WithinEachSeed(60.0),)), ZrlConfig("cartpole_a3c", (WithinEachSeed(90.0),))),
        references=(references.PPO_CARTPOLE,)),
    "pendulum": Task(
        env_id="Pendulum-v1", window=20, target_return=-200.0, limit_s=600.0, quick_limit_s=60.0, seeds=(1, 2, 3),
        configs=(ZrlConfig("pendulum_sac", (MedianRatio(SB3_SAC, 0.7),)),), references=(references.SAC_PENDULUM,)),
    "lunarlander": Task(
        env_id="LunarLander-v3", window=100, target_return=200.0, limit_s=1800.0, quick_limit_s=60.0, seeds=(1, 2, 3),
        configs=(ZrlConfig("lunarlander_ppo", (WithinEachSeed(600.0),)),), references=(references.PPO_LUNARLANDER,),
        needs=(("Box2D", "box2d"),)),
    "acrobot": Task(
        env_id="Acrobot-v1", window=100, target_return=-100.0, limit_s=600.0, quick_limit_s=60.0, seeds=(1, 2, 3),
        configs=(ZrlConfig("acrobot_impala"),), references=(references.PPO_ACROBOT,)),
    "halfcheetah": Task(
        env_id="HalfCheetah-v5", window=5, limit_s=900.0, quick_limit_s=30.0, seeds=(1, 2),
        configs=(ZrlConfig("halfcheetah_sac"),), references=(references.SAC_HALFCHEETAH,), needs=(("mujoco", "mujoco"),),
        about="Target: zrl's greedy return after 15 minutes, beside SB3 SAC's on the same machine (no threshold)."),
}

# The task `run` measures and its seeds (None: the task's own); `chosen` sets them.
_chosen: tuple[str, tuple[int, ...] | None] = ("cartpole", None)


@contextlib.contextmanager
def chosen(task: str = "cartpole", seeds: tuple[int, ...] | None = None):
    """Within it, `run` (what `zrl bench learning` calls) measures `task` on `seeds`."""
    global _chosen
    if task not in TASKS:
        raise ValueError(f"unknown learning task {task!r} (known: {', '.join(TASKS)})")
    before, _chosen = _chosen, (task, tuple(seeds) if seeds else None)
    try:
        yield
    finally:
        _chosen = before


def result_name(task: str) -> str:
    """The result's file name: cartpole keeps the benchmark's own (learning.json, .md, .png)."""
    return "learning" if task == "cartpole" else f"learning_{task}"


def missing_extra(task: Task) -> str | None:
    """Why the task's env cannot be built here, or None."""
    for module, extra in task.needs:
        if importlib.util.find_spec(module) is None:
            return f"{task.env_id} needs {module}, not installed (pip install -e .[{extra}]): nothing measured."
    return None


def config_problem(task: Task, config: str) -> str | None:
    """Why configs/CONFIG.yaml cannot run on the task (it does not exist yet, does not load,
    or trains another env), or None."""
    path = ROOT / "configs" / f"{config}.yaml"
    if not path.exists():
        return f"configs/{config}.yaml does not exist (yet): its row is skipped."
    try:
        cfg = load_config(path)
    except ConfigError as e:
        return f"configs/{config}.yaml does not load ({e}): its row is skipped."
    if cfg.env.id != task.env_id:
        return f"configs/{config}.yaml trains {cfg.env.id}, not {task.env_id}: its row is skipped."
    return None


def zrl_run(config: str, seed: int, seconds: float, logdir: str, args: list[str], grace_s: float) -> dict:
    """`zrl run --config configs/CONFIG.yaml --seed SEED --logdir LOGDIR --max-seconds SECONDS
    ARGS...`, allowed grace_s past its time: its summary.json, or {"seed": .., "failed": why}."""
    argv = [sys.executable, "-m", "zrl", "run", "--config", str(ROOT / "configs" / f"{config}.yaml"), "--seed", str(seed),
            "--logdir", logdir, "--max-seconds", str(seconds), *args]
    try:
        code = run_group(argv, ROOT, timeout=seconds + grace_s)
    except subprocess.TimeoutExpired:
        return {"seed": seed, "failed": f"zrl run ran past {seconds + grace_s:g} s"}
    summary = Path(logdir) / "summary.json"
    if code != 0 or not summary.exists():
        return {"seed": seed, "failed": f"zrl run exited with {code}"}
    return json.loads(summary.read_text())


def zrl_seed(task: Task, config: str, seed: int, limit_s: float) -> dict:
    """One `zrl run` of configs/CONFIG.yaml: its time to target, or its greedy return after
    limit_s; {"failed": why} if it fails."""
    with tempfile.TemporaryDirectory(prefix="zrl-learn-") as d:
        stop = (["--stop-at-return", str(task.target_return)] if task.target_return is not None
                else ["-o", "run.stop_at_return=null"])  # (a budget task trains for all of it)
        s = zrl_run(config, seed, limit_s, d, [*stop, "-o", f"learner.log_interval_s={CURVE_LOG_S}", "-o", f"run.return_window={task.window}"],
                    grace_s=120)
        if "failed" in s:
            return s
        source = s.get("return_source", "train")
        run = {"seed": seed, "env_steps": s["env_steps"], "return_source": source,
               "curve": read_curve(d, "eval/return" if source == "eval" else "episode/return", s["started_at_unix"])}
        if task.target_return is None:
            return {**run, **greedy_return(d), "trained_s": s["wall_s"]}
    return {**run, "reached": s["reached"], "time_s": s["time_to_target_s"] if s["reached"] else limit_s}


def greedy_return(logdir: str) -> dict:
    """GREEDY_EPISODES greedy episodes of the last checkpoint in logdir, as `zrl eval` plays them
    (one env each, seeded from EVAL_SEED), in a process of its own as the run was."""
    code = ("import json, sys; from zrl.evaluate import evaluate_checkpoint; "
            f"print(json.dumps(evaluate_checkpoint(sys.argv[1], episodes={GREEDY_EPISODES}, num_envs={GREEDY_EPISODES}, seed={EVAL_SEED})))")
    try:
        p = subprocess.run([sys.executable, "-c", code, logdir], cwd=ROOT, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return {"failed": "zrl eval ran past 600 s"}
    if p.returncode != 0:
        return {"failed": f"zrl eval exited with {p.returncode}: {p.stderr[-1000:]}"}
    return {"eval_return": json.loads(p.stdout.strip().splitlines()[-1])["mean_return"]}


def read_curve(logdir, tag: str, t0: float) -> list[list[float]]:
    """[seconds since t0, env steps, value] for each of the learner's TensorBoard scalars `tag` in logdir."""
    ea = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    ea.Reload()
    if tag not in ea.Tags()["scalars"]:
        return []
    return [[round(e.wall_time - t0, 3), int(e.step), round(float(e.value), 2)] for e in ea.Scalars(tag)]


def plot(runs: dict[str, list[dict]], path: Path, title: str, window: int, target: float | None = None) -> bool:
    """PATH: every run's mean return against seconds from its start and against env steps, one
    colour per system, the target (if any) dashed. False (and no file) without matplotlib or any curve."""
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
            c = [p for p in r.get("curve") or [] if p[2] is not None]
            if not c:
                continue
            style = {"color": colours[i % len(colours)], "alpha": 0.8, "lw": 1.2, "label": None if labelled else system}
            by_time.plot([p[0] for p in c], [p[2] for p in c], **style)
            by_steps.plot([max(p[1], 1) for p in c], [p[2] for p in c], **style)
            labelled = True
    for ax in (by_time, by_steps):
        if target is not None:
            ax.axhline(target, ls="--", lw=1, color="grey")
        ax.grid(alpha=0.3)
    by_time.set_xlabel("seconds from the command's start (start-up included)")
    by_time.set_ylabel(f"mean return, last {window} episodes")
    by_steps.set_xlabel("env steps")
    by_steps.set_xscale("log")
    by_time.legend(loc="lower right", fontsize=8)
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def reference_seed(task: Task, reference: Reference, seed: int, limit_s: float) -> dict:
    args = {"seed": seed, "env_id": task.env_id, "window": task.window}
    if task.target_return is not None:
        args.update(target=task.target_return, max_s=limit_s)
    else:
        args.update(budget_s=limit_s, eval_episodes=GREEDY_EPISODES, eval_seed=EVAL_SEED)
    return {"seed": seed, **references.run_reference(reference, args, timeout=limit_s + 600)}


def run(opts: BenchOptions) -> BenchResult:
    name, seeds = _chosen
    return measure(name, opts, seeds)


def measure(name: str, opts: BenchOptions, seeds: tuple[int, ...] | None = None) -> BenchResult:
    task = TASKS[name]
    seeds = list(seeds or (task.seeds[:1] if opts.quick else task.seeds))
    limit_s = task.quick_limit_s if opts.quick else task.limit_s
    timed = task.target_return is not None
    if timed:
        title = (f"Learning: wall time (start-up included) and env steps to a mean return of {task.target_return:g} over "
                 f"{task.window} episodes on {task.env_id}")
        columns = ["system", "seeds_reached", "median_s", "min_s", "max_s", "median_env_steps", "per_seed_s", "ratio", "target", "met"]
    else:
        title = (f"Learning: greedy return ({GREEDY_EPISODES} episodes) after {limit_s / 60:g} minutes of training "
                 f"(start-up included) on {task.env_id}")
        columns = ["system", "seeds", "median_return", "per_seed_return", "median_env_steps", "median_trained_s"]
    result = BenchResult(name=result_name(name), title=title, columns=columns)
    skipped = missing_extra(task)
    if skipped:
        result.notes.append(skipped)
        return result
    configs = []
    for config in task.configs:
        problem = config_problem(task, config.name)
        if problem:
            result.notes.append(problem)
        else:
            configs.append(config)
    refs = task.references if references.sb3_installed() else ()
    if not refs:
        result.notes.append("stable-baselines3 is not installed (pip install -e .[bench]): no reference in this run.")
    runs: dict[str, list[dict]] = {}
    for seed in seeds:  # interleave systems per seed, so machine noise spreads over all of them
        for config in configs:
            runs.setdefault(config.system, []).append(zrl_seed(task, config.name, seed, limit_s))
        for reference in refs:
            runs.setdefault(reference.system, []).append(reference_seed(task, reference, seed, limit_s))
    targets = {c.system: c.targets for c in configs}
    for system, rs in runs.items():
        result.add(**(time_row(system, rs, targets.get(system, ()), runs) if timed else return_row(system, rs)))
    for system, rs in runs.items():
        result.notes += [f"{system}, seed {r['seed']}: failed ({r['failed']})." for r in rs if "failed" in r]
    result.notes += notes(task, seeds, limit_s, refs)
    goal = f" to {task.target_return:g}" if timed else f", {limit_s:g} s each"
    if plot(runs, opts.out / f"{result.name}.png", f"{task.env_id}{goal}: each seed's curve ({os.cpu_count()} cores)",
            task.window, task.target_return):
        result.notes.append(f"Curves: {result.name}.png (beside this table); zrl's learner logged every {CURVE_LOG_S:g} s in these runs "
                            "(-o learner.log_interval_s), the configs' own interval being 2 s.")
    elif any(r.get("curve") for rs in runs.values() for r in rs):
        result.notes.append(f"matplotlib is not installed: no plot of the curves (pip install -e .[bench]); {result.name}.json has them.")
    result.extra["runs"] = runs
    return result


def time_row(system: str, rs: list[dict], targets: tuple, runs: dict[str, list[dict]]) -> dict:
    done = [r for r in rs if "failed" not in r]
    times = [r["time_s"] for r in done]
    ratio, met = judge(targets, rs, runs)
    return dict(
        system=system,
        seeds_reached=f"{sum(r['reached'] for r in done)}/{len(rs)}",
        median_s=statistics.median(times) if times else "-",
        min_s=min(times) if times else "-",
        max_s=max(times) if times else "-",
        median_env_steps=statistics.median(r["env_steps"] for r in done) if done else "-",
        per_seed_s=" ".join("failed" if "failed" in r else f"{r['time_s']:.1f}" for r in rs),
        ratio="-" if ratio is None else ratio,
        target=describe(targets),
        met="-" if met is None else ("yes" if met else "no"),
    )


def return_row(system: str, rs: list[dict]) -> dict:
    done = [r for r in rs if "failed" not in r]
    return dict(
        system=system,
        seeds=f"{len(done)}/{len(rs)}",
        median_return=statistics.median(r["eval_return"] for r in done) if done else "-",
        per_seed_return=" ".join("failed" if "failed" in r else f"{r['eval_return']:.1f}" for r in rs),
        median_env_steps=statistics.median(r["env_steps"] for r in done) if done else "-",
        median_trained_s=statistics.median(r["trained_s"] for r in done) if done else "-",
    )


def notes(task: Task, seeds: list[int], limit_s: float, refs: tuple[Reference, ...]) -> list[str]:
    out = [task.about] if task.about else []
    if task.target_return is not None:
        out.append(f"Seeds {seeds}; a seed that does not reach the target counts the cap ({limit_s:g} s), zrl's and the "
                   "reference's alike. ratio: the row's median time over its reference's (MedianRatio targets); "
                   "met: whether this sitting met every target of the row.")
        out.append("zrl: time_to_target_s of summary.json (command start to target, start-up included); "
                   "a config with an evaluation actor (cartpole_apex) counts its greedy episodes.")
    else:
        out.append(f"Seeds {seeds}; each system trains {limit_s:g} s (zrl: --max-seconds, counted from the learner's start; "
                   f"SB3: from its process start), then plays {GREEDY_EPISODES} greedy episodes seeded from {EVAL_SEED} "
                   "(zrl: `zrl eval` of its last checkpoint). median_trained_s: zrl's wall_s (summary.json), SB3's time when its training ended.")
    out += [f"{r.settings}, 2 torch threads, timed from its process start." for r in refs]
    return out
