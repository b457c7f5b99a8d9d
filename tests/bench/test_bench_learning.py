"""`zrl bench learning` without training: its task table, its targets, its references'
scripts, how it runs them (faked), its curves and plot, and how `zrl bench` chooses a task."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
from pathlib import Path

import gymnasium
import pytest
from click.testing import CliRunner

from zrl import cli
from zrl.bench import learning, references
from zrl.bench.harness import BenchOptions

ROOT = Path(__file__).resolve().parents[2]


def fake_run(system: str, seed: int, time_s: float = 10.0, reached: bool = True) -> dict:
    return {"seed": seed, "reached": reached, "time_s": time_s, "env_steps": 1000 * seed, "curve": [[1.0, 100, 5.0], [time_s, 1000, 480.0]]}


@pytest.mark.timeout(30)
def test_every_config_of_the_task_table_runs_or_is_skipped_with_a_note():
    for task in learning.TASKS.values():
        gymnasium.spec(task.env_id)  # (registered even where its extra is missing)
        assert task.seeds and task.window >= 1 and 0 < task.quick_limit_s <= task.limit_s
        assert task.references and len({r.system for r in task.references}) == len(task.references)
        for config in task.configs:
            path = ROOT / "configs" / f"{config.name}.yaml"
            problem = learning.config_problem(task, config.name)
            if not path.exists():
                assert problem == f"configs/{config.name}.yaml does not exist (yet): its row is skipped."
            elif problem is not None:  # (a config that is being written may not load yet)
                assert f"configs/{config.name}.yaml" in problem and "skipped" in problem


@pytest.mark.timeout(30)
def test_a_config_that_trains_another_env_or_does_not_load_is_skipped(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "other_env.yaml").write_text("env:\n  id: Pendulum-v1\n")
    (tmp_path / "configs" / "broken.yaml").write_text("learner:\n  learning_rat: 1\n")
    monkeypatch.setattr(learning, "ROOT", tmp_path)
    task = learning.TASKS["cartpole"]
    assert learning.config_problem(task, "other_env") == "configs/other_env.yaml trains Pendulum-v1, not CartPole-v1: its row is skipped."
    assert "configs/broken.yaml does not load" in learning.config_problem(task, "broken")
    assert "does not exist (yet)" in learning.config_problem(task, "nosuch")


@pytest.mark.timeout(30)
def test_a_task_whose_extra_is_missing_is_skipped_with_a_note(tmp_path, monkeypatch):
    task = learning.Task(env_id="HalfCheetah-v5", window=5, configs=(learning.ZrlConfig("halfcheetah_sac"),),
                         references=(references.SAC_HALFCHEETAH,), limit_s=900, quick_limit_s=30, seeds=(1,),
                         needs=(("zrl_no_such_module", "mujoco"),))
    monkeypatch.setitem(learning.TASKS, "nowhere", task)
    monkeypatch.setattr(learning, "zrl_seed", lambda *a: pytest.fail("ran a task whose env cannot be built"))
    result = learning.measure("nowhere", BenchOptions(out=tmp_path))
    assert result.rows == [] and result.name == "learning_nowhere"
    assert result.notes == ["HalfCheetah-v5 needs zrl_no_such_module, not installed (pip install -e .[mujoco]): nothing measured."]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", list(learning.TASKS))
def test_each_task_runs_its_systems_seed_by_seed_and_reports_a_row_each(name, tmp_path, monkeypatch):
    task = learning.TASKS[name]
    order = []

    def zrl_seed(task_, config, seed, limit_s):
        order.append((f"zrl {config}", seed))
        run = fake_run(config, seed, time_s=5.0 * seed)
        return run if task.target_return is not None else {**run, "eval_return": 1000.0 + seed, "trained_s": limit_s + 3}

    def reference_seed(task_, reference, seed, limit_s):
        order.append((reference.system, seed))
        run = fake_run(reference.system, seed, time_s=20.0)
        return run if task.target_return is not None else {**run, "eval_return": 900.0, "trained_s": limit_s}

    monkeypatch.setattr(learning, "missing_extra", lambda task: None)
    monkeypatch.setattr(learning, "zrl_seed", zrl_seed)
    monkeypatch.setattr(learning, "reference_seed", reference_seed)
    monkeypatch.setattr(references, "sb3_installed", lambda: True)
    result = learning.measure(name, BenchOptions(out=tmp_path), seeds=(1, 2))
    runnable = [c for c in task.configs if learning.config_problem(task, c.name) is None]
    systems = [c.system for c in runnable] + [r.system for r in task.references]
    assert order == [(s, seed) for seed in (1, 2) for s in systems]  # interleaved: every system's seed 1 first
    assert [row["system"] for row in result.rows] == systems
    assert result.name == learning.result_name(name) == ("learning" if name == "cartpole" else f"learning_{name}")
    assert set(result.extra["runs"]) == set(systems)
    for c in task.configs:
        if c not in runnable:
            assert any(f"configs/{c.name}.yaml" in n for n in result.notes)
    for row in result.rows:
        assert set(row) == set(result.columns)
    if task.target_return is None:
        medians = {row["system"]: row["median_return"] for row in result.rows}
        assert medians == {**{c.system: 1001.5 for c in runnable}, **{r.system: 900.0 for r in task.references}}


@pytest.mark.timeout(30)
def test_cartpole_rows_report_their_ratio_and_judge_their_targets(tmp_path, monkeypatch):
    times = {"cartpole_impala": [8.0, 9.0], "cartpole_apex": [30.0, 35.0], "cartpole_ppo": [5.0, 6.0],
             "cartpole_appo": [50.0, 70.0], "cartpole_a3c": [40.0, 80.0]}
    monkeypatch.setattr(learning, "config_problem", lambda task, config: None)
    monkeypatch.setattr(learning, "zrl_seed", lambda task, config, seed, limit_s: fake_run(config, seed, times[config][seed - 1]))
    monkeypatch.setattr(learning, "reference_seed", lambda task, ref, seed, limit_s: fake_run(ref.system, seed, 20.0))
    monkeypatch.setattr(references, "sb3_installed", lambda: True)
    rows = {r["system"]: r for r in learning.measure("cartpole", BenchOptions(out=tmp_path), seeds=(1, 2)).rows}
    ppo = rows["zrl cartpole_ppo"]
    assert ppo["ratio"] == pytest.approx(5.5 / 20.0) and ppo["met"] == "yes"
    assert ppo["target"] == "each seed faster than zrl cartpole_impala; median <= 0.4 x SB3 PPO (rl-zoo)"
    assert (rows["zrl cartpole_appo"]["met"], rows["zrl cartpole_a3c"]["met"]) == ("no", "yes")
    assert rows["zrl cartpole_impala"]["met"] == rows["zrl cartpole_impala"]["ratio"] == rows["SB3 PPO (rl-zoo)"]["target"] == "-"
    assert rows["zrl cartpole_ppo"]["per_seed_s"] == "5.0 6.0" and rows["zrl cartpole_ppo"]["seeds_reached"] == "2/2"


@pytest.mark.timeout(30)
def test_targets_judge_failed_and_missing_runs():
    ok = lambda seed, t, reached=True: {"seed": seed, "reached": reached, "time_s": t}  # noqa: E731
    failed = {"seed": 2, "failed": "zrl run exited with 1"}
    ratio = learning.MedianRatio("ref", 0.5)
    assert ratio.judge([ok(1, 4.0), ok(2, 6.0)], {"ref": [ok(1, 10.0), ok(2, 12.0)]}) == (pytest.approx(5.0 / 11.0), True)
    assert ratio.judge([ok(1, 4.0), failed], {"ref": [ok(1, 10.0), ok(2, 12.0)]}) == (pytest.approx(4.0 / 11.0), False)  # (a failed seed)
    assert ratio.judge([ok(1, 4.0)], {}) == (None, None)  # no reference in this sitting
    capped = {"ref": [ok(1, 60.0, reached=False), ok(2, 60.0, reached=False)]}  # (its times only lower bounds)
    assert ratio.judge([ok(1, 20.0), ok(2, 30.0)], capped) == (pytest.approx(25.0 / 60.0), True)
    assert ratio.judge([ok(1, 20.0), ok(2, 10.0, reached=False)], capped) == (pytest.approx(0.25), False)  # (its median not reached)
    three = [ok(1, 4.0), ok(2, 5.0), ok(3, 60.0, reached=False)]  # (the cap is the slowest: the median stands)
    assert ratio.judge(three, {"ref": [ok(1, 10.0), ok(2, 12.0)]}) == (pytest.approx(5.0 / 11.0), True)
    faster = learning.FasterEachSeed("ref")
    assert faster.judge([ok(1, 4.0), ok(2, 13.0)], {"ref": [ok(1, 10.0), ok(2, 12.0)]}) == (None, False)
    assert faster.judge([ok(1, 4.0), ok(2, 11.0)], {"ref": [ok(1, 10.0), ok(2, 12.0)]}) == (None, True)
    assert faster.judge([ok(1, 4.0), ok(2, 11.0)], {"ref": [ok(1, 10.0), failed]}) == (None, None)
    within = learning.WithinEachSeed(60.0)
    assert within.judge([ok(1, 59.0), ok(2, 60.0)], {}) == (None, True)
    assert within.judge([ok(1, 59.0), ok(2, 60.0, reached=False)], {}) == (None, False)
    assert learning.judge((ratio, faster), [ok(1, 4.0)], {}) == (None, None)
    assert learning.judge((ratio, within), [ok(1, 4.0)], {}) == (None, None)
    assert learning.judge((ratio, within), [ok(1, 70.0)], {}) == (None, False)
    assert learning.judge((), [ok(1, 4.0)], {}) == (None, None)


@pytest.mark.timeout(30)
def test_the_reference_scripts_compile_and_name_what_they_stop_at():
    for task in learning.TASKS.values():
        for ref in task.references:
            assert ref in references.REFERENCES
    for ref in references.REFERENCES:
        compile(ref.script, ref.system, "exec")
        assert "args = json.loads(sys.argv[1])" in ref.script and "callback=watch" in ref.script
        assert "print(json.dumps(" in ref.script  # (its result, the last line of its output)
    assert "eval_return" in references.SAC_HALFCHEETAH.script and "deterministic=True" in references.SAC_HALFCHEETAH.script
    assert "total_timesteps=10**9" in references.SAC_PENDULUM.script  # (allowed past the zoo's 20k steps)


@pytest.mark.timeout(30)
def test_a_reference_gets_a_log_folder_of_its_own_removed_with_the_run_and_a_failure_is_recorded(monkeypatch):
    """SB3's logger makes a folder ($SB3_LOGDIR, else a new tempdir/SB3-<time> left behind)."""
    seen = {}

    def run(argv, **kw):
        folder = kw["env"]["SB3_LOGDIR"]
        seen["folder"], seen["existed"], seen["args"] = folder, os.path.isdir(folder), json.loads(argv[-1])
        out = {"reached": True, "time_s": 1.0, "env_steps": 10, "mean_return": 500.0, "curve": []}
        return subprocess.CompletedProcess(argv, 0, stdout="some log\n" + json.dumps(out) + "\n", stderr="")

    monkeypatch.setattr(references.subprocess, "run", run)
    got = learning.reference_seed(learning.TASKS["pendulum"], references.SAC_PENDULUM, 3, 60.0)
    assert got == {"seed": 3, "reached": True, "time_s": 1.0, "env_steps": 10, "mean_return": 500.0, "curve": []}
    assert seen["existed"] and not os.path.exists(seen["folder"])
    assert seen["args"] == {"seed": 3, "env_id": "Pendulum-v1", "window": 20, "target": -200.0, "max_s": 60.0}

    monkeypatch.setattr(references.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 1, stdout="", stderr="Traceback: boom"))
    got = learning.reference_seed(learning.TASKS["halfcheetah"], references.SAC_HALFCHEETAH, 1, 30.0)
    assert got["seed"] == 1 and got["failed"].startswith("SB3 SAC (rl-zoo) exited with 1") and "boom" in got["failed"]


@pytest.mark.timeout(30)
def test_zrl_bench_chooses_the_learning_task_and_seeds_and_refuses_them_elsewhere(monkeypatch):
    assert cli.LEARNING_TASKS == tuple(learning.TASKS) and cli.LEARNING_TASKS[0] == "cartpole"
    import zrl.bench.runner as runner

    seen = []
    monkeypatch.setattr(runner, "run_benchmarks", lambda name, out, **kw: seen.append((name, learning._chosen)))
    monkeypatch.setattr(cli, "_sigterm_as_interrupt", lambda: None)
    invoke = lambda *args: CliRunner().invoke(cli.main, ["bench", *args])  # noqa: E731
    assert invoke("learning", "--task", "pendulum", "--seeds", "4,5").exit_code == 0
    assert invoke("learning").exit_code == 0
    assert seen == [("learning", ("pendulum", (4, 5))), ("learning", ("cartpole", None))]
    assert learning._chosen == ("cartpole", None)  # (restored)
    r = invoke("kernels", "--task", "pendulum")
    assert r.exit_code == 2 and "--task chooses what the learning benchmark runs; kernels has none" in r.output
    r = invoke("kernels", "--seeds", "1")
    assert r.exit_code == 2 and "--seeds chooses the learning and atari benchmarks' seeds; kernels has none" in r.output
    r = invoke("learning", "--seeds", "1,x")
    assert r.exit_code == 2 and "expected comma-separated integers" in r.output
    with pytest.raises(ValueError, match="unknown learning task 'nosuch'"):
        with learning.chosen("nosuch"):
            pass


@pytest.mark.timeout(30)
def test_make_readme_has_a_section_for_every_task():
    spec = importlib.util.spec_from_file_location("make_readme", ROOT / "bench" / "make_readme.py")
    make_readme = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_readme)
    sections = [name for name, _ in make_readme.SECTIONS]
    for name in learning.TASKS:
        result = learning.result_name(name)
        assert result in sections
        if name != "cartpole":
            assert make_readme.RUN_COMMANDS[result] == f"zrl bench learning --task {name}"


@pytest.mark.timeout(30)
def test_learning_curve_is_read_from_the_learners_scalars_timed_from_the_start(tmp_path):
    from zrl.metrics import MetricsWriter

    t0 = time.time()
    w = MetricsWriter(tmp_path, console=False)
    for steps, ret in ((1000, 20.0), (2000, 150.5), (3000, None), (4000, 480.25)):  # (None: no episode yet, not logged)
        w.scalars({"episode/return": ret, "eval/return": None, "perf/env_steps_per_s": 9.0}, steps)
    w.close()
    curve = learning.read_curve(tmp_path, "episode/return", t0)
    assert [(p[1], p[2]) for p in curve] == [(1000, 20.0), (2000, 150.5), (4000, 480.25)]
    assert all(0 <= p[0] <= time.time() - t0 for p in curve)
    assert learning.read_curve(tmp_path, "eval/return", t0) == []


@pytest.mark.timeout(60)
def test_learning_plot_draws_every_curve_or_says_it_cannot(tmp_path):
    runs = {
        "zrl cartpole_impala": [{"curve": [[3.0, 30_000, 40.0], [6.0, 300_000, 480.0]]}, {"curve": [[3.5, 32_000, 35.0], [7.0, 350_000, 476.0]]}],
        "SB3 PPO (rl-zoo)": [{"curve": [[1.0, 50, None], [2.0, 100, 12.0], [20.0, 60_000, 475.5]]}],  # (None: no episode yet)
    }
    png = tmp_path / "out" / "learning.png"
    assert learning.plot({"zrl cartpole_impala": [{"reached": False}]}, png, "t", 100, 475.0) is False and not png.exists()
    drew = learning.plot(runs, png, "CartPole-v1 to 475", 100, 475.0)
    budget = learning.plot(runs, tmp_path / "out" / "learning_halfcheetah.png", "HalfCheetah-v5", 5)  # (no target line)
    if importlib.util.find_spec("matplotlib") is None:
        assert drew is budget is False and not png.exists()
    else:
        assert drew is budget is True and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


@pytest.mark.timeout(30)
def test_a_zrl_run_is_asked_for_the_tasks_rule_and_read_from_its_summary(monkeypatch):
    seen = []

    def run_group(argv, cwd, timeout):
        seen.append(argv)
        logdir = Path(argv[argv.index("--logdir") + 1])
        summary = {"started_at_unix": time.time(), "wall_s": 31.0, "time_to_target_s": 12.5, "env_steps": 5000, "reached": True}
        (logdir / "summary.json").write_text(json.dumps(summary))
        return 0

    monkeypatch.setattr(learning, "run_group", run_group)
    monkeypatch.setattr(learning, "greedy_return", lambda logdir: {"eval_return": 1234.5})
    got = learning.zrl_seed(learning.TASKS["pendulum"], "pendulum_sac", 2, 600.0)
    assert got == {"seed": 2, "env_steps": 5000, "return_source": "train", "curve": [], "reached": True, "time_s": 12.5}
    argv = " ".join(seen[-1])
    assert "--seed 2 " in argv and "--stop-at-return -200.0 " in argv and "--max-seconds 600.0 " in argv
    assert "-o run.return_window=20" in argv and "configs/pendulum_sac.yaml" in argv

    got = learning.zrl_seed(learning.TASKS["halfcheetah"], "halfcheetah_sac", 1, 900.0)
    assert got["eval_return"] == 1234.5 and got["trained_s"] == 31.0 and "time_s" not in got
    argv = " ".join(seen[-1])
    assert "-o run.stop_at_return=null" in argv and "--stop-at-return" not in argv and "--max-seconds 900.0 " in argv

    monkeypatch.setattr(learning, "run_group", lambda argv, cwd, timeout: 2)
    assert learning.zrl_seed(learning.TASKS["cartpole"], "cartpole_ppo", 1, 60.0) == {"seed": 1, "failed": "zrl run exited with 2"}
