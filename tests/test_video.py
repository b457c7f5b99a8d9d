"""`zrl eval --video DIR`: an .mp4 per episode, of the env's own picture (an Atari game's RGB
screen, not the policy's grayscale stacks), and a clear word where imageio is missing."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from zrl import algorithms, checkpoint
from zrl.cli import main
from zrl.config import load_config
from zrl.envs import probe_specs
from helpers import ROOT, small_config

imageio = pytest.importorskip("imageio", reason='the video extra: pip install "zrl[video]"')


def write_checkpoint(cfg, logdir: Path) -> Path:
    """An untrained policy's checkpoint for cfg, as a learner would write it."""
    obs_spec, action_spec = probe_specs(cfg.env)
    algo = algorithms.get(cfg.algo.name)(cfg, obs_spec, action_spec)
    obs, act = obs_spec.to_json(), action_spec.to_json()
    state = {"model_hash": cfg.model_hash(obs, act), "model_shaping": cfg.model_shaping(obs, act), "config": cfg.to_dict(),
             "obs_spec": obs, "action_spec": act, "model": algo.build_model().state_dict(), "optimizer": {},
             "counters": {"updates": 1, "env_steps": 0, "episodes": 0}}
    return checkpoint.save(logdir / "checkpoints", 1, state, keep=3)


def eval_with_video(logdir: Path, out: Path, episodes: int):
    return CliRunner().invoke(main, ["eval", "--checkpoint", str(logdir), "--episodes", str(episodes), "--video", str(out)])


def frames(path: Path) -> tuple[int, tuple[int, ...]]:
    """(frame count, first frame's shape) of a video."""
    reader = imageio.v2.get_reader(path)
    try:
        return reader.count_frames(), reader.get_data(0).shape
    finally:
        reader.close()


def test_cartpole_eval_writes_an_mp4_per_episode(tmp_path):
    write_checkpoint(small_config("env.max_episode_steps=20"), tmp_path / "run")
    out = tmp_path / "videos"
    result = eval_with_video(tmp_path / "run", out, episodes=2)
    assert result.exit_code == 0, result.output
    assert "2 videos in" in result.output
    videos = sorted(out.iterdir())
    assert [p.name for p in videos] == ["episode-000.mp4", "episode-001.mp4"]  # (no half-played third left behind)
    for p in videos:
        assert p.stat().st_size > 0 and p.read_bytes()[4:8] == b"ftyp"  # an MP4 container
        n, shape = frames(p)
        assert 2 <= n <= 21 and shape == (400, 600, 3)  # the reset's frame and one per step, at CartPole's render size


def test_atari_eval_records_the_games_rgb_screen(tmp_path):
    pytest.importorskip("ale_py")
    cfg = load_config(ROOT / "configs" / "pong_impala.yaml", ["env.max_episode_steps=30", "env.noop_max=0"])
    write_checkpoint(cfg, tmp_path / "run")
    result = eval_with_video(tmp_path / "run", tmp_path / "videos", episodes=1)
    assert result.exit_code == 0, result.output
    (video,) = (tmp_path / "videos").iterdir()
    n, shape = frames(video)
    assert n == 31 and shape == (210, 160, 3)  # the game's screen, not the 84x84 stack


def test_without_imageio_eval_says_what_to_install(tmp_path, monkeypatch):
    write_checkpoint(small_config(), tmp_path / "run")
    monkeypatch.setitem(sys.modules, "imageio", None)  # (import imageio then raises ImportError)
    result = eval_with_video(tmp_path / "run", tmp_path / "videos", episodes=1)
    assert result.exit_code != 0
    assert 'pip install "zrl[video]"' in result.output
    assert not (tmp_path / "videos").exists()
