"""The learner process: it wires its parts and runs the training loop.

  LearnerSockets (sockets.py)  control ROUTER, trajectory PULL, weights PUB
  Receiver (receiver.py)       a thread: hellos (Handshake), chunks and stats through the gate
  batches.py                   the algorithm's batch source: a queue of chunks, or a replay
  WeightPublisher              weights after updates, the heartbeat, SHUTDOWN
  Progress, Report             counters under one lock; console line and TensorBoard
  resume.py                    checkpoints written and resumed

The training thread (the caller of `run`) takes batches, lets the algorithm
update, publishes weights every `learner.publish_interval` updates, writes
checkpoints and logs, and decides when to stop. The model is built for the
specs of the config (`zrl.envs.specs`: the server's specs, or env.id's, read
from one env made and closed), which a resumed checkpoint must match: no
peer's hello decides the model.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from pathlib import Path

import torch
import zmq

from zrl import algorithms, spaces, wire
from zrl.algorithms.base import resolve_precision
from zrl.config import Config
from zrl.envs.specs import config_specs
from zrl.learner.sources import make_source, source_class
from zrl.learner.device import check_training_fits, resolve_device
from zrl.learner.connection_watch import ConnectionWatch
from zrl.learner.group import LearnerGroup
from zrl.learner.handshake import Handshake
from zrl.learner.progress import Progress, StatsSum
from zrl.learner.publisher import WeightPublisher, publishable
from zrl.learner.receiver import DATA_KINDS, Receiver
from zrl.learner.report import Report
from zrl.learner.result import LearnerResult, RunPerf
from zrl.learner.resume import Checkpoints, check_specs, find_resume, restore
from zrl.learner.sockets import LearnerSockets
from zrl.metrics import MetricsWriter, Rate

log = logging.getLogger("zrl.learner")


class Learner:
    def __init__(self, config: Config, bind: str, logdir: str | Path | None = None, *, resume: bool = False,
                 ctx: zmq.Context | None = None, console: bool = True, stop_at_return: float | None = None,
                 max_seconds: float | None = None, max_env_steps: int | None = None, sink: bool = False,
                 group: LearnerGroup | None = None):
        # A member of a group (zrl.learner.group) is a learner of its share of the batch; only
        # the first writes (checkpoints, TensorBoard, the summary).
        self.group = group
        self.writes = group is None or group.is_main
        self.group_env_steps = 0  # the group's, as of the last update
        if group is not None:
            config = share_of(config, group.world_size)
        self.config = config
        # Sink mode (benchmarks): answer hellos and count what arrives, but train on nothing,
        # so actors run as fast as they can produce and send.
        self.sink = sink
        self.logdir = Path(logdir) if logdir is not None else None
        self.ckdir = self.logdir / "checkpoints" if self.logdir is not None else None
        self._make_logdir()
        self.console = console
        self.max_seconds = max_seconds if max_seconds is not None else config.run.max_seconds
        self.max_env_steps = max_env_steps if max_env_steps is not None else config.run.max_env_steps
        self.device = resolve_device(config.learner.device)
        self.algo_cls = algorithms.get(config.algo.name)
        target = stop_at_return if stop_at_return is not None else config.run.stop_at_return
        # In a group the first learner's actors' returns decide (the weights are the same everywhere).
        self.progress = Progress(config, target if self.writes else None)
        self.perf = RunPerf()
        self._stop = threading.Event()
        self.algo = None
        self.source = None
        self.specs: tuple[spaces.Spec, spaces.Spec] | None = None
        self.train_seconds_before = 0.0  # from a resumed checkpoint
        self.resumed_env_steps = 0
        # Told to actors in hello replies: one that sees another one (this process restarted
        # on the same endpoints) says hello again, as a new learner needs before it takes data.
        self.instance = os.urandom(8).hex()
        self._resume = find_resume(config, self.ckdir, self._say) if resume else None
        self.checkpoints = Checkpoints(config, self.ckdir if self.writes else None, self._resume is not None, self._say)
        self.sockets = LearnerSockets(config, bind, ctx)
        s = self.sockets
        self.control_endpoint, self.trajectory_endpoint, self.weights_endpoint = s.control_endpoint, s.trajectory_endpoint, s.weights_endpoint
        self.publisher = WeightPublisher(s.pub, max(0.5, config.actor.learner_timeout_s / 3))
        # The receiver's checks of trajectory and stats frames (a C++ fast path for layouts seen
        # before); _build gives it the trajectory schema.
        self.gate = wire.Gate(config.learner.max_message_bytes, DATA_KINDS)
        try:
            self._build(*self._specs())
        except BaseException:  # (an env that cannot be made, a checkpoint that does not fit): unbind, then raise
            s.close()
            raise
        handshake = Handshake(config, self.progress, self.instance,
                              {"trajectory": self.trajectory_endpoint, "weights": self.weights_endpoint},
                              self.specs, lambda: self.publisher.latest_frame)
        self.watch = ConnectionWatch({"control": s.control, "trajectory": s.pull, "weights": s.pub}, curve=s.curve is not None)
        self.receiver = Receiver(s.control, s.pull, self.gate, handshake, self.progress, self._stop, config.learner.max_message_bytes, self.watch)
        self.receiver.algo, self.receiver.source = self.algo, self.source

    def _make_logdir(self) -> None:
        if self.logdir is not None:
            try:
                self.logdir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise OSError(f"cannot use logdir {self.logdir}: {e.strerror or e}") from None

    # Counters that callers and tests read.
    env_steps = property(lambda self: self.progress.env_steps)
    updates = property(lambda self: self.progress.updates)
    episodes = property(lambda self: self.progress.episodes)
    rejected = property(lambda self: self.progress.rejected)
    senders = property(lambda self: self.progress.senders)
    model = property(lambda self: self.algo.model if self.algo is not None else None)
    optimizer = property(lambda self: self.algo.optimizer if self.algo is not None else None)
    queue = property(lambda self: self.source.queue if self.source is not None and self.source.queued else None)
    returns = property(lambda self: self.progress.returns)
    eval_returns = property(lambda self: self.progress.eval_returns)
    custom = property(lambda self: self.progress.custom)
    run_lag_n = property(lambda self: self.progress.run_lag.n)
    obs_spec = property(lambda self: self.specs[0] if self.specs is not None else None)
    action_spec = property(lambda self: self.specs[1] if self.specs is not None else None)

    def _specs(self) -> tuple[spaces.Spec, spaces.Spec]:
        """The config's specs; a resumed checkpoint must have been trained for them."""
        specs = config_specs(self.config)
        if self._resume is not None:
            check_specs(self._resume, specs, self.config)
        return specs

    def _build(self, obs_spec: spaces.Spec, action_spec: spaces.Spec) -> None:
        """Builds the algorithm's learner state for the config's specs (once)."""
        torch.manual_seed(self.config.run.seed)
        algo = self.algo_cls(self.config, obs_spec, action_spec)
        check_training_fits(algo, self.device)
        algo.setup(self.device, self.progress.env_steps)
        if self._resume is not None:
            self.train_seconds_before = restore(self._resume, algo, self.progress, self._say)
            self.resumed_env_steps = self.progress.env_steps
        source = None if self.sink else make_source(algo, self.device, self.progress, self.config, self._stop)
        # A source that joins chunks checks the schema's at_join fields as it copies them (a
        # sink trains on nothing, and is measured as the learner it stands for).
        leave_to_join = source_class(algo.batch_source).collates and algo.joins_schema_checks()
        self.gate.set_trajectory_schema(algo.trajectory_schema(self.config.learner.batch_size), leave_to_join=leave_to_join)
        self.gate.set_gradient_schema(algo.gradient_schema())  # (None: the algorithm's actors send no gradients)
        if self.group is not None:  # (the same weights everywhere, however each was made)
            with torch.no_grad():
                self.group.broadcast(algo.flat)
            algo.gradient_reduce = self.group.average_gradients
        self.flat = algo.flat  # publishing reads this buffer
        self.publisher.attach(self.flat, self.progress.updates)
        self.algo, self.source = algo, source
        self.specs = (obs_spec, action_spec)
        self._say(f"model built for obs {obs_spec.to_json()} and actions {action_spec.to_json()}")

    def _say(self, text: str) -> None:
        if self.console:
            name = "learner" if self.group is None or self.group.is_main else f"learner {self.group.rank}"
            print(f"[{name}] {text}", flush=True)
        log.info(text)

    def request_stop(self) -> None:
        self._stop.set()

    def mean_return(self) -> float | None:
        return self.progress.mean_return()

    def save_checkpoint(self, elapsed: float) -> Path | None:
        return self.checkpoints.save(self.algo, self.progress, self.specs, self.train_seconds_before + elapsed)

    def run(self) -> LearnerResult:
        """Trains until a stop condition; returns what happened. Call `close()` afterwards."""
        self.receiver.start()
        t_start = time.perf_counter()
        self._say(f"listening on {self.control_endpoint} (trajectories {self.trajectory_endpoint}, weights {self.weights_endpoint}); "
                  f"device {self.device}, {resolve_precision(self.config.learner.precision, self.device)}")
        # (The other learners of a group write nothing, and print their progress lines only to a log.)
        metrics = MetricsWriter(self.logdir if self.writes else None, console=self.console and self.writes)
        try:
            if self.config.learner.torch_threads != torch.get_num_threads():
                torch.set_num_threads(self.config.learner.torch_threads)

            def time_up() -> bool:
                return self.max_seconds is not None and time.perf_counter() - t_start >= self.max_seconds

            stop_reason = self._sink_until_stopped(time_up) if self.sink else self._train(metrics, t_start, time_up)
            # Stop receiving first, so the counters in the final checkpoint and the result agree.
            self._stop.set()
            self.receiver.join(timeout=5)
            return self._finish(t_start, stop_reason)
        finally:
            metrics.close()

    def _stop_reason(self) -> str:
        return "interrupted" if self.receiver.error is None else f"receiver failed: {self.receiver.error}"

    def _sink_until_stopped(self, time_up) -> str:
        while not self._stop.wait(0.05):
            if time_up():
                return "time limit"
            self.publisher.heartbeat()
        return "interrupted"

    def _out_of_budget(self, time_up) -> str | None:
        if self._stop.is_set():
            return self._stop_reason()
        if time_up():
            return "time limit"
        env_steps = self.group_env_steps if self.group is not None else self.progress.env_steps
        if self.max_env_steps is not None and env_steps >= self.max_env_steps:
            return "env step limit"
        if self.progress.target_reached():
            return "target reached"
        return None

    def _train(self, metrics: MetricsWriter, t_start: float, time_up) -> str:
        self.source.start_prefetch(self.config.learner.prefetch_for(self.device) if self.source.queued else 0)
        try:
            return self._train_loop(TrainingLog(self, metrics, t_start), time_up)
        finally:
            self.source.close()

    def _train_loop(self, tlog: "TrainingLog", time_up) -> str:
        lc = self.config.learner
        algo, progress, perf, source = self.algo, self.progress, self.perf, self.source
        algo.model.train()
        last_ckpt = time.perf_counter()

        def stop_check() -> bool:
            return self._stop.is_set() or time_up() or (self.max_env_steps is not None and progress.env_steps >= self.max_env_steps)

        while True:
            reason = self._out_of_budget(time_up)
            t_wait = time.perf_counter()
            if self.group is not None:
                got, reason = self._group_batch(reason, stop_check, tlog.idle, time_up)
            elif reason is None:
                got = source.next(stop_check, tlog.idle)
            if reason is not None:
                return tlog.last(reason)
            if got is None:
                tlog.wait_s += perf.waited(t_wait)
                continue
            batch, versions = got
            t_got = time.perf_counter()
            tlog.wait_s += t_got - t_wait
            perf.got_batch(t_wait, t_got, progress.env_steps)
            stats = algo.update(batch, self.group_env_steps if self.group is not None else progress.env_steps)
            progress.updated(versions)
            n = _batch_samples(batch)
            tlog.samples += n
            perf.samples += n
            perf.train_s += time.perf_counter() - t_got
            self.publisher.after_update(progress.updates, lc.publish_interval)
            tlog.stats.add(stats)
            now = time.perf_counter()
            tlog.maybe_log(now)
            if self.ckdir is not None and now - last_ckpt >= lc.checkpoint_interval_s:
                self.save_checkpoint(now - tlog.t_start)
                last_ckpt = now

    def _group_batch(self, reason: str | None, stop_check, idle, time_up) -> tuple[tuple | None, str | None]:
        """A member's next batch, once every member has one (each waits for its own, then all
        agree): (batch, None), or (None, why) once any member stops."""
        got = None
        while reason is None and got is None:
            got = self.source.next(stop_check, idle)
            if got is None:
                reason = self._out_of_budget(time_up)
        stop, self.group_env_steps = self.group.agree(reason is not None, self.progress.env_steps)
        if stop:
            return None, reason or "another learner of the group stopped"
        return got, None

    def _finish(self, t_start: float, stop_reason: str) -> LearnerResult:
        elapsed = time.perf_counter() - t_start
        if self.algo is not None and self.ckdir is not None:
            path = self.save_checkpoint(elapsed)
            if path is not None:
                self._say(f"checkpoint {path}")
        p = self.progress
        reached = p.target_reached()
        mean = p.reached_mean if reached else p.mean_return()
        env_steps, episodes = p.env_steps, p.episodes
        if self.group is not None:  # (every member's data; each member runs this once)
            env_steps, episodes = self.group.total(env_steps), self.group.total(episodes)
        result = LearnerResult(
            env_steps=env_steps, updates=p.updates, episodes=episodes, train_seconds=elapsed,
            final_mean_return=mean, reached=reached, stop_reason=stop_reason, return_source=p.return_source,
            perf=self.perf.as_dict(p.env_steps, p.run_lag),
            reached_after_s=p.reached_at - t_start if p.reached_at is not None else None,
            reached_at_unix=p.reached_unix, resumed_env_steps=self.resumed_env_steps,
        )
        if self.logdir is not None and self.writes:
            self.logdir.mkdir(parents=True, exist_ok=True)
            tmp = self.logdir / ".learner_final.json.tmp"
            tmp.write_text(json.dumps(result.to_json(), indent=2) + "\n")
            os.replace(tmp, self.logdir / "learner_final.json")
        mean_s = f"{mean:.1f}" if mean is not None else "-"
        self._say(f"done ({stop_reason}): {env_steps:,} env steps, {p.updates:,} updates, mean return {mean_s}, {elapsed:.1f}s")
        return result

    def close(self) -> None:
        """Tells actors training is over, stops the receiver, closes sockets."""
        self._stop.set()
        self.publisher.shutdown()
        self.receiver.join(timeout=5)
        self.watch.close()
        self.sockets.close()


class TrainingLog:
    """The training loop's logging: a line every `learner.log_interval_s` (and a last one as
    training stops, so TensorBoard's curves end where training did), and while no update
    runs, a line saying what the learner waits for, with the heartbeat kept going."""

    def __init__(self, learner: Learner, metrics: MetricsWriter, t_start: float):
        self.learner = learner
        group_steps = (lambda: learner.group_env_steps) if learner.group is not None else None
        self.report = Report(learner.progress, metrics, learner.source.fill, learner.control_endpoint, learner.algo.optimizer, group_steps)
        self.report.hyperparameters(learner.config.to_dict())
        self.t_start = t_start
        self.interval = learner.config.learner.log_interval_s
        self.last_log = self.last_wait_log = time.perf_counter()
        self.env_rate, self.sample_rate = Rate(learner.progress.env_steps), Rate(0)
        self.samples = 0
        self.wait_s = 0.0
        self.stats = StatsSum()

    def idle(self) -> None:
        """No data to train on: publish weights whose copy has landed since the last update (a
        synchronous learner's actors wait for them), keep actors' watchdogs fed, and say what
        we wait for."""
        self.learner.publisher.publish_ready()
        self.learner.publisher.heartbeat()
        now = time.perf_counter()
        if now - max(self.last_log, self.last_wait_log) >= self.interval:
            self.report.waiting(now - self.t_start, self.learner.algo.waiting_for())
            self.last_wait_log = now

    def maybe_log(self, now: float) -> None:
        if now - self.last_log >= self.interval:
            self.log(now)

    def log(self, now: float) -> None:
        """The stretch since the last line."""
        self.report.training(now - self.t_start, self.env_rate, self.sample_rate, self.samples,
                             self.wait_s / (now - self.last_log), self.stats)
        self.stats.clear()
        self.wait_s = 0.0
        self.last_log = now

    def last(self, reason: str) -> str:
        now = time.perf_counter()
        if now > self.last_log:
            self.log(now)
        self.report.final_return()
        return reason


def share_of(config: Config, members: int) -> Config:
    """The config of one learner of a group of `members`: its share of the batch."""
    lc = config.learner
    return dataclasses.replace(config, learner=dataclasses.replace(lc, batch_size=lc.batch_size // members, num_learners=1))


def _batch_samples(batch: dict[str, torch.Tensor]) -> int:
    a = batch.get("action")
    if a is None:
        return 0
    return int(a.shape[0] * a.shape[1]) if a.dim() >= 2 else int(a.shape[0])


__all__ = ["Learner", "LearnerResult", "publishable"]
