"""Checkpoints of a learner: written atomically, and read back by `--resume`.

`find_resume` reads the newest checkpoint of a run and says what changed since
(a checkpoint of another model is refused, naming the difference);
`check_resume` does what a resuming learner would refuse before any process
starts (`zrl run --resume`, so that a refused resume writes nothing);
`restore` puts it into a freshly set-up algorithm and the run's progress;
`Checkpoints.save` writes one, and refuses to write one whose config does not
describe its weights; the one saved with the highest mean return so far is
also kept as checkpoints/best.pt. A fresh run moves an earlier run's checkpoints aside
before its first save, so `--resume`, `zrl eval` and `zrl serve` never pick up
another run's weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from zrl import checkpoint, spaces
from zrl.algorithms.base import Algorithm
from zrl.config import Config
from zrl.learner.progress import Progress


@dataclass
class ResumeState:
    path: Path
    state: dict[str, Any]

    def specs(self) -> tuple[spaces.Spec, spaces.Spec]:
        return spaces.from_json(self.state["obs_spec"]), spaces.from_json(self.state["action_spec"])


def find_resume(config: Config, ckdir: Path | None, say: Callable[[str], None]) -> ResumeState | None:
    """The newest checkpoint in ckdir, checked against this config; None when there is none."""
    if ckdir is None:
        raise ValueError("--resume needs a logdir")
    found = checkpoint.load_latest(ckdir)
    if found is None:
        say(f"no checkpoint in {ckdir}; starting fresh")
        return None
    path, state = found
    obs, act = state.get("obs_spec"), state.get("action_spec")
    checkpoint.check_compatible(path, state, config.model_hash(obs, act), config.model_shaping(obs, act))
    for key, theirs, ours in checkpoint.algo_changes(state, config):
        say(f"warning: {path} was trained with algo.{key} {theirs!r}, this config has {ours!r}")
    trained_on = state["config"].get("env", {}).get("id")
    if trained_on != config.env.id:  # (allowed where the specs agree: another version of the same env, say)
        say(f"warning: {path} was trained on env.id {trained_on!r}, this config has {config.env.id!r}")
    if checkpoint.optimizer_of(state) == config.learner.optimizer:
        for key, theirs, ours in checkpoint.optimizer_changes(state, config):
            say(f"{path} was trained with learner.{key} {theirs!r}; resuming with this config's {ours!r}")
    return ResumeState(path, state)


def check_specs(resume: ResumeState, specs: tuple[spaces.Spec, spaces.Spec], config: Config) -> None:
    """Refuses a checkpoint trained for other observation or action specs than the config's."""
    ck_obs, ck_act = resume.specs()
    if (ck_obs, ck_act) != tuple(specs):
        trained_on = resume.state["config"].get("env", {}).get("id")
        raise checkpoint.CheckpointError(
            f"{resume.path} was trained on env.id {trained_on!r} for obs {ck_obs.to_json()} and actions {ck_act.to_json()}, "
            f"but this config (env.id {config.env.id!r}) gives obs {specs[0].to_json()} and actions {specs[1].to_json()}: "
            "its weights cannot act there. Resume with the run's own config (its config.yaml), or start a fresh run")


def check_resume(config: Config, ckdir: Path) -> dict[str, Any] | None:
    """What a learner resuming from ckdir with `config` would refuse (CheckpointError, or
    ConfigError for an env that cannot be made), found before any process starts. Returns
    the newest checkpoint's counters; None when there is none (the run starts fresh)."""
    from zrl.envs.specs import config_specs  # lazy: makes an env (gymnasium)

    resume = find_resume(config, ckdir, lambda text: None)  # (the learner says its warnings)
    if resume is None:
        return None
    check_specs(resume, config_specs(config), config)
    return dict(resume.state["counters"])


def restore(resume: ResumeState, algo: Algorithm, progress: Progress, say: Callable[[str], None]) -> float:
    """Loads the checkpoint into `algo` (set up) and `progress`; returns the training seconds it had."""
    st, lc = resume.state, algo.config.learner
    theirs = checkpoint.optimizer_of(st)
    try:
        algo.restore(st, optimizer_matches=theirs == lc.optimizer)
    except (RuntimeError, ValueError, KeyError) as e:
        raise checkpoint.CheckpointError(f"{resume.path}: does not fit the model: {e}") from None
    if theirs != lc.optimizer:
        say(f"warning: {resume.path} was trained with learner.optimizer {theirs}, this config "
            f"has {lc.optimizer}: the optimiser starts afresh (the model's weights carry over)")
    c = st["counters"]
    progress.restore(c)
    say(f"resumed from {resume.path} at update {progress.updates}, env step {progress.env_steps}")
    returns, window, target = progress.target_returns(), algo.config.run.return_window, progress.stop_at_return
    if target is not None and len(returns) >= window and np.mean(returns) >= target:
        say(f"note: the resumed run's last {window} returns (mean {np.mean(returns):.1f}) already reach the target "
            f"{target:g}, so it stops at once; raise --stop-at-return (run.stop_at_return) to train on")
    return float(c.get("train_seconds", 0.0))


class Checkpoints:
    """Saves the learner's state into `ckdir`, keeping the newest `learner.keep_checkpoints`
    and, as best.pt, the one saved with the highest mean return."""

    def __init__(self, config: Config, ckdir: Path | None, resumed: bool, say: Callable[[str], None]):
        self.config = config
        self.ckdir = ckdir
        self.resumed = resumed
        self.say = say
        self._claimed = False  # a fresh run moves an earlier run's checkpoints aside before its first save
        self._best: float | None = None  # the mean return best.pt was saved with
        self._best_read = not resumed  # a resumed run's best.pt is read at its first save
        self._expected_shapes: dict[str, dict[str, tuple]] = {}  # {model hash: the weights' shapes a fresh build has}

    def save(self, algo: Algorithm, progress: Progress, specs: tuple[spaces.Spec, spaces.Spec], train_seconds: float) -> Path | None:
        if self.ckdir is None or algo is None or algo.model is None:
            return None
        if not self.resumed and progress.updates == 0:
            return None  # a fresh run that has not trained: nothing worth keeping, and nothing moved aside
        if not self.resumed and not self._claimed:
            moved = checkpoint.set_aside(self.ckdir)
            if moved is not None:
                self.say(f"{self.ckdir} held an earlier run's checkpoints; moved them to {moved} (use --resume to continue a run)")
            self._claimed = True
        obs, act = specs[0].to_json(), specs[1].to_json()
        counters = {**progress.counters(), "train_seconds": train_seconds}
        state = {
            "model_hash": self.config.model_hash(obs, act),
            "model_shaping": self.config.model_shaping(obs, act),
            "config": self.config.to_dict(),
            "obs_spec": obs,
            "action_spec": act,
            **algo.checkpoint_state(),
            "counters": counters,
            "mean_return": progress.mean_return(),  # what best.pt is chosen by
        }
        self._check_describes(algo, specs, state)
        path = checkpoint.save(self.ckdir, counters["updates"], state, self.config.learner.keep_checkpoints)
        self._keep_if_best(path, state["mean_return"])
        return path

    def _keep_if_best(self, path: Path, mean_return: float | None) -> None:
        """Makes `path` best.pt if its mean return beats every earlier save's (a resumed run's
        best.pt from before the resume included)."""
        if mean_return is None:
            return  # no episode has ended yet
        if not self._best_read:
            self._best, self._best_read = checkpoint.best_return(self.ckdir), True
        if self._best is None or mean_return > self._best:
            checkpoint.mark_best(path)
            self._best = mean_return

    def _check_describes(self, algo: Algorithm, specs: tuple[spaces.Spec, spaces.Spec], state: dict[str, Any]) -> None:
        """Refuses (CheckpointError) to write a checkpoint whose config, specs and weights do not
        belong together: `zrl eval`, `zrl serve` and `--resume` rebuild the model from them."""
        built = algo.config.model_shaping(algo.obs_spec.to_json(), algo.action_spec.to_json())
        problems = checkpoint.shaping_differences(built, state["model_shaping"])
        if algo.config.env != self.config.env:
            problems.append(f"env: the model was built for {algo.config.env.id!r}, the config to save has {self.config.env.id!r}")
        if not problems:
            problems = self._shape_differences(algo, specs, state["model"])
        if problems:
            raise checkpoint.CheckpointError(f"refusing to write a checkpoint to {self.ckdir} whose config does not describe its "
                                             "weights: " + "; ".join(problems))

    def _shape_differences(self, algo: Algorithm, specs: tuple[spaces.Spec, spaces.Spec], weights: dict[str, Any]) -> list[str]:
        """How the weights' shapes differ from those of a model built afresh from the config and specs to save."""
        key = self.config.model_hash(specs[0].to_json(), specs[1].to_json())
        if key not in self._expected_shapes:
            with torch.random.fork_rng(devices=[]):  # (building draws initial weights: leave training's random stream be)
                model = type(algo)(self.config, *specs).build_model()
            self._expected_shapes[key] = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        return checkpoint.weight_differences(self._expected_shapes[key], {k: tuple(v.shape) for k, v in weights.items()})
