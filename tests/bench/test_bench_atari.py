"""`zrl bench atari`: its rows per minute, the reference's env settings, and its options."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from zrl import cli
from zrl.bench import atari, references
from zrl.bench.harness import BenchOptions


@pytest.mark.timeout(30)
def test_each_minute_takes_the_last_point_of_the_curve_by_then():
    curve = [[30.0, 100, None], [50.0, 200, -21.0], [119.0, 900, -20.5], [130.0, 1000, -20.0]]
    assert atari.per_minute(curve, 200.0) == [(60, 200, -21.0), (120, 900, -20.5), (180, 1000, -20.0)]
    assert atari.per_minute([], 130.0) == [(60, 0, None), (120, 0, None)]
    progress = [[10.0, 50, 5.0], [59.0, 300, 6.0], [179.0, 1200, 7.0]]  # (logged before any episode ends)
    assert atari.per_minute(curve, 200.0, progress) == [(60, 300, -21.0), (120, 900, -20.5), (180, 1200, -20.0)]


@pytest.mark.timeout(30)
def test_the_reference_plays_the_env_of_the_first_config():
    env = atari.env_settings("pong_impala")
    assert env == {"repeat_action_probability": 0.0, "frame_skip": 4, "noop_max": 30, "frame_stack": 4, "screen_size": 84,
                   "episodic_life": False, "max_episode_frames": 108000}
    text = atari.describe_env(env)
    assert "sticky actions 0" in text and "frame skip 4" in text and "does not end" in text
    script = references.PPO_ATARI.script
    for key in env:
        assert f'args["{key}"]' in script, key


@pytest.mark.timeout(30)
def test_a_sitting_interleaves_seeds_skips_a_missing_config_and_notes_a_failed_run(monkeypatch, tmp_path):
    calls = []

    def zrl_seed(config, seed, seconds):
        calls.append(("zrl", config, seed))
        if seed == 2:
            return {"seed": seed, "failed": "zrl run exited with 1"}
        return {"seed": seed, "env_steps": 500, "curve": [[20.0, 100, -21.0], [70.0, 400, -19.0], [125.0, 500, -18.5]],
                "updates": 260, "train_seconds": 130.0,
                "perf": {"env_steps_per_s": 4.0, "learner_samples_per_s": 3.9, "wait_for_data_frac": 0.12, "policy_lag_mean": 2.5, "policy_lag_max": 7}}

    def reference_seed(game, env, seed, seconds):
        calls.append(("sb3", env["frame_skip"], seed))
        return {"seed": seed, "reached": False, "time_s": seconds, "env_steps": 300, "mean_return": -20.0,
                "curve": [[61.0, 300, -20.0]]}

    monkeypatch.setattr(atari, "zrl_seed", zrl_seed)
    monkeypatch.setattr(atari, "reference_seed", reference_seed)
    monkeypatch.setattr(atari, "GAMES", {"pong": atari.Game("ALE/Pong-v5", ("pong_impala", "pong_nosuch"))})
    monkeypatch.setattr(references, "sb3_installed", lambda: True)
    result = atari.measure("pong", BenchOptions(out=tmp_path, seconds=130.0), seeds=(1, 2), reference="sb3")
    assert calls == [("zrl", "pong_impala", 1), ("sb3", 4, 1), ("zrl", "pong_impala", 2), ("sb3", 4, 2)]
    assert result.name == "atari_pong"
    zrl_rows = [r for r in result.rows if r["system"] == "zrl pong_impala"]
    assert zrl_rows == [{"system": "zrl pong_impala", "seed": 1, "seconds": 60, "env_frames": 400, "mean_return": -21.0},
                        {"system": "zrl pong_impala", "seed": 1, "seconds": 120, "env_frames": 1600, "mean_return": -19.0}]
    sb3_rows = [r for r in result.rows if r["system"] == "SB3 PPO (rl-zoo)"]
    assert [(r["seed"], r["seconds"], r["env_frames"], r["mean_return"]) for r in sb3_rows] == [
        (1, 60, 0, None), (1, 120, 1200, -20.0), (2, 60, 0, None), (2, 120, 1200, -20.0)]
    notes = "\n".join(result.notes)
    assert "configs/pong_nosuch.yaml does not exist" in notes
    assert "zrl pong_impala, seed 2: failed (zrl run exited with 1)" in notes
    assert ("zrl pong_impala, seed 1: 2,000 frames; actors 16 frames/s, learner 16 frames/s and 2.0 updates/s, "
            "waiting for data 12% of its time, policy lag 2.5 (max 7).") in notes
    assert "ALE/Pong-v5, sticky actions 0" in notes and "Reference: SB3 PPO" in notes
    json.dumps(result.extra)  # (the runs go into the JSON)


@pytest.mark.timeout(30)
def test_zrl_bench_atari_chooses_game_seeds_and_reference_and_pong_is_its_alias(monkeypatch):
    assert cli.ATARI_GAMES == tuple(atari.GAMES) and cli.ATARI_GAMES[0] == "pong"
    import zrl.bench.runner as runner

    seen = []
    monkeypatch.setattr(runner, "run_benchmarks", lambda name, out, **kw: seen.append((name, atari._chosen, kw["seconds"])))
    monkeypatch.setattr(cli, "_sigterm_as_interrupt", lambda: None)
    invoke = lambda *args: CliRunner().invoke(cli.main, ["bench", *args])  # noqa: E731
    assert invoke("atari", "--game", "breakout", "--seeds", "3", "--reference", "sb3", "--seconds", "60").exit_code == 0
    assert invoke("pong").exit_code == 0
    assert invoke("pong", "--configs", "pong_apex").exit_code == 0
    assert seen == [("atari", ("breakout", (3,), "sb3", None), 60.0), ("atari", ("pong", None, "none", None), None),
                    ("atari", ("pong", None, "none", ("pong_apex",)), None)]
    assert atari._chosen == ("pong", None, "none", None)  # (restored)
    r = invoke("pong", "--configs", "breakout_impala")
    assert r.exit_code == 2 and "breakout_impala: not a pong config (known: pong_impala, pong_apex)" in r.output
    r = invoke("kernels", "--game", "pong")
    assert r.exit_code == 2 and "--game, --reference and --configs choose what the atari benchmark runs; kernels has none of them" in r.output
    with pytest.raises(ValueError, match="unknown Atari game 'nosuch'"):
        with atari.chosen("nosuch"):
            pass
