"""`zrl eval --video DIR`: an .mp4 of each episode played, made from the env's own picture
(an Atari game's RGB screen, not the 84x84 grayscale stacks the policy sees).

`video_env_config` adjusts the env section for recording; `record` wraps the envs of a
vector env in `EpisodeRecorder`s, which write DIR/episode-NNN.mp4 as the episodes play.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import gymnasium as gym
import numpy as np

from zrl.config import EnvConfig
from zrl.env_ids import is_atari
from zrl.envs.vector import GymnasiumVectorEnv, VectorEnv

__all__ = ["VideoError", "require_writer", "video_env_config", "record", "EpisodeRecorder"]

INSTALL_HINT = 'pip install "zrl[video]"'


class VideoError(RuntimeError):
    """A video that cannot be made: no writer installed, or an env that cannot render."""


def require_writer() -> None:
    """Raises VideoError, saying what to install, where imageio or its ffmpeg is missing."""
    try:
        import imageio  # noqa: F401  # lazy: optional (the video extra)
        import imageio_ffmpeg  # noqa: F401  # lazy: imageio writes .mp4 through it
    except ImportError as e:
        raise VideoError(f"--video needs imageio with ffmpeg ({e}): {INSTALL_HINT}") from None


def video_env_config(cfg: EnvConfig) -> EnvConfig:
    """The env section a recording plays: Atari on the gymnasium backend (ale_py's C++ vector
    env shows no screen) with whole games as episodes, other envs rendering to arrays."""
    if is_atari(cfg.id):
        return dataclasses.replace(cfg, backend="gymnasium", episodic_life=False)
    return dataclasses.replace(cfg, kwargs={**cfg.kwargs, "render_mode": "rgb_array"})


def record(env: VectorEnv, cfg: EnvConfig, directory: Path) -> list[EpisodeRecorder]:
    """Wraps each env of `env` (made from video_env_config(cfg)) in an EpisodeRecorder that
    writes into `directory`; env k > 0 prefixes its files with envK-."""
    if not isinstance(env, GymnasiumVectorEnv):
        raise VideoError(f"{cfg.id}: {type(env).__name__} cannot be recorded")
    directory.mkdir(parents=True, exist_ok=True)
    fps = 60.0 / cfg.frame_skip if is_atari(cfg.id) else None  # (ALE runs at 60 frames/s; one is kept per step)
    recorders = []
    for k, e in enumerate(env.envs):
        recorders.append(EpisodeRecorder(e, directory, prefix="" if k == 0 else f"env{k}-", fps=fps))
        env.envs[k] = recorders[-1]
    return recorders


class EpisodeRecorder(gym.Wrapper):
    """Writes each episode of the env it wraps to DIR/episode-NNN.mp4, a frame after the reset
    and after each step.

    zrl's vector envs reset an env in the step that ends its episode, so a reset finishes
    the video under way. The episode still playing at close did not end: its file is
    deleted. Files are written under a hidden name and renamed once complete."""

    def __init__(self, env: gym.Env, directory: Path, prefix: str = "", fps: float | None = None):
        super().__init__(env)
        self.directory = directory
        self.prefix = prefix
        self.fps = fps or float(env.metadata.get("render_fps") or 30)
        self.written: list[Path] = []
        self._writer = None
        self._path: Path | None = None

    def reset(self, *, seed=None, options=None):
        self._finish()
        out = self.env.reset(seed=seed, options=options)
        self._start()
        return out

    def step(self, action):
        out = self.env.step(action)
        self._writer.append_data(_even(self._screen()))
        return out

    def close(self):
        self._abandon()
        self.env.close()

    def _start(self) -> None:
        import imageio  # lazy: optional (the video extra); require_writer checked it

        frame = _even(self._screen(first=True))
        self._path = self.directory / f"{self.prefix}episode-{len(self.written):03d}.mp4"
        # macro_block_size 1: _even already gives the sizes H.264 needs, so nothing is rescaled.
        self._writer = imageio.v2.get_writer(self._hidden(), fps=self.fps, macro_block_size=1)
        self._writer.append_data(frame)

    def _finish(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._hidden().replace(self._path)
        self.written.append(self._path)
        self._writer = None

    def _abandon(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._hidden().unlink(missing_ok=True)
            self._writer = None

    def _hidden(self) -> Path:
        return self._path.with_name("." + self._path.name)  # (still .mp4: ffmpeg picks the format by it)

    def _screen(self, first: bool = False) -> np.ndarray:
        """The env's RGB picture now: an Atari game's screen, else render()."""
        ale = getattr(self.env.unwrapped, "ale", None)
        if ale is not None:
            return ale.getScreenRGB()
        try:
            frame = self.env.render()
        except Exception as e:  # (pygame missing, no OpenGL context: each env raises its own)
            if not first:
                raise
            raise VideoError(_render_failure(self.env, e)) from None
        if frame is None:
            raise VideoError(f"{self.env.spec.id if self.env.spec else self.env}: render() gave no picture")
        return frame


def _render_failure(env: gym.Env, e: Exception) -> str:
    name = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
    text = f"{name}: cannot render ({type(e).__name__}: {e})"
    if isinstance(e, gym.error.DependencyNotInstalled):
        return f"{text}: {INSTALL_HINT}"
    if "mujoco" in type(env.unwrapped).__module__:
        return f"{text}; without a display, MuJoCo renders with MUJOCO_GL=egl (or osmesa) set"
    return text


def _even(frame: np.ndarray) -> np.ndarray:
    """The frame padded (edge pixels repeated) to an even height and width, as H.264's
    4:2:0 colour needs."""
    h, w = frame.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return frame
    return np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
