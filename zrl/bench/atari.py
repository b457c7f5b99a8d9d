"""`zrl bench atari --game NAME`: how fast zrl's shipped Atari configs learn a game, per minute
of wall time, beside Stable-Baselines3 PPO with rl-baselines3-zoo's Atari settings.

Each shipped config of the game (GAMES; `--configs` picks some) runs through `zrl run --config C --seed S
--max-seconds T` (`--seconds`, default 3600; `--quick`: 90), with `run.return_window:
WINDOW`; then, with `--reference sb3`, SB3 PPO runs for the same wall time. Runs go one
after another, never side by side, seeds interleaved. The reference plays the same env
as the first config: the same ALE game and version, sticky actions, frame skip (with
max-pooling), no-op starts, episode ends at a lost life or not, 84x84 grayscale frames
stacked 4, its episode returns the game's unclipped score as zrl's are.

Rows: one per run and minute, (system, seed, seconds, env_frames, mean_return), the
mean return of the last WINDOW episodes at the end of that minute (None before the
first episode ends); frames are emulator frames (env steps x frame skip). Curves go
to DIR/atari_GAME.png; `zrl bench pong` is `zrl bench atari --game pong`.
"""
from __future__ import annotations

import contextlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from zrl.bench import references
from zrl.bench.harness import BenchOptions, BenchResult
from zrl.bench.learning import config_problem, plot, read_curve, zrl_run
from zrl.config import load_config

ROOT = Path(__file__).resolve().parents[2]
WINDOW = 20  # episodes in each mean return (a Pong game is long: 100 would lag by minutes)
CURVE_LOG_S = 10.0  # the learner's log interval in these runs (its TensorBoard points)


@dataclass(frozen=True)
class Game:
    """One Atari game: its env id and the shipped configs that train on it, the first the
    one whose env settings the reference copies."""

    env_id: str
    configs: tuple[str, ...]


GAMES: dict[str, Game] = {
    "pong": Game("ALE/Pong-v5", ("pong_impala", "pong_apex")),
    "breakout": Game("ALE/Breakout-v5", ("breakout_impala",)),
}
REFERENCE_CHOICES = ("sb3", "none")

# The game, seeds (None: 1 and 2; --quick: 1), reference and configs (None: all the game's) that
# `run` measures; `chosen` sets them.
_chosen: tuple[str, tuple[int, ...] | None, str, tuple[str, ...] | None] = ("pong", None, "none", None)


@contextlib.contextmanager
def chosen(game: str = "pong", seeds: tuple[int, ...] | None = None, reference: str = "none", configs: tuple[str, ...] | None = None):
    """Within it, `run` (what `zrl bench atari` calls) measures `game` on `seeds` beside
    `reference`, with the game's shipped `configs` (None: all of them)."""
    global _chosen
    if game not in GAMES:
        raise ValueError(f"unknown Atari game {game!r} (known: {', '.join(GAMES)})")
    if reference not in REFERENCE_CHOICES:
        raise ValueError(f"unknown reference {reference!r} (known: {', '.join(REFERENCE_CHOICES)})")
    unknown = [c for c in configs or () if c not in GAMES[game].configs]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a {game} config (known: {', '.join(GAMES[game].configs)})")
    before, _chosen = _chosen, (game, tuple(seeds) if seeds else None, reference, tuple(configs) if configs else None)
    try:
        yield
    finally:
        _chosen = before


def env_settings(config: str) -> dict:
    """What the reference needs to play configs/CONFIG.yaml's env as zrl does."""
    env = load_config(ROOT / "configs" / f"{config}.yaml").env
    return {"repeat_action_probability": env.repeat_action_probability, "frame_skip": env.frame_skip,
            "noop_max": env.noop_max, "frame_stack": env.frame_stack, "screen_size": env.screen_size,
            "episodic_life": env.episodic_life, "max_episode_frames": env.max_episode_frames}


def describe_env(s: dict) -> str:
    return (f"sticky actions {s['repeat_action_probability']:g}, frame skip {s['frame_skip']} (max-pooled), "
            f"up to {s['noop_max']} no-ops, {s['screen_size']}x{s['screen_size']} grayscale x{s['frame_stack']}, "
            f"a lost life {'ends' if s['episodic_life'] else 'does not end'} an episode, "
            f"at most {s['max_episode_frames']} frames an episode, minimal action set")


def zrl_seed(config: str, seed: int, seconds: float) -> dict:
    """One `zrl run` of configs/CONFIG.yaml for `seconds`: its curve ([s, env steps, mean
    return]), its progress ([s, env steps, env steps/s], logged before any episode ends)
    and env steps; {"failed": why} if it fails."""
    with tempfile.TemporaryDirectory(prefix="zrl-atari-") as d:
        s = zrl_run(config, seed, seconds, d, ["--no-live", "-o", "run.stop_at_return=null", "-o", f"run.return_window={WINDOW}",
                                                "-o", f"learner.log_interval_s={CURVE_LOG_S}", "-o", "learner.checkpoint_interval_s=1e6"],
                    grace_s=300)
        if "failed" in s:
            return s
        t0 = s["started_at_unix"]
        final = Path(d) / "learner_final.json"
        learner = json.loads(final.read_text()) if final.exists() else {}
        return {"seed": seed, "env_steps": s["env_steps"], "curve": read_curve(d, "episode/return", t0),
                "progress": read_curve(d, "perf/env_steps_per_s", t0),
                "updates": learner.get("updates"), "train_seconds": learner.get("train_seconds"), "perf": learner.get("perf") or {}}


def reference_seed(game: Game, env: dict, seed: int, seconds: float) -> dict:
    args = {"seed": seed, "env_id": game.env_id, "window": WINDOW, "max_s": seconds, **env}
    return {"seed": seed, **references.run_reference(references.PPO_ATARI, args, timeout=seconds + 600)}


def per_minute(curve: list, seconds: float, progress: list = ()) -> list[tuple[int, int, float | None]]:
    """(seconds, env steps, mean return) at the end of each whole minute of the run: the last
    return of `curve` ([s, env steps, mean return] points) by then (None before its first),
    and the most env steps either it or `progress` ([s, env steps, ...] points logged
    whether or not an episode ended) had counted by then."""
    rows = []
    for minute in range(1, int(seconds // 60) + 1):
        by_then = [p for p in curve if p[0] <= 60 * minute]
        steps = max([p[1] for p in by_then] + [p[1] for p in progress if p[0] <= 60 * minute], default=0)
        rows.append((60 * minute, steps, by_then[-1][2] if by_then else None))
    return rows


def run(opts: BenchOptions) -> BenchResult:
    name, seeds, reference, configs = _chosen
    return measure(name, opts, seeds, reference, configs)


def measure(name: str, opts: BenchOptions, seeds: tuple[int, ...] | None = None, reference: str = "none",
            configs: tuple[str, ...] | None = None) -> BenchResult:
    game = GAMES[name]
    seconds = opts.seconds or (90.0 if opts.quick else 3600.0)
    seeds = list(seeds or ((1,) if opts.quick else (1, 2)))
    result = BenchResult(name=f"atari_{name}", title=f"{game.env_id}: mean return of the last {WINDOW} episodes, per minute of a {seconds:.0f} s run",
                         columns=["system", "seed", "seconds", "env_frames", "mean_return"])
    frame_skips = {}  # the configs that can run, and their frame skip
    for config in configs or game.configs:
        problem = config_problem(game, config)
        if problem:
            result.notes.append(problem)
        else:
            frame_skips[config] = load_config(ROOT / "configs" / f"{config}.yaml").env.frame_skip
    if not frame_skips:
        return result
    env = env_settings(next(iter(frame_skips)))
    runs: dict[str, list[dict]] = {}
    for seed in seeds:
        for config, frame_skip in frame_skips.items():
            add_run(result, runs, f"zrl {config}", zrl_seed(config, seed, seconds), seconds, frame_skip=frame_skip)
        if reference == "sb3":
            if not references.sb3_installed():
                result.notes.append("stable-baselines3 is not installed (pip install -e .[bench]): no reference.")
                reference = "none"
            else:
                add_run(result, runs, references.PPO_ATARI.system, reference_seed(game, env, seed, seconds), seconds, frame_skip=env["frame_skip"])
    result.notes.append(f"Env (every system): {game.env_id}, {describe_env(env)}.")
    if reference == "sb3":
        result.notes.append(f"Reference: {references.PPO_ATARI.settings}; run after zrl's, for the same wall time.")
    if plot(runs, opts.out / f"atari_{name}.png", f"{game.env_id}, {seconds / 60:.0f}-minute runs", WINDOW):
        result.notes.append(f"Curves: atari_{name}.png (beside this table)")
    result.extra["runs"] = runs
    return result


def add_run(result: BenchResult, runs: dict[str, list[dict]], system: str, run: dict, seconds: float, frame_skip: int) -> None:
    """One run's rows (a failed run: a note), and its curve for the plot."""
    runs.setdefault(system, []).append(run)
    if "failed" in run:
        result.notes.append(f"{system}, seed {run['seed']}: failed ({run['failed']}).")
        return
    for at, steps, mean in per_minute(run["curve"], seconds, run.get("progress", ())):
        result.add(system=system, seed=run["seed"], seconds=at, env_frames=steps * frame_skip, mean_return=mean)
    if run.get("perf"):
        result.notes.append(f"{system}, seed {run['seed']}: {time_spent(run, frame_skip)}")


def time_spent(run: dict, frame_skip: int) -> str:
    """Where a zrl run's time went: the actors' and the learner's rates, waiting, lag."""
    perf, updates, train_s = run["perf"], run.get("updates") or 0, run.get("train_seconds") or 0
    return (f"{run['env_steps'] * frame_skip:,} frames; actors {frame_skip * perf.get('env_steps_per_s', 0):,.0f} frames/s, "
            f"learner {frame_skip * perf.get('learner_samples_per_s', 0):,.0f} frames/s and "
            f"{updates / train_s if train_s else 0:.1f} updates/s, waiting for data "
            f"{100 * perf.get('wait_for_data_frac', 0):.0f}% of its time, policy lag {perf.get('policy_lag_mean')} "
            f"(max {perf.get('policy_lag_max')}).")
