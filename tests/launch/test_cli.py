"""The real CLI in subprocesses: Ctrl-C, config errors, eval, bench, and one learning run."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import psutil
import pytest

from helpers import DEFAULT_CONFIG, ROOT, ZRL, Proc, wait_for

SMALL = ["-o", "learner.log_interval_s=0.5", "-o", "learner.checkpoint_interval_s=600"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ctrl_c_stops_everything_and_leaves_no_process(tmp_path):
    run = Proc(["run", "--bind", "tcp://127.0.0.1:*", "--logdir", str(tmp_path), "--max-seconds", "100", "--stop-at-return", "100000", *SMALL])
    try:
        wait_for(lambda: run.output.count("connected to") >= 2, 60, "both actors to connect")
        wait_for(lambda: "updates" in run.output, 60, "a progress line")
        children = psutil.Process(run.p.pid).children(recursive=True)
        assert len(children) == 3  # learner + 2 actors
        os.killpg(run.p.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        code = run.wait(60)
    finally:
        run.kill_tree()
    assert code == 130, run.output
    assert "second signal" not in run.output, "each child is asked to stop once"
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left behind: {alive}"
    assert (tmp_path / "checkpoints").is_dir() and any((tmp_path / "checkpoints").iterdir()), "learner checkpoints on Ctrl-C"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted"
    assert summary["env_steps"] > 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ctrl_c_after_the_output_pipe_closed_still_saves(tmp_path):
    # `zrl run | tee log`, then Ctrl-C: tee stops too, and every later print of zrl run and
    # its children hits a closed pipe. BrokenPipeError used to stop zrl run before it asked
    # the learner to save, and the learner was killed: no checkpoint, no summary, exit 1.
    p = subprocess.Popen([*ZRL, "run", "--logdir", str(tmp_path), "--max-seconds", "100", "--stop-at-return", "100000", *SMALL],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for line in p.stdout:
            if "updates" in line:  # training
                break
        p.stdout.close()  # the reader is gone
        os.killpg(p.pid, signal.SIGINT)
        code = p.wait(60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert code == 130
    assert any((tmp_path / "checkpoints").iterdir()), "the learner saved"
    assert json.loads((tmp_path / "summary.json").read_text())["stop_reason"] == "interrupted"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_second_ctrl_c_kills_a_learner_that_does_not_stop(tmp_path):
    run = Proc(["run", "--logdir", str(tmp_path), "--max-seconds", "100", "--stop-at-return", "100000", *SMALL])
    children = []
    try:
        wait_for(lambda: run.output.count("connected to") >= 2, 60, "both actors to connect")
        tmpdir = re.search(r"listening on ipc://(/\S+)/control", run.output).group(1)
        pids = json.loads((tmp_path / "pids.json").read_text())
        children = [psutil.Process(pid) for pid in pids.values()]
        os.kill(pids["learner"], signal.SIGSTOP)  # a learner that cannot act on the first signal
        os.kill(run.p.pid, signal.SIGINT)
        wait_for(lambda: "stopping: asking the learner" in run.output, 30, "the first signal to be seen")
        os.kill(run.p.pid, signal.SIGINT)
        code = run.wait(60)
    finally:
        run.kill_tree()
        for c in children:  # if zrl run failed to, so that a failure leaves nothing behind
            try:
                c.kill()
            except psutil.NoSuchProcess:
                pass
    assert "second signal: killing the learner and actors now" in run.output, run.output
    assert code != 0
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left behind: {alive}"
    assert not os.path.exists(tmpdir), "zrl run's temporary directory is removed"


def test_a_signal_before_the_learner_starts_stops_the_run(tmp_path, monkeypatch):
    from zrl import launch
    from zrl.config import load_config
    from zrl.launch import processes, supervisor

    started = []
    monkeypatch.setattr(supervisor, "preload", lambda: os.kill(os.getpid(), signal.SIGINT))  # Ctrl-C while importing
    monkeypatch.setattr(processes.Child, "start", lambda self: started.append(self.name))
    opts = launch.RunOptions(num_actors=2, seed=0, logdir=str(tmp_path), fork=True)
    before = signal.getsignal(signal.SIGINT)
    assert launch.run_local(load_config(DEFAULT_CONFIG), opts) == 130
    assert started == []  # nothing started, so nothing would be left waiting for a signal
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.timeout(60)
def test_bad_config_key_is_named_and_fails(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("learner:\n  batchsize: 3\n")
    p = Proc(["run", "--config", str(cfg), "--logdir", str(tmp_path)])
    assert p.wait(30) != 0
    assert "learner.batchsize" in p.output and "bad.yaml" in p.output


@pytest.mark.timeout(60)
def test_bad_command_line_numbers_are_refused(tmp_path):
    for args, why in ((["--actors", "-3"], "--actors"), (["--max-seconds", "nan"], "--max-seconds"),
                      (["--max-seconds", "0"], "--max-seconds"), (["--max-env-steps", "0"], "--max-env-steps"),
                      (["--stop-at-return", "nan"], "--stop-at-return")):
        p = Proc(["run", "--logdir", str(tmp_path), *args])
        assert p.wait(30) == 2 and f"Invalid value for '{why}'" in p.output, p.output
    assert not any(tmp_path.iterdir()), "nothing ran"


@pytest.mark.timeout(60)
def test_a_bad_device_or_server_space_stops_the_run_before_anything_starts(tmp_path):
    serve = str(ROOT / "configs" / "cartpole_serve.yaml")
    for args, why in ((["-o", "learner.device=cuda:x"], "learner.device: must be auto, cpu or cuda[:N]"),
                      (["-o", "server.observation_space={type: box, shape: [0], dtype: float32}"], "server.observation_space: box dim"),
                      (["-o", "server.action_space={type: discreet, n: 2}"], "server.action_space: unknown space type")):
        p = Proc(["run", "--config", serve, "--logdir", str(tmp_path), *args])
        assert p.wait(30) == 2 and why in p.output and "Traceback" not in p.output, (args, p.output)
    assert not any(tmp_path.iterdir()), "nothing ran"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_short_run_then_eval_and_resume(tmp_path):
    run = Proc(["run", "--logdir", str(tmp_path), "--max-env-steps", "30000", "--stop-at-return", "100000", *SMALL])
    assert run.wait(90) == 0, run.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in ("wall_s", "env_steps", "env_steps_per_s", "final_mean_return", "reached"):
        assert key in summary
    assert summary["env_steps"] >= 30000 and summary["reached"] is False
    ev = Proc(["eval", "--checkpoint", str(tmp_path), "--episodes", "4"])
    assert ev.wait(60) == 0, ev.output
    assert "mean return" in ev.output and "over 4 episodes" in ev.output
    assert f"checkpoint {tmp_path / 'checkpoints'}" in ev.output  # which one it played
    again = Proc(["run", "--logdir", str(tmp_path), "--resume", "--max-env-steps", "45000", "--stop-at-return", "100000", *SMALL])
    assert again.wait(90) == 0, again.output
    assert "resumed from" in again.output
    s2 = json.loads((tmp_path / "summary.json").read_text())
    assert s2["env_steps"] >= 45000 and s2["updates"] > summary["updates"]
    assert s2["env_steps_this_run"] == s2["env_steps"] - summary["env_steps"]  # the rate is this run's
    assert s2["env_steps_per_s"] == pytest.approx(s2["env_steps_this_run"] / s2["wall_s"], rel=0.01)


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("override,why", [
    ("env.id=NoSuchEnv-v9", "env.id: cannot make 'NoSuchEnv-v9'"),
    # A model the env's observations cannot feed: it used to be restarted until the time
    # limit, and the run exited 0 having trained nothing.
    ("model.network=impala_shallow", "needs image observations"),
])
def test_an_env_or_model_that_cannot_work_stops_the_run_at_once(tmp_path, override, why):
    run = Proc(["run", "--logdir", str(tmp_path), "--max-seconds", "100", "-o", override])
    assert run.wait(50) == 2, run.output
    assert why in run.output and "Traceback" not in run.output, run.output
    assert "restarting" not in run.output, "an actor whose config cannot work is not restarted"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "cannot run with this config" in summary["stop_reason"] and summary["env_steps"] == 0


@pytest.mark.timeout(60)
def test_bad_endpoints_logdirs_and_names_are_named_without_a_traceback(tmp_path):
    (tmp_path / "file").write_text("")
    for args, why in ((["actor", "--learner", "127.0.0.1:5555"], "expected tcp://HOST:PORT, ipc://PATH or inproc://NAME"),
                      (["learner", "--bind", "tcp://127.0.0.1:99999"], "the port must be 0-65535 or *"),
                      (["serve", "--learner", "tcp://127.0.0.1:*"], "port * can only be bound"),
                      (["run", "--logdir", str(tmp_path / "file" / "run")], "cannot use logdir"),
                      (["learner", "--logdir", str(tmp_path / "file" / "run"), "--bind", "tcp://127.0.0.1:*"], "cannot use logdir"),
                      (["bench", "nosuch"], "is not one of 'kernels', 'client'"),
                      (["bench", "transport", "--seconds", "100"], "--seconds sets the length of a timed run (atari, soak)")):
        p = Proc(args)
        assert p.wait(30) == 2 and why in p.output and "Traceback" not in p.output, (args, p.output)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_kernels_quick_writes_results(tmp_path):
    p = Proc(["bench", "kernels", "--quick", "--out", str(tmp_path)])
    assert p.wait(100) == 0, p.output
    data = json.loads((tmp_path / "kernels.json").read_text())
    assert data["columns"][:3] == ["T", "B", "zrl_us"]
    assert [(r["T"], r["B"]) for r in data["rows"]] == [(20, 32), (80, 32)]
    assert all(r["zrl_us"] > 0 and r["torch_us"] > 0 for r in data["rows"])
    assert (tmp_path / "kernels.md").read_text().startswith("## V-trace")
    # Each row is shown as it is measured, before the table and the files.
    shown = [line for line in p.output.splitlines() if line.startswith("  [kernels] T 20, B 32, zrl_us ")]
    assert len(shown) == 1 and p.output.index(shown[0]) < p.output.index("wrote ")


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_default_config_learns_cartpole(tmp_path):
    """The learning test: the real CLI, default config, 2 actors, a generous bound."""
    before = time.time()
    run = Proc(["run", "--config", str(DEFAULT_CONFIG), "--seed", "1", "--logdir", str(tmp_path), "--stop-at-return", "400", "--max-seconds", "300"])
    assert run.wait(340) == 0, run.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["reached"] is True, summary
    assert summary["final_mean_return"] >= 400
    # Times count from the command's process start, which summary.json gives.
    assert before - 1 <= summary["started_at_unix"] <= time.time() - summary["wall_s"] + 1
    assert 0 < summary["time_to_target_s"] <= summary["wall_s"]
    # The learner's return curve, as `zrl bench learning` reads it: timed from that start.
    from zrl.bench.learning import read_curve

    curve = read_curve(tmp_path, "episode/return", summary["started_at_unix"])
    assert curve and all(0 < t <= summary["wall_s"] + 1 for t, _, _ in curve), curve
    assert [s for _, s, _ in curve] == sorted(s for _, s, _ in curve) and curve[-1][1] <= summary["env_steps"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_apex_config_learns_cartpole_judged_by_its_evaluation_actor(tmp_path):
    """Ape-X DQN through the real CLI: 2 exploring actors + a greedy evaluation actor, a generous bound."""
    run = Proc(["run", "--config", str(ROOT / "configs" / "cartpole_apex.yaml"), "--seed", "1", "--logdir", str(tmp_path),
                "--stop-at-return", "400", "--max-seconds", "240"])
    assert run.wait(280) == 0, run.output[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["reached"] is True, summary
    assert summary["return_source"] == "eval" and summary["final_mean_return"] >= 400
    assert "evaluating greedily" in run.output


class FakeProc:
    def __init__(self, code=None):
        self.returncode, self.signals = code, []

    def poll(self):
        return self.returncode

    def send_signal(self, sig):
        self.signals.append(sig)


def test_a_run_fails_once_every_training_actor_gave_up_whatever_the_eval_actor_does():
    from zrl.launch import processes, supervisor

    actors = [processes.Child(name, [], fork=True) for name in ("actor 0", "actor 1", "eval actor", "agent server")]
    assert supervisor.actors_failed(actors) is None
    actors[0].gave_up = 1
    assert supervisor.actors_failed(actors) is None  # actor 1 still feeds the learner
    actors[1].gave_up = 1
    code, reason = supervisor.actors_failed(actors)  # the eval actor and the server, alive, feed nothing
    assert code == 1 and "restart cap" in reason
    actors[0].gave_up = actors[1].gave_up = None
    actors[2].gave_up = 2  # any actor whose config cannot run stops the run: they share it
    assert supervisor.actors_failed(actors)[0] == 2
    actors[2].gave_up = 3  # or whose hello the learner refused: the others' would be too
    code, reason = supervisor.actors_failed(actors)
    assert code == 3 and "refused" in reason


def test_an_actor_whose_hello_was_refused_is_not_restarted():
    from zrl import launch
    from zrl.launch import processes, supervisor

    opts = launch.RunOptions(num_actors=1, seed=0, logdir="unused")
    for code, restarted in ((1, True), (3, False), (2, False)):
        a = processes.Child("actor 0", [], fork=True)
        a.proc = FakeProc(code=code)
        supervisor.supervise_actor(a, now=0.0, opts=opts)
        assert (a.restart_at is not None) == restarted and a.gave_up == (None if restarted else code)


def test_a_run_with_only_an_agent_server_fails_once_the_server_gave_up():
    from zrl.launch import processes, supervisor

    actors = [processes.Child(name, [], fork=True) for name in ("eval actor", "agent server")]  # run.num_actors 0
    assert supervisor.actors_failed(actors) is None
    actors[0].gave_up = 1
    assert supervisor.actors_failed(actors) is None  # the evaluation actor feeds nothing; the server still does
    actors[1].gave_up = 1
    code, reason = supervisor.actors_failed(actors)  # the only data source is gone
    assert code == 1 and "agent server" in reason and "restart cap" in reason
    with_actors = [processes.Child(name, [], fork=True) for name in ("actor 0", "agent server")]
    with_actors[1].gave_up = 1
    assert supervisor.actors_failed(with_actors) is None  # actor 0 still feeds the learner


def test_an_actor_started_after_a_stop_gets_its_own_sigterm_and_no_actor_gets_two():
    from zrl.launch import processes

    a = processes.Child("actor 0", [], fork=True)
    a.stop()  # never started: nothing to signal
    a.proc = FakeProc(code=1)  # exited; a restart is under way when the stop comes
    a.stop()
    assert a.proc.signals == []
    a.proc = FakeProc()  # the restart lands after the stop
    a.stop()
    a.stop()
    assert a.proc.signals == [signal.SIGTERM]


def test_a_run_out_of_time_with_nothing_trained_fails(tmp_path):
    from zrl import launch
    from zrl.launch import summary

    opts = launch.RunOptions(num_actors=2, seed=0, logdir=str(tmp_path))
    final = tmp_path / "learner_final.json"
    for steps, resumed, crashed, code in ((0, 0, True, 1), (5000, 0, True, 0), (5000, 5000, True, 1),
                                          (0, 0, False, 0)):  # (no crash: a limit shorter than the start-up, no client)
        final.write_text(json.dumps({"env_steps": steps, "resumed_env_steps": resumed, "stop_reason": "time limit"}))
        got = summary.summarise(final, tmp_path, opts, opts.t_start + 10, learner_code=0, actors_crashed=crashed)
        assert got == code, (steps, resumed, crashed)
    final.write_text(json.dumps({"env_steps": 5000, "resumed_env_steps": 5000, "stop_reason": "env step limit"}))
    assert summary.summarise(final, tmp_path, opts, opts.t_start + 10, learner_code=0, actors_crashed=True) == 0  # a resume already done
