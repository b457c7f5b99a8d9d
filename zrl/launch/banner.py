"""`zrl run`'s first line: what runs, on which env, the return target in force, and where the
run's directory is. A config's run.stop_at_return is tuned for its own env.id: when env.id is
overridden, the line says whether the target in force is the config's (set for another env)
or one given on the command line, or that there is none."""
from __future__ import annotations

from pathlib import Path

from zrl.config import Config, ConfigError, load_config


def banner(cfg: Config, num_actors: int, logdir: Path) -> str:
    run = cfg.run
    extra = (" + a greedy evaluation actor" if run.eval_actor else "") + (f" + an agent server on {cfg.server.bind}" if run.agent_server else "")
    return f"[zrl run] learner + {num_actors} actors{extra} on {cfg.env.id} ({cfg.algo.name}); {target_note(cfg)}; logdir {logdir}"


def target_note(cfg: Config) -> str:
    target = cfg.run.stop_at_return
    own = _file_config(cfg)
    if own is None or own.env.id == cfg.env.id:
        return "no return target" if target is None else f"target return {target:g}"
    if target is None:
        return "no return target (env.id overridden; --stop-at-return sets one)"
    if target == own.run.stop_at_return:
        return f"target return {target:g}, the config's for {own.env.id} (--stop-at-return sets another)"
    return f"target return {target:g}, set for this run"


def _file_config(cfg: Config) -> Config | None:
    """The config as its file has it, without this command line's overrides; None if unreadable."""
    try:
        return load_config(cfg.source)
    except ConfigError:
        return None
