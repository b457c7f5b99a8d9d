"""`zrl bench pipeline`: how close the whole pipeline runs to its ceilings.

Four measurements, each side by side with its reference in the same run:

1. raw env: the vector env alone (the same backend, K and threads an actor
   uses) stepped with random actions: the ceiling.
2. actor sink: one real actor process (`zrl actor`) stepping + batched CPU
   inference + building and sending chunks to a learner in sink mode, which
   answers the hello and receives and discards: env steps/s against the raw
   env rate (target for Atari: at least 80%). For Pong, again with every
   emulator thread pinned to one core, in the actor and in the raw env, so
   that the policy has a core of its own.
3. zrl run: a learner and 1, 2, 4 actors training for a while; env steps/s
   (with the raw single-process env rate as the ceiling), the learner's
   samples/s, its share of time waiting for data, and policy lag, from the
   learner's whole-run report (start-up excluded).
4. learner: zrl's training step on real wire messages (the learner's
   wire.Gate checks and views, counted in line though the receiver thread
   runs them -> collate -> loss with the C++ V-trace -> backward -> clip -> step -> weights
   encoded for publishing) against a plain PyTorch loop doing the same
   model, loss and optimiser on tensors already in memory (target: zrl
   costs under 10% more).

CartPole (default config) and Pong (configs/pong_impala.yaml). On Atari a
step is frame_skip (4) emulator frames.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import torch

from zrl import algorithms, spaces, wire
from zrl.actors.sender import Sender
from zrl.algorithms.optim import make_optimizer
from zrl.bench.harness import BenchOptions, BenchResult, run_group
from zrl.config import load_config
from zrl.envs import Step, make_vector_env, probe_specs
from zrl.envs.atari import uses_ale_vector
from zrl.learner.learner import Learner
from zrl.learner.prefetch import Prefetcher
from zrl.learner.publisher import HostWeights, WeightsFrames
from zrl.learner.receiver import DATA_KINDS

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"CartPole": ROOT / "configs" / "cartpole_impala.yaml", "Pong": ROOT / "configs" / "pong_impala.yaml"}


def _config(name, overrides=()):
    return load_config(CONFIGS[name], list(overrides))


def raw_env_rate(cfg, seconds: float) -> float:
    env = make_vector_env(cfg.env, cfg.actor.num_envs, 0)
    rng = np.random.default_rng(0)
    n = env.action_spec.n if isinstance(env.action_spec, spaces.DiscreteSpec) else None
    K = env.num_envs
    try:
        env.reset()
        for _ in range(20):
            env.step(rng.integers(0, n, K))
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            env.step(rng.integers(0, n, K))
            steps += K
        return steps / (time.perf_counter() - t0)
    finally:
        env.close()


def one_core_overrides(cfg) -> tuple[str, ...] | None:
    """Config overrides that put every emulator thread of an Atari actor (one per vector env) on
    one core, the first this process may use, leaving the others to the policy; None where
    there is no second core, or the env is not ale_py's vector env (which pins its threads
    from `thread_affinity_offset`)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < 2 or not uses_ale_vector(cfg.env):
        return None
    return ("env.num_threads=1", f"env.kwargs={{thread_affinity_offset: {cores[0]}}}")


def process_cpu(pid: int) -> dict[str, float] | None:
    """CPU seconds each thread of process `pid` has used so far, summed by thread name (Linux's
    /proc; None elsewhere, or once the process is gone)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[str, float] = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # (the name may hold spaces)
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    except (OSError, IndexError, ValueError):
        return None
    return out


def actor_sink_rate(name: str, cfg, seconds: float, overrides=(), cpu: list | None = None) -> float:
    """One `zrl actor` process against an in-process sink learner; env steps/s it delivers. With
    `cpu` (a list), appends the actor process's CPU per env step in the timed window, in µs:
    (its emulator threads, all its other threads), where /proc tells them apart (Linux)."""
    tmp = tempfile.mkdtemp(prefix="zrl-sink-")
    bind = f"ipc://{tmp}/control"
    learner = Learner(cfg, bind, None, console=False, sink=True)
    t = threading.Thread(target=learner.run, daemon=True)
    t.start()
    actor = subprocess.Popen([sys.executable, "-m", "zrl", "actor", "--config", str(CONFIGS[name]), "--learner", bind, *[a for o in overrides for a in ("-o", o)]],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while learner.env_steps == 0:
            if time.monotonic() > deadline or actor.poll() is not None:
                raise RuntimeError("the actor never delivered data to the sink")
            time.sleep(0.05)
        time.sleep(min(2.0, seconds / 2))  # warm-up: the actor's first chunks
        c0 = process_cpu(actor.pid)
        s0, t0 = learner.env_steps, time.perf_counter()
        time.sleep(seconds)
        steps = learner.env_steps - s0
        rate = steps / (time.perf_counter() - t0)
        c1 = process_cpu(actor.pid)
        if actor.poll() is not None:  # it died in the window: its rate is not a measurement
            raise RuntimeError(f"the actor exited with {actor.returncode} while it was timed")
        if cpu is not None and c0 is not None and c1 is not None and steps > 0:
            used = {k: v - c0.get(k, 0.0) for k, v in c1.items()}
            emulator = used.pop("zrl-emulator", 0.0)
            cpu.append((emulator / steps * 1e6, sum(used.values()) / steps * 1e6))
        return rate
    finally:
        actor.terminate()
        try:
            actor.wait(20)
        except subprocess.TimeoutExpired:
            actor.kill()
            actor.wait()
        learner.request_stop()
        t.join(20)
        learner.close()
        shutil.rmtree(tmp, ignore_errors=True)  # the ipc sockets' files


def sink_against_raw(name: str, cfg, seconds: float, overrides=(), pairs: int = 3, cpu: list | None = None) -> tuple[float, float, float, list[float]]:
    """(raw env steps/s, actor -> sink steps/s, ratio, each run's ratio): medians over `pairs` sink runs, each
    bracketed by raw runs (raw, sink, raw, sink, ..., raw), each ratio taken against the mean
    of the two raw runs beside it. On a shared machine the emulator's speed drifts by tens
    of percent within minutes; a ratio of neighbours is far steadier than one of two single
    runs taken a minute apart."""
    raws = [raw_env_rate(cfg, seconds)]
    sinks = []
    for _ in range(pairs):
        sinks.append(actor_sink_rate(name, cfg, seconds, overrides, cpu))
        raws.append(raw_env_rate(cfg, seconds))
    ratios = [s / ((a + b) / 2) for s, a, b in zip(sinks, raws, raws[1:])]
    return float(np.median(raws)), float(np.median(sinks)), float(np.median(ratios)), [float(r) for r in ratios]


def zrl_run_perf(name: str, actors: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="zrl-pipe-") as d:
        argv = [sys.executable, "-m", "zrl", "run", "--config", str(CONFIGS[name]), "--actors", str(actors), "--logdir", d,
                "--max-seconds", str(seconds), "--stop-at-return", "1e9", "-o", "learner.checkpoint_interval_s=1e6"]
        code = run_group(argv, ROOT, timeout=seconds + 180)
        if code != 0:
            raise RuntimeError(f"zrl run failed for {name} with {actors} actors (exit status {code})")
        return json.loads((Path(d) / "learner_final.json").read_text())["perf"]


def learner_overhead(name: str, cfg, updates: int, device: str = "cpu", from_host: bool = False, prefetch: int = 0) -> tuple[float, float]:
    """Seconds per update: zrl's path from wire messages, and a plain loop on in-memory tensors.

    device "cuda": both models on the GPU. The plain loop's batch is then on the GPU already,
    or, with from_host, in pinned host memory that it copies over (non_blocking) each step, as
    a DataLoader with pin_memory would hand it. zrl publishes as its learner does there
    (HostWeights: a copy queued behind the update, picked up once it has landed). Steps are
    timed in blocks of 10 with one synchronize at the end of each, so that the CPU's work for
    one step overlaps the GPU's for the one before, as in a training loop.

    prefetch N: zrl's batches are checked and joined on a Prefetcher's thread, up to N ahead,
    as the learner does with learner.prefetch_batches N."""
    torch.set_num_threads(cfg.learner.torch_threads)
    obs_spec, act_spec = probe_specs(cfg.env)
    algo = algorithms.get(cfg.algo.name)(cfg, obs_spec, act_spec)
    K, B = cfg.actor.num_envs // cfg.actor.env_groups, cfg.learner.batch_size  # chunk width, batch columns
    # Real chunks: a recorder fed by a policy acting on random observations.
    rng = np.random.default_rng(0)
    model = algo.build_model()
    policy = algo.make_policy(model, actor_index=0, num_actors=1, seed=0)
    rec = algo.make_recorder(model, num_envs=K, sender=Sender(0))

    def obs():
        if obs_spec.dtype == "uint8":
            return rng.integers(0, 256, (K, *obs_spec.shape), dtype=np.uint8)
        return rng.normal(size=(K, *obs_spec.shape)).astype(obs_spec.dtype)

    frames = []
    rec.begin(obs())
    while len(frames) < B // K:
        a, extras = policy.act(obs())
        rec.record(a, extras)
        frames += rec.observe(Step(obs(), rng.normal(size=K).astype(np.float32), rng.random(K) < 0.02, np.zeros(K, bool), {}))
    frames = [bytes(f) for f in frames]
    schema = algo.trajectory_schema(B)

    device = torch.device(device)
    gpu = device.type == "cuda"
    # Plain: the batch is tensors already; same loss, optimiser and clipping.
    plain_batch = algo.collate([wire.decode(f) for f in frames], device)
    host_batch = {k: v.cpu().pin_memory() for k, v in plain_batch.items()} if gpu and from_host else None
    torch.manual_seed(1)
    m1 = algo.build_model().to(device)
    o1 = make_optimizer(cfg.learner, m1.parameters())  # the learner's optimiser, as its setup makes it
    torch.manual_seed(1)
    trainer = algorithms.get(cfg.algo.name)(cfg, obs_spec, act_spec)
    trainer.setup(device)  # as the learner sets it up: its model in one flat buffer, its optimiser
    host_weights = HostWeights(trainer.flat)
    weights_frames = WeightsFrames()
    version = 0

    def plain_step():
        batch = plain_batch if host_batch is None else {k: v.to(device, non_blocking=True) for k, v in host_batch.items()}
        loss, _ = algo.loss(m1, batch)
        o1.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m1.parameters(), cfg.learner.max_grad_norm)
        o1.step()

    # The learner's receiver checks every frame with its wire.Gate (the C++ FrameGate once a
    # layout is known); counted here in line with the update, as if nothing overlapped.
    gate = wire.Gate(cfg.learner.max_message_bytes, DATA_KINDS)
    gate.set_trajectory_schema(schema, leave_to_join=True)

    def make_batch(stop=None):
        return algo.collate([gate.check(f)[0] for f in frames], device)

    prefetcher = Prefetcher(make_batch, prefetch) if prefetch else None

    def zrl_step():
        nonlocal version
        batch = make_batch() if prefetcher is None else prefetcher.get(60)
        trainer.update(batch, 0)  # the learner's own update
        version += 1
        host_weights.start(version)  # publishing, every update here
        landed = host_weights.ready()
        if landed is not None:
            weights_frames.frame(*landed)

    block = 10 if gpu else 1

    def timed(step) -> float:
        t0 = time.perf_counter()
        for _ in range(block):
            step()
        if gpu:
            torch.cuda.synchronize(device)
        return (time.perf_counter() - t0) / block

    try:
        for f in (plain_step, zrl_step):
            timed(f)
        zrl_t, plain_t = [], []
        for _ in range(max(1, updates // block)):  # alternate, so noise hits both alike
            plain_t.append(timed(plain_step))
            zrl_t.append(timed(zrl_step))
    finally:
        if prefetcher is not None:
            prefetcher.close()
    return float(np.median(zrl_t)), float(np.median(plain_t))


def plot(rows: list[dict], path) -> bool:
    """env steps/s of `zrl run` against the number of actors, per env, with the raw env
    rate (the ceiling) and one actor into a sink; False without matplotlib."""
    try:
        import matplotlib  # lazy: optional (the bench extra)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # lazy: optional, and only after choosing the Agg backend
    except ImportError:
        return False
    envs = list(dict.fromkeys(r["env"] for r in rows))
    fig, axes = plt.subplots(1, len(envs), figsize=(4.2 * len(envs), 3.4), squeeze=False)
    for ax, env in zip(axes[0], envs):
        mine = [r for r in rows if r["env"] == env]
        runs = [r for r in mine if r["measurement"].startswith("zrl run")]
        raw = next(r["reference"] for r in mine if r["measurement"].startswith("raw env"))
        sink = next((r["zrl"] for r in mine if r["measurement"].startswith("actor -> sink")), None)
        ax.plot([r["n"] for r in runs], [r["zrl"] for r in runs], "o-", label="zrl run: learner + n actors")
        ax.axhline(raw, ls="--", color="gray", label="raw env, one process (ceiling)")
        if sink is not None:
            ax.axhline(sink, ls=":", color="C1", label="one actor -> sink")
        ax.set_xticks([r["n"] for r in runs])
        ax.set_ylim(0, raw * 1.15)
        ax.set_xlabel("actors")
        ax.set_ylabel("env steps/s")
        ax.set_title(env)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def run(opts: BenchOptions) -> BenchResult:
    quick = opts.quick
    result = BenchResult(
        name="pipeline",
        title="Pipeline: env steps/s against the raw env, the learner's share waiting for data, policy lag, learner overhead",
        columns=["measurement", "env", "n", "zrl", "reference", "ratio", "learner_samples/s", "wait_for_data", "lag_mean"],
    )
    envs = ["CartPole", "Pong"]
    cuda = torch.cuda.is_available()
    secs = 2.0 if quick else 8.0
    pairs = 1 if quick else 5
    spreads = []  # each bracketed run's ratio, for the notes
    cpus = []  # the actor's CPU per env step, for the notes
    for name in envs:
        cfg = _config(name)
        cpu: list[tuple[float, float]] = []
        raw, sink, ratio, each = sink_against_raw(name, cfg, secs, pairs=pairs, cpu=cpu)
        spreads.append(f"{name} " + " ".join(f"{r:.3f}" for r in each))
        if cpu:
            emulator, rest = np.median(np.array(cpu), axis=0)
            cpus.append(f"{name} {rest:.1f}" + (f" (its emulator threads {emulator:.1f})" if emulator else ""))
        result.add(measurement="raw env (steps/s)", env=name, n=cfg.actor.num_envs, zrl="", reference=raw, ratio="")
        result.add(measurement="actor -> sink (steps/s)", env=name, n=cfg.actor.num_envs, zrl=sink, reference=raw, ratio=ratio)
        pin = one_core_overrides(cfg)
        if pin is not None:
            # The policy with a core of its own: the emulator on one core in both columns.
            raw1, sink1, ratio1, each1 = sink_against_raw(name, _config(name, pin), secs, pin, pairs=pairs)
            spreads.append(f"{name} with the emulator on 1 core " + " ".join(f"{r:.3f}" for r in each1))
            result.add(measurement="actor -> sink, emulator on 1 core (steps/s)", env=name, n=cfg.actor.num_envs, zrl=sink1,
                       reference=raw1, ratio=ratio1)
        for actors in ([1, 2] if quick else [1, 2, 4]):
            perf = zrl_run_perf(name, actors, (6.0 if quick else 30.0) if name == "CartPole" else (10.0 if quick else 60.0))
            result.add(measurement="zrl run (env steps/s)", env=name, n=actors, zrl=perf["env_steps_per_s"], reference=raw,
                       ratio=perf["env_steps_per_s"] / raw, **{"learner_samples/s": perf["learner_samples_per_s"],
                                                               "wait_for_data": perf["wait_for_data_frac"], "lag_mean": perf["policy_lag_mean"]})
        updates = 5 if quick else (40 if name == "Pong" else 200)
        z, p = learner_overhead(name, cfg, updates)
        result.add(measurement="learner update (ms)", env=name, n=cfg.learner.batch_size, zrl=z * 1e3, reference=p * 1e3, ratio=z / p)
        if cuda:
            for from_host, prefetch in ((False, 0), (True, 0), (False, 2), (True, 2)):
                z, p = learner_overhead(name, cfg, max(updates, 100), device="cuda", from_host=from_host, prefetch=prefetch)
                what = "plain loop copies its batch from pinned memory" if from_host else "plain loop's batch on the GPU"
                what += ", zrl's batches on a prefetch thread" if prefetch else ""
                result.add(measurement=f"learner update on cuda, {what} (ms)", env=name, n=cfg.learner.batch_size,
                           zrl=z * 1e3, reference=p * 1e3, ratio=z / p)
    result.notes += [
        "raw env: the actor's vector env (same backend, K and emulator threads) stepped with random actions in one process; "
        "the ceiling for everything below. Pong: 1 step = 4 emulator frames.",
        "actor -> sink: one `zrl actor` process (stepping, batched inference, chunks sent) against a learner that receives and "
        "discards; ratio = its steps/s over the raw env's (target >= 0.8 on Atari). Raw and sink alternate, raw first and last "
        f"({pairs} sink runs, {pairs + 1} raw runs); each ratio is against the mean of the two raw runs beside it; the table "
        "gives the medians of the rates and of the ratios. Each run's ratio, in order: " + "; ".join(spreads) + ".",
        *([("actor -> sink, CPU: the actor process's CPU per env step in its timed windows (medians, µs; /proc), all its "
            "threads but the emulator's (the actor's own thread: stepping calls, policy, recorders, sending; ZeroMQ's): "
            + "; ".join(cpus) + ". On 2 cores every µs of it is taken from the emulator threads.")] if cpus else []),
        "actor -> sink, emulator on 1 core (Pong): the same, with every emulator thread pinned to one core (env.num_threads 1, "
        "ale_py's thread_affinity_offset) in both columns: the raw env's one thread, and the actor's one (one per env group with actor.env_batching groups). The "
        "actor's policy has the other core to itself, as it would on a machine with cores to spare; on 2 cores the plain "
        "row's policy takes CPU from the emulator.",
        "zrl run: learner + n actors training, from the learner's first batch on; reference = the single-process raw env rate "
        "(n actors share the same 2 cores with the learner). wait_for_data = the learner's share of time waiting for a batch.",
        "learner update: median ms per update, zrl's path from wire messages (the learner's wire.Gate: decode and checks, in line with the update; collate, "
        "then the learner's own Algorithm.update: loss with C++ V-trace, backward, clip, the non-finite gradient guard, step, after_update; weights written into a frame, learner.WeightsFrames) "
        "vs a plain PyTorch loop on the same batch already in tensors; n = batch columns; target ratio <= 1.10.",
        *(["learner update on cuda: the same on the GPU, both timed in blocks of 10 steps with one synchronize per block; "
           "zrl's batch goes to the GPU through pinned memory and its weights come back through HostWeights' pinned copy, "
           "as in its learner. The plain loop's batch is on the GPU already, or (second row) in pinned host memory, "
           "copied with non_blocking=True each step. The rows with a prefetch thread: zrl's batches checked and joined on a "
           "Prefetcher's thread, up to 2 ahead (learner.prefetch_batches 2, what auto picks on a GPU)."] if cuda else []),
    ]
    png = opts.out / "pipeline.png"
    result.notes.append(f"Plot: {png.name} (beside this table)" if plot(result.rows, png) else "matplotlib is not installed: no plot (pip install -e .[bench]).")
    return result
