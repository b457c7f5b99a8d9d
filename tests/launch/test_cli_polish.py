"""The command line's finish: shipped configs found by name, the banner's return target, the live
status line (its text, the terminal line, the relay of the children's output), `--version`,
help on every option, the missing-ale_py message, and `--env-package` reaching every role."""
from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import select
import subprocess
import sys
import time

import click
import pytest
from click.testing import CliRunner

import zrl
import zrl.config
from helpers import ROOT, ZRL
from zrl.cli import main
from zrl.config import ConfigError, load_config, resolve_config_path, shipped_config_names
from zrl.launch.banner import target_note
from zrl.launch.live import ERASE, LiveLine, live_line
from zrl.launch.options import RunOptions
from zrl.launch.progress_tail import ProgressTail
from zrl.launch.relay import OutputRelay
from zrl.launch.status import eta_seconds, format_duration, status_text
from zrl.launch.supervisor import Supervisor

# --config NAME


@pytest.mark.parametrize("name", ["pong_impala", "pong_impala.yaml", "configs/pong_impala.yaml"])
def test_a_shipped_config_is_found_by_name_from_any_directory(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_config_path(name) == ROOT / "configs" / "pong_impala.yaml"
    assert load_config(name).env.id == "ALE/Pong-v5"


def test_a_path_that_exists_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pong_impala.yaml").write_text("env: {id: Acrobot-v1}\n")
    assert load_config("pong_impala.yaml").env.id == "Acrobot-v1"


def test_an_unknown_name_lists_the_shipped_configs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="no shipped config named 'pong_impal'.*cartpole_impala, .*pong_impala"):
        resolve_config_path("pong_impal")
    result = CliRunner().invoke(main, ["actor", "--config", "nope.yaml"])
    assert result.exit_code == 2 and "shipped: acrobot_impala, breakout_impala, cartpole_a3c" in result.output


def test_an_installed_package_finds_the_configs_it_ships(tmp_path, monkeypatch):
    # The layout setup.py's build_py makes: site-packages/zrl/configs/*.yaml, no configs/ beside zrl/.
    package = tmp_path / "site-packages" / "zrl"
    (package / "configs").mkdir(parents=True)
    for name in ("cartpole_impala", "pong_impala"):
        (package / "configs" / f"{name}.yaml").write_text((ROOT / "configs" / f"{name}.yaml").read_text())
    monkeypatch.setattr(zrl.config, "__file__", str(package / "config.py"))
    monkeypatch.chdir(tmp_path)
    assert resolve_config_path("pong_impala") == package / "configs" / "pong_impala.yaml"
    assert resolve_config_path(None) == package / "configs" / "cartpole_impala.yaml"
    assert shipped_config_names() == ["cartpole_impala", "pong_impala"]


# The banner's target


def test_the_banner_says_which_target_is_in_force_when_env_id_is_overridden():
    assert target_note(load_config("cartpole_impala")) == "target return 475"
    inherited = target_note(load_config("cartpole_impala", ["env.id=Acrobot-v1"]))
    assert inherited.startswith("target return 475, the config's for CartPole-v1") and "--stop-at-return" in inherited
    assert target_note(load_config("cartpole_impala", ["env.id=Acrobot-v1", "run.stop_at_return=-100"])) == "target return -100, set for this run"
    assert target_note(load_config("cartpole_impala", ["env.id=Acrobot-v1", "run.stop_at_return=null"])).startswith("no return target")


# The live status line


def test_the_status_text_keeps_the_steps_field_and_gives_an_eta_under_a_limit():
    record = {"elapsed_s": 10.0, "env_steps": 20_000, "steps_per_s": 2000.0, "updates": 7, "mean_return": 51.25, "actors": 2}
    text = status_text(record, RunOptions(num_actors=2, seed=0, logdir="x", max_seconds=100, stop_at_return=475))
    assert text.startswith("[zrl run] 10.0s  steps 20,000  2,000 steps/s  return 51.2  ETA 1:30  target 475")
    assert "ETA" not in status_text(record, RunOptions(num_actors=2, seed=0, logdir="x"))
    by_steps = RunOptions(num_actors=2, seed=0, logdir="x", max_seconds=1000, max_env_steps=30_000)
    assert eta_seconds(record, by_steps) == 5.0  # the nearer limit
    waiting = status_text({"elapsed_s": 1.0, "env_steps": 0, "waiting_for": "data", "actors": 0}, by_steps)
    assert "waiting for data" in waiting and "steps 0" in waiting
    assert format_duration(3723) == "1:02:03"


def test_the_live_line_stays_under_what_is_printed():
    terminal = io.StringIO()
    live = LiveLine(terminal)
    live.set("[zrl run] steps 1")
    live.print_above(terminal, "[actor 0] connected\n")
    live.clear()
    assert terminal.getvalue() == f"{ERASE}[zrl run] steps 1{ERASE}[actor 0] connected\n{ERASE}[zrl run] steps 1{ERASE}"


def test_print_goes_above_the_live_line(monkeypatch):
    terminal = io.StringIO()
    monkeypatch.setattr(terminal, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys, "stdout", terminal)
    with live_line() as live:
        live.set("status")
        print("a line", "in two writes")
    assert terminal.getvalue() == f"{ERASE}status{ERASE}a line in two writes\n{ERASE}status{ERASE}"
    assert sys.stdout is terminal


@pytest.mark.parametrize("live", [True, False])
def test_no_live_keeps_the_terminal_free_of_the_status_line(live, monkeypatch, tmp_path):
    terminal = io.StringIO()
    monkeypatch.setattr(terminal, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys, "stdout", terminal)
    sup = Supervisor(load_config("cartpole_impala"), RunOptions(num_actors=1, seed=1, logdir=str(tmp_path), live=live))
    with contextlib.ExitStack() as stack:
        sup._open_console(stack)
        assert (sup.live is not None) == live and sup.relay is not None  # (the children's lines go through either way)


def test_the_relay_prints_the_childrens_lines_whole(capfd):
    relay = OutputRelay()
    out, err = relay.child_stdio
    os.write(out, b"[actor 0] hel")
    relay.pump(0.5)
    os.write(out, b"lo\n[actor 1] hi\n")
    os.write(err, b"[learner] error: no\n")
    relay.pump(0.5)
    relay.pump(0.5)
    relay.close()
    captured = capfd.readouterr()
    assert captured.out == "[actor 0] hello\n[actor 1] hi\n" and captured.err == "[learner] error: no\n"


def test_the_progress_tail_reads_whole_new_records(tmp_path):
    path = tmp_path / "progress.jsonl"
    path.write_text('{"env_steps": 1}\n')  # an earlier run's (a resume): not read
    tail = ProgressTail(path)
    with open(path, "a") as f:
        f.write('{"env_steps": 2}\n{"env_st')
    assert tail.read() == [{"env_steps": 2}]
    with open(path, "a") as f:
        f.write('eps": 3}\n')
    assert tail.read() == [{"env_steps": 3}] and tail.read() == []


# Commands and options


def _commands(group: click.Group, prefix: str = ""):
    for name, cmd in group.commands.items():
        yield f"{prefix}{name}", cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, f"{prefix}{name} ")


def test_every_option_of_every_command_has_help():
    missing = [f"zrl {name} {opt.opts[0]}" for name, cmd in [("", main), *_commands(main)] for opt in cmd.params
               if isinstance(opt, click.Option) and not opt.hidden and not opt.help]
    assert not missing, f"options without help: {missing}"


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output == f"zrl {zrl.__version__}\n"


def test_device_on_zrl_run_is_learner_device(tmp_path):
    result = CliRunner().invoke(main, ["run", "--device", "gpu", "--logdir", str(tmp_path / "run")])
    assert result.exit_code == 2 and "'--device'" in result.output and "auto, cpu or cuda" in result.output


def test_a_missing_ale_py_says_to_install_the_atari_extra(monkeypatch):
    from zrl.envs import make_vector_env

    monkeypatch.setitem(sys.modules, "ale_py", None)  # import ale_py raises ImportError
    for env_id in ("ALE/Pong-v5", "PongNoFrameskip-v4"):
        with pytest.raises(ConfigError, match=r'pip install "zrl\[atari\]"'):
            make_vector_env(load_config(None, [f"env.id={env_id}"]).env, 1, 0)


def test_an_env_package_that_cannot_be_imported_is_a_config_error():
    from zrl.envs import make_vector_env

    with pytest.raises(ConfigError, match="env.packages: cannot import 'no_such_zrl_envs'.*PYTHONPATH"):
        make_vector_env(load_config(None, ["env.packages=[no_such_zrl_envs]"]).env, 1, 0)


# --env-package, and the live line, in a real `zrl run` on a terminal

ENV_PACKAGE = '''
import os
import gymnasium as gym

# Each process that imports this module says so: zrl's learner and actors must all make this env.
with open(os.environ["ZRL_TEST_IMPORTS"], "a") as f:
    f.write(f"{os.getpid()}\\n")
gym.register("ShortCartPole-v0", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=50)
'''


def _run_on_a_terminal(argv: list[str], env: dict, timeout: float) -> tuple[int, str]:
    """Runs argv with a pseudo-terminal as its stdout and stderr; (exit code, all it wrote)."""
    leader, follower = pty.openpty()
    p = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, start_new_session=True)
    os.close(follower)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            try:
                chunk = os.read(leader, 1 << 16) if ready else b""
            except OSError:  # (EIO: every writer has closed the terminal)
                break
            if ready and not chunk:
                break
            out += chunk
            if not ready and p.poll() is not None:
                break
        return p.wait(timeout=max(1.0, deadline - time.monotonic())), out.decode(errors="replace")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
        os.close(leader)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_env_package_reaches_every_role_and_a_terminal_gets_a_live_status_line(tmp_path, monkeypatch):
    (tmp_path / "short_cartpole.py").write_text(ENV_PACKAGE)
    imports = tmp_path / "imports.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]), "ZRL_TEST_IMPORTS": str(imports)}
    logdir = tmp_path / "run"
    code, out = _run_on_a_terminal([*ZRL, "run", "--env-package", "short_cartpole", "-o", "env.id=ShortCartPole-v0", "--device", "cpu",
                                    "--max-seconds", "4", "-o", "learner.log_interval_s=0.5", "--logdir", str(logdir)], env, 100)
    assert code == 0, out
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["env_steps"] > 0 and summary["stop_reason"] == "time limit"
    assert len(set(imports.read_text().split())) >= 3, "the learner and both actors imported the env package"
    saved = load_config(logdir / "config.yaml")
    assert saved.env.packages == ("short_cartpole",) and saved.learner.device == "cpu"
    assert "target return 475, the config's for CartPole-v1" in out  # env.id overridden
    assert f"{ERASE}[zrl run] " in out and "ETA" in out, "a live status line"
    assert "steps/s  updates" not in out, "the learner's own progress lines give way to it"
    assert "[actor 0] connected" in out and "[learner] done (time limit)" in out, "the children's lines are relayed"

    monkeypatch.syspath_prepend(str(tmp_path))  # `zrl eval` runs here, in this process
    monkeypatch.setenv("ZRL_TEST_IMPORTS", str(imports))
    result = CliRunner().invoke(main, ["eval", "--checkpoint", str(logdir), "--episodes", "2", "--env-package", "short_cartpole"])
    assert result.exit_code == 0 and "over 2 episodes" in result.output, result.output
