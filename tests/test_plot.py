"""`zrl plot LOGDIR... --out FILE.png`: runs' returns from their TensorBoard events, side by side;
a clear word for a directory without events, runs without returns, or no matplotlib."""
from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from zrl.cli import main
from zrl.metrics import MetricsWriter
from zrl.plot import read_returns, run_labels

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_run(logdir, returns, eval_returns=()):
    """A run's events as the learner writes them: scalars at env steps 100, 200, ..."""
    metrics = MetricsWriter(logdir, console=False)
    for i, r in enumerate(returns):
        metrics.scalars({"episode/return": r, "eval/return": eval_returns[i] if i < len(eval_returns) else None,
                         "perf/env_steps_per_s": 1000.0}, 100 * (i + 1))
    metrics.close()
    return logdir


def plot(*args):
    return CliRunner().invoke(main, ["plot", *map(str, args)])


def test_two_runs_side_by_side_make_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason='the plot extra: pip install "zrl[plot]"')
    a = write_run(tmp_path / "impala", [10, 20, 40], eval_returns=[15, 30, 45])
    b = write_run(tmp_path / "ppo", [12, 18, 25, 50])
    out = tmp_path / "figs" / "returns.png"
    result = plot(a, b, "--out", out)
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 10_000


def test_returns_are_read_against_env_steps_and_wall_time(tmp_path):
    curves = read_returns(write_run(tmp_path / "run", [1, 2, 3]))
    assert set(curves) == {"episode/return"}  # (no eval/return logged: no row for it)
    c = curves["episode/return"]
    assert c.steps == [100, 200, 300] and c.values == [1.0, 2.0, 3.0]
    assert c.seconds[0] >= 0 and c.seconds == sorted(c.seconds)


def test_runs_are_labelled_by_directory_and_told_apart_where_names_repeat(tmp_path):
    assert run_labels([tmp_path / "a", tmp_path / "b"]) == ["a", "b"]
    assert run_labels([tmp_path / "x" / "seed0", tmp_path / "y" / "seed0"]) == [str(tmp_path / "x" / "seed0"), str(tmp_path / "y" / "seed0")]


def test_a_directory_without_events_is_refused_saying_so(tmp_path):
    (tmp_path / "empty").mkdir()
    result = plot(tmp_path / "empty", "--out", tmp_path / "x.png")
    assert result.exit_code == 1
    assert "no TensorBoard events" in result.output and "not a run's logdir" in result.output
    assert not (tmp_path / "x.png").exists()


def test_a_parent_of_runs_is_refused_naming_the_runs_in_it(tmp_path):
    write_run(tmp_path / "runs" / "one", [1.0])
    result = plot(tmp_path / "runs", "--out", tmp_path / "x.png")
    assert result.exit_code == 1 and str(tmp_path / "runs" / "one") in result.output


def test_runs_that_logged_no_return_yet_are_refused(tmp_path):
    metrics = MetricsWriter(tmp_path / "run", console=False)
    metrics.scalars({"perf/env_steps_per_s": 1.0}, 10)
    metrics.close()
    result = plot(tmp_path / "run", "--out", tmp_path / "x.png")
    assert result.exit_code == 1 and "no episode/return or eval/return logged" in result.output


def test_without_matplotlib_it_says_what_to_install(tmp_path, monkeypatch):
    run = write_run(tmp_path / "run", [1.0, 2.0])
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    result = plot(run, "--out", tmp_path / "x.png")
    assert result.exit_code == 1 and 'pip install "zrl[plot]"' in result.output
