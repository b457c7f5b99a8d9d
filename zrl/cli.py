"""The `zrl` command. Commands only parse arguments, build configs and call
library code (zrl.launch, zrl.evaluate, zrl.keys, zrl.bench). Each command
imports its library code when it runs (and zrl.launch's entry points import
torch only then), so `zrl --help` and config errors stay fast; `zrl run`'s
children run this same command line (zrl.launch.processes).
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path

import click

from zrl import __version__
from zrl.bench import ALIASES, BENCHMARKS, BenchUnavailable
from zrl.config import ConfigError, load_config
from zrl.protocol.endpoints import endpoint_problem

T_START = time.time()


# Command-line flags that set a config value: they are overrides of their keys, so the
# config's checks apply to them as to -o (an error names the flag).
FLAG_KEYS = {
    "actors": "run.num_actors",
    "device": "learner.device",
    "seed": "run.seed",
    "stop_at_return": "run.stop_at_return",
    "max_seconds": "run.max_seconds",
    "max_env_steps": "run.max_env_steps",
    "env_package": "env.packages",
}


def _flag_overrides(flags: dict) -> dict[str, str]:
    """{flag name: the override it stands for} for the flags given (not None)."""
    return {name: f"{FLAG_KEYS[name]}={value!r}" for name, value in flags.items() if value is not None}


def _load(config_path, overrides, **flags):
    """The config with the -o overrides, then the given flags (None: not given) on top."""
    given = _flag_overrides(flags)
    try:
        return load_config(config_path, [*overrides, *given.values()])
    except ConfigError as e:
        for name, item in given.items():
            prefix = f"override {item!r}: "
            if str(e).startswith(prefix):
                raise click.BadParameter(str(e)[len(prefix):], param_hint=f"'--{name.replace('_', '-')}'") from None
        raise ConfigProblem(str(e)) from None


class ConfigProblem(click.ClickException):
    """A bad config or override: exit code 2, as for any other usage error (zrl run does not
    restart an actor that exits with it)."""

    exit_code = 2


def _endpoint(binding: bool):
    """A click callback that refuses a malformed endpoint (libzmq would only say "Invalid argument")."""

    def check(ctx, param, value):
        problem = value is not None and endpoint_problem(value, binding=binding)
        if problem:
            raise click.BadParameter(problem)
        return value

    return check


def _install_stop_handlers(on_stop) -> None:
    """First SIGINT/SIGTERM asks for a clean stop; a second one exits at once."""
    count = {"n": 0}

    def handler(signum, frame):
        count["n"] += 1
        if count["n"] > 1:
            print("\n[zrl] second signal: exiting now", file=sys.stderr, flush=True)
            sys.exit(130)
        on_stop()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _sigterm_as_interrupt() -> None:
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does: a benchmark stopped either way runs
    its cleanup (the runs it started stopped, its temporary files removed)."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def stop_options(f):
    """--stop-at-return, --max-seconds, --max-env-steps (run.* settings; see FLAG_KEYS)."""
    f = click.option("--max-env-steps", type=int, default=None, help="Stop after this many env steps (run.max_env_steps).")(f)
    f = click.option("--max-seconds", type=float, default=None, help="Stop after this many seconds (run.max_seconds).")(f)
    return click.option("--stop-at-return", type=float, default=None,
                        help="Stop once the mean return of the last run.return_window episodes reaches this (run.stop_at_return).")(f)


config_option = click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None, metavar="FILE|NAME",
                             help="A YAML config file, or the name of a shipped one (pong_impala, with or without .yaml; "
                                  "a wrong name lists them) [default: cartpole_impala].")


def _env_packages(ctx, param, value):
    """--env-package a --env-package b -> ["a", "b"]; None when not given (the config's env.packages stand)."""
    return list(value) or None


env_package_option = click.option("--env-package", "env_package", multiple=True, callback=_env_packages, metavar="MODULE",
                                  help="Import MODULE before making any env, in every process: one that registers your own "
                                       "Gymnasium envs (sets env.packages; repeatable; docs/ENVS.md).")
override_option = click.option("-o", "--override", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config value (repeatable).")
logdir_option = click.option("--logdir", type=click.Path(file_okay=False), default=None,
                             help="The run's directory; an earlier run there moves to LOGDIR/previous-<UTC time>/ "
                                  "(default: a new run.logdir/<UTC time>/, run.logdir being runs/<config name> unless set).")
resume_option = click.option("--resume", is_flag=True,
                             help="Continue the run in LOGDIR (default: the newest under run.logdir) from its newest checkpoint, "
                                  "with the config it saved (LOGDIR/config.yaml) and this command's -o and flags on top.")


def _open_run(command: str, config_path, overrides, flags: dict, logdir, resume: bool, check=None):
    """(config, run directory) of `zrl run` or `zrl learner` (zrl.launch.rundir): a fresh run's
    config is the command line's, its directory --logdir or a new one under run.logdir; a
    resumed run's directory is --logdir or the newest under run.logdir, its config the one
    saved there with this command line's overrides on top. `check(config)` runs before any
    directory is made."""
    from zrl.launch import rundir  # lazy: zrl.launch's process machinery would slow every command's start-up

    def load(path):
        cfg = _load(path, overrides, **flags)
        if check is not None:
            check(cfg)
        return cfg

    try:
        if resume:
            where = Path(logdir) if logdir else rundir.newest_run(rundir.runs_root(load(config_path), config_path))
            return rundir.resume_config(where, config_path, load, lambda text: click.echo(f"[{command}] {text}")), where
        cfg = load(config_path)
        return cfg, Path(logdir) if logdir else rundir.new_run_dir(rundir.runs_root(cfg, config_path))
    except rundir.RunDirError as e:
        raise ConfigProblem(str(e)) from None


def _something_feeds_the_learner(cfg) -> None:
    from zrl.launch.options import check_something_feeds_the_learner  # lazy: zrl.launch's package imports its process machinery

    try:
        check_something_feeds_the_learner(cfg)
    except ConfigError as e:
        raise ConfigProblem(str(e)) from None


class _PipeSafe:
    """sys.stdout / sys.stderr of zrl's commands. Once the reader of a pipe has gone (`zrl run
    | tee log`: a Ctrl-C stops tee too), a print would raise BrokenPipeError in the middle of a
    checkpoint or a shutdown; from then on the output goes to /dev/null instead."""

    def __init__(self, stream):
        self._stream = stream

    def _gone(self) -> None:
        try:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, self._stream.fileno())
            os.close(fd)
        except (OSError, ValueError):
            pass

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()
            try:
                self._stream.flush()  # what was buffered goes to /dev/null
            except OSError:
                pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="zrl", message="%(prog)s %(version)s", help="Print zrl's version and exit.")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """zrl: distributed reinforcement learning over ZeroMQ."""
    for name in ("stdout", "stderr"):  # (before logging, which keeps sys.stderr)
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _PipeSafe):
            setattr(sys, name, _PipeSafe(stream))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="%(asctime)s %(name)s %(levelname)s: %(message)s")


@main.command()
@config_option
@override_option
@click.option("--bind", default="tcp://127.0.0.1:5555", show_default=True, callback=_endpoint(True), help="Control endpoint (ROUTER) that actors say hello to; port may be *.")
@logdir_option
@resume_option
@click.option("--device", default=None, help="auto, cpu or cuda[:N] (default: learner.device).")
@click.option("--seed", type=int, default=None, help="Seed for the model's initialisation (default: run.seed).")
@stop_options
@click.option("--ready-file", type=click.Path(dir_okay=False), default=None, help="Write the bound endpoints here as JSON once listening.")
@click.option("--logdir-ready", is_flag=True, hidden=True, help="(zrl run's learner) LOGDIR is readied and holds the config given.")
@click.option("--world-size", type=click.IntRange(min=1), default=None,
              help="Learners in the group (learner.num_learners; for a Slurm job's learners).")
@click.option("--rank", type=click.IntRange(min=0), default=0, show_default=True,
              help="With learner.num_learners > 1: this learner's place in the group (0 checkpoints and writes the summary).")
@click.option("--dist-url", default=None, help="With learner.num_learners > 1: where the group meets (torch.distributed's "
              "init_method: file:///shared/path or tcp://HOST:PORT; trusted networks only).")
@env_package_option
def learner(config_path, overrides, bind, logdir, resume, device, seed, stop_at_return, max_seconds, max_env_steps, ready_file, logdir_ready,
            world_size, rank, dist_url, env_package):
    """Train: receive trajectories, publish weights, checkpoint."""
    if world_size is not None:
        overrides = (*overrides, f"learner.num_learners={world_size}")
    flags = dict(device=device, seed=seed, stop_at_return=stop_at_return, max_seconds=max_seconds, max_env_steps=max_env_steps,
                 env_package=env_package)
    if logdir_ready and not logdir:
        raise click.UsageError("--logdir-ready needs --logdir")
    if logdir_ready:  # zrl run readied LOGDIR and saved the config there
        cfg = _load(config_path, overrides, **flags)
    else:
        cfg, logdir = _open_run("learner", config_path, overrides, flags, logdir, resume)
    from zrl.launch import run_learner  # lazy: zrl.launch's process machinery would slow every command's start-up

    sys.exit(run_learner(cfg, bind, str(logdir), resume=resume, ready_file=ready_file, install_signals=_install_stop_handlers,
                         own_logdir=not logdir_ready, rank=rank, dist_url=dist_url))


@main.command()
@config_option
@override_option
@click.option("--learner", "learner_endpoint", default="tcp://127.0.0.1:5555", show_default=True, callback=_endpoint(False), help="The learner's control endpoint.")
@click.option("--index", type=click.IntRange(min=0), default=0, show_default=True, help="This actor's index (its sender id).")
@click.option("--num-actors", type=click.IntRange(min=1), default=1, show_default=True, help="How many actors there are in all.")
@click.option("--seed", type=int, default=None, help="Base seed (default: run.seed).")
@click.option("--eval", "eval_mode", is_flag=True, help="Evaluation actor: act greedily, send only episode returns (run.eval_num_envs envs).")
@env_package_option
def actor(config_path, overrides, learner_endpoint, index, num_actors, seed, eval_mode, env_package):
    """Step environments and stream trajectories to a learner."""
    cfg = _load(config_path, overrides, env_package=env_package)
    if index >= num_actors:
        raise click.BadParameter(f"--index {index} must be in [0, --num-actors {num_actors})")
    from zrl.launch import run_actor  # lazy: zrl.launch's process machinery would slow every command's start-up

    sys.exit(run_actor(cfg, learner_endpoint, index, num_actors, seed, install_signals=_install_stop_handlers, eval_mode=eval_mode))


@main.command()
@config_option
@override_option
@click.option("--actors", type=int, default=None, help="Actor processes (run.num_actors).")
@click.option("--seed", type=int, default=None, help="Base seed (default: run.seed).")
@logdir_option
@click.option("--bind", default=None, callback=_endpoint(True), help="Learner control endpoint (default: an ipc:// socket in a private temp dir).")
@stop_options
@resume_option
@click.option("--device", default=None, help="The learner's device: auto, cpu or cuda[:N] (learner.device).")
@env_package_option
@click.option("--no-live", "no_live", is_flag=True, help="No live status line on a terminal; the children's lines print as they come.")
def run(config_path, overrides, actors, seed, logdir, bind, stop_at_return, max_seconds, max_env_steps, resume, device, env_package, no_live):
    """Start a learner and N actors on this machine; stop them all on exit. On a terminal, a
    live status line shows the learner's progress (env steps, steps/s, return, ETA), unless --no-live."""
    flags = dict(actors=actors, seed=seed, stop_at_return=stop_at_return, max_seconds=max_seconds, max_env_steps=max_env_steps,
                 device=device, env_package=env_package)
    cfg, logdir = _open_run("zrl run", config_path, overrides, flags, logdir, resume, check=_something_feeds_the_learner)
    from zrl.launch import RunOptions, run_local  # lazy: zrl.launch's process machinery would slow every command's start-up

    opts = RunOptions(
        num_actors=cfg.run.num_actors,
        seed=cfg.run.seed,
        logdir=str(logdir),
        bind=bind,
        stop_at_return=cfg.run.stop_at_return,
        max_seconds=cfg.run.max_seconds,
        max_env_steps=cfg.run.max_env_steps,
        resume=resume,
        t_start=_process_start_time(),
        live=not no_live,
    )
    sys.exit(run_local(cfg, opts))


@main.command()
@config_option
@override_option
@click.option("--bind", default=None, callback=_endpoint(True), help="Endpoint clients connect to (default: server.bind).")
@click.option("--learner", "learner_endpoint", default=None, callback=_endpoint(False), help="The learner's control endpoint; without it the server only serves the policy (inference only).")
@click.option("--checkpoint", "checkpoint_path", default=None, type=click.Path(exists=True), help="Serve this checkpoint's weights (a file or a logdir).")
@click.option("--seed", type=int, default=None, help="Seed for sampling actions (default: run.seed).")
@click.option("--logdir", type=click.Path(file_okay=False), default=None,
              help="Write the server's counters (rejections, dropped sessions) as TensorBoard scalars here "
                   "(default: none; the status line shows them either way).")
@env_package_option
def serve(config_path, overrides, bind, learner_endpoint, checkpoint_path, seed, logdir, env_package):
    """Agent server: batched inference for simulators that embed a zrl client."""
    cfg = _load(config_path, overrides, env_package=env_package)
    from zrl.launch import run_server  # lazy: zrl.launch's process machinery would slow every command's start-up

    sys.exit(run_server(cfg, bind, learner_endpoint, checkpoint_path=checkpoint_path, seed=seed, logdir=logdir,
                        install_signals=_install_stop_handlers))


@main.group()
def keys():
    """CURVE key pairs for `security` (see docs/DEPLOY.md)."""


@keys.command("generate")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--clients", default=1, show_default=True, help="Simulator-client key pairs to make (client, client2, ...), authorised in DIRECTORY/clients/.")
@click.option("--actors", default=None, type=click.IntRange(min=0), help="Actor key pairs to make (actor, actor2, ...), authorised in "
              "DIRECTORY/actors/ [default: as many as --clients].")
def keys_generate(directory, clients, actors):
    """Make a server key pair, actor and simulator-client key pairs in DIRECTORY, and the
    allow-list of each role (actors/ for the learner, clients/ for the agent server)."""
    from zrl.keys import generate_keys  # lazy: imports zmq

    for line in generate_keys(directory, clients, actors):
        click.echo(line)


@main.command(name="eval")
@click.option("--checkpoint", "checkpoint_path", required=True, type=click.Path(exists=True), help="A checkpoint file or a logdir (its newest checkpoint; with --best, its best).")
@click.option("--episodes", type=click.IntRange(min=1), default=10, show_default=True, help="Episodes to play; the mean return is over them.")
@click.option("--sample", is_flag=True, help="Sample actions from the policy instead of acting greedily.")
@click.option("--seed", type=int, default=12345, show_default=True, help="The envs' seed (env k resets with SEED + k).")
@click.option("--num-envs", type=click.IntRange(min=1), default=8, show_default=True,
              help="Envs played side by side (at most --episodes).")
@click.option("--best", is_flag=True, help="With a logdir: its best checkpoint (checkpoints/best.pt, the highest mean return when saved) instead of the newest.")
@click.option("--video", "video_dir", type=click.Path(file_okay=False), default=None,
              help='Write an .mp4 of each episode to this directory (one env plays them in turn; needs pip install "zrl[video]").')
@env_package_option
def eval_cmd(checkpoint_path, episodes, sample, seed, num_envs, best, video_dir, env_package):
    """Run a checkpoint's policy and print its mean return."""
    from zrl.envs.make import import_env_packages  # lazy: imports gymnasium
    from zrl.evaluate import evaluate_checkpoint  # lazy: imports torch

    try:
        import_env_packages(env_package or ())  # (the checkpoint's own env.packages are imported as its envs are made)
        result = evaluate_checkpoint(checkpoint_path, episodes=episodes, greedy=not sample, seed=seed, num_envs=num_envs,
                                     best=best, video_dir=video_dir)
    except (ValueError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"checkpoint {result['checkpoint']}")
    click.echo(f"mean return {result['mean_return']:.2f} over {result['episodes']} episodes (min {result['min_return']:.1f}, max {result['max_return']:.1f}, {'sampled' if sample else 'greedy'})")
    if video_dir is not None:
        click.echo(f"{len(result['videos'])} videos in {video_dir}")


@main.command(name="export")
@click.argument("source", type=click.Path(exists=True), metavar="LOGDIR_OR_CHECKPOINT")
@click.option("--format", "fmt", type=click.Choice(["torchscript", "onnx"]), default=None,
              help="The file's format (default: from --out's suffix: .onnx, or .pt / .ts for TorchScript). "
                   'onnx needs pip install "zrl[export]".')
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The file to write.")
def export_cmd(source, fmt, out):
    """Write a checkpoint's deterministic policy (a run's newest, or a .pt file) as a TorchScript
    or ONNX file that runs without zrl: obs [B, *obs] -> action, normalisation and rescaling
    included, the spaces in its metadata (docs/API.md)."""
    from zrl.export import ExportError, export_policy  # lazy: imports torch

    try:
        exported = export_policy(source, fmt, out)
    except (ExportError, ValueError, RuntimeError, OSError) as e:
        raise click.ClickException(str(e)) from None
    for line in exported.summary():
        click.echo(line)


@main.command()
@click.argument("logdirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False), metavar="LOGDIR...")
@click.option("--out", type=click.Path(dir_okay=False), default="returns.png", show_default=True,
              help="The image to write (its suffix picks the format: .png, .svg, .pdf).")
def plot(logdirs, out):
    """Plot the return of one run or several side by side (one line per LOGDIR), against env
    steps and against wall time, from their TensorBoard events. Needs pip install "zrl[plot]"."""
    from zrl.plot import PlotError, plot_returns  # lazy: imports tensorboard and matplotlib

    try:
        notes = plot_returns([Path(d) for d in logdirs], Path(out))
    except PlotError as e:
        raise click.ClickException(str(e)) from None
    for note in notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"wrote {out}")


# The tasks of `zrl bench learning --task` (zrl.bench.learning.TASKS, the first its default), named
# here so that `zrl --help` imports no benchmark; tests/bench/test_bench_learning.py holds them equal.
LEARNING_TASKS = ("cartpole", "pendulum", "lunarlander", "acrobot", "halfcheetah")


def _seed_list(ctx, param, value):
    """--seeds 1,2,3 -> (1, 2, 3)."""
    if value is None:
        return None
    try:
        seeds = tuple(int(s) for s in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated integers, e.g. 1,2,3") from None
    if len(set(seeds)) != len(seeds):
        raise click.BadParameter(f"{value!r}: a seed given twice")
    return seeds


# The games of `zrl bench atari --game` (zrl.bench.atari.GAMES, the first its default), named here
# for the same reason; tests/bench/test_bench_atari.py holds them equal.
ATARI_GAMES = ("pong", "breakout")


@main.command(help=f"Run benchmark NAME ({', '.join(BENCHMARKS)}) or all of them, side by side with their references; "
                   "`pong` is `atari --game pong`. bench/README.md says what each measures.")
@click.argument("name", type=click.Choice([*BENCHMARKS, *ALIASES, "all"]), metavar="NAME")
@click.option("--out", type=click.Path(file_okay=False), default="bench/out", show_default=True, help="Where JSON and Markdown results go.")
@click.option("--quick", is_flag=True, help="Small sizes and few repeats (a smoke test, not a measurement).")
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed repeats of each measurement (figures are their median).")
@click.option("--seconds", type=click.FloatRange(min=10), default=None,
              help="Length of each timed run of atari and soak (default 3600 and 600; --quick: 90 and 40).")
@click.option("--task", type=click.Choice(LEARNING_TASKS), default=None,
              help=f"learning only: the env and configs to measure (default {LEARNING_TASKS[0]}); each writes "
                   "learning_TASK.json (cartpole: learning.json).")
@click.option("--game", type=click.Choice(ATARI_GAMES), default=None,
              help=f"atari only: the game (default {ATARI_GAMES[0]}); writes atari_GAME.json, .md and .png.")
@click.option("--reference", type=click.Choice(["sb3", "none"]), default=None,
              help="atari only: sb3 also runs SB3 PPO with rl-zoo's Atari settings for the same wall time (default none).")
@click.option("--seeds", default=None, callback=_seed_list, metavar="S[,S...]",
              help="learning and atari only: the seeds (default: the task's own, atari's 1,2; --quick: the first).")
@click.option("--configs", default=None, metavar="NAME[,NAME...]", callback=lambda ctx, param, v: tuple(v.split(",")) if v else None,
              help="atari only: which of the game's shipped configs run (default: all, e.g. pong_impala,pong_apex).")
def bench(name, out, quick, repeats, seconds, task, game, reference, seeds, configs):
    from zrl.bench.runner import check_seconds, run_benchmarks  # lazy: the harness (subprocess, statistics) would slow every command's start-up

    name, implied = ALIASES.get(name, (name, {}))
    game = game or implied.get("game")
    try:
        check_seconds(name, seconds)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if name != "learning" and task is not None:
        raise click.UsageError(f"--task chooses what the learning benchmark runs; {name} has none")
    if name != "atari" and (game is not None or reference is not None or configs is not None):
        raise click.UsageError(f"--game, --reference and --configs choose what the atari benchmark runs; {name} has none of them")
    if name not in ("learning", "atari") and seeds is not None:
        raise click.UsageError(f"--seeds chooses the learning and atari benchmarks' seeds; {name} has none")
    _sigterm_as_interrupt()
    with contextlib.ExitStack() as selected:
        try:
            selected.enter_context(_bench_selection(name, task, game, reference, seeds, configs))
        except ValueError as e:  # (a --configs that is not one of the game's)
            raise click.UsageError(str(e)) from None
        try:
            run_benchmarks(name, out, quick=quick, repeats=repeats, seconds=seconds)
        except BenchUnavailable as e:
            raise click.ClickException(str(e)) from None


def _bench_selection(name: str, task, game, reference, seeds, configs=None):
    """What the learning or atari benchmark measures within it (its `chosen`)."""
    if name == "learning":
        from zrl.bench.learning import chosen  # lazy: imports tensorboard

        return chosen(task or LEARNING_TASKS[0], seeds)
    if name == "atari":
        from zrl.bench.atari import chosen as chosen_game  # lazy: imports tensorboard

        return chosen_game(game or ATARI_GAMES[0], seeds, reference or "none", configs)
    return contextlib.nullcontext()


def _process_start_time() -> float:
    """When this process started, so wall times include interpreter start-up.

    A process exec'd by a longer-lived one (`exec zrl run` in a script) keeps
    that one's creation time; then the clock read when this module was
    imported (a few tens of milliseconds after the interpreter started) is used.
    """
    try:
        import psutil  # lazy: only zrl run reads its start time, and psutil slows every command's start-up

        created = psutil.Process().create_time()
    except Exception:
        return T_START
    return created if T_START - created < 5.0 else T_START


if __name__ == "__main__":
    main()
