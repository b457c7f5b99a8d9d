"""`zrl bench client`: act round-trip latency through the agent server.

C++ clients (csrc/examples/client_bench, one process each) step against a
`zrl serve` that does inference only (no learner, so nothing trains during
the measurement), with 1, 8, 32 and 64 clients at once: latency p50 / p99 /
p99.9 over every timed round trip, and aggregate steps/s. Side by side, in
the same run, the same number of client_bench processes in raw mode do plain
ZeroMQ DEALER round trips of exactly the same request size against a raw
echo ROUTER (csrc/examples/zmq_echo, C++, in a process of its own): the
transport floor that the server's decode, batching, inference and encode sit
on. (Before the server's C++ request loop the echo was pyzmq's, whose own
interpreter raised the floor; bench/out/client.md says which a run used.)

Full runs add rows for 256 and 1,024 clients, more processes than a machine
of a few cores can run side by side: there, 4 csrc/examples/client_load
processes of 64 or 256 sessions each (one DEALER socket per session, all on
one thread per process, opened at a steady pace under the server's
server.new_sessions_per_s), each session stepping as a simulator does, at
LOAD_OFFERED / n steps per second (client_load --step-hz), with ACT round
trips as zrl::Client does them; for raw, the same processes in raw mode
against the same echo. Paced, the rows measure the latency of serving n
sessions at once; n closed loops would instead keep n requests queued, and
by Little's law each would wait n / rate whatever the server did. Their
latencies include the wait for the client process's one thread; their steps/s
are all timed round trips over the longest process's timed phase (from every
session of that process having warmed up to its last timed reply): the offered
rate, where the server keeps up. zrl_refused counts the sessions refused at
hello or ended by an ERROR (client_load runs with --allow-refused so that they
are counted, not fatal); client_bench rows fail on any error, so it is 0
there. The server's defaults (server.max_clients 4096, new_sessions_burst
1024, new_sessions_per_s 200) hold 1,024 sessions, so it runs without
overrides.

Needs the C++ build (`scripts/test.sh`, or cmake with -DZRL_BUILD_CLIENT=ON);
its directory comes from ZRL_CPP_BUILD_DIR or defaults to build/cpp.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from zrl.bench import BenchUnavailable
from zrl.bench.harness import BenchOptions, BenchResult, percentile

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cartpole_serve.yaml"
# Full runs only: these counts are more processes than the machine holds, so they run as
# LOAD_PROCS client_load processes of n / LOAD_PROCS sessions each.
LOAD_COUNTS = [256, 1024]
LOAD_PROCS = 4
LOAD_HELLO_RATE = 160  # new sessions per second, all processes together: under the server's new_sessions_per_s (200)
# Sessions there step as simulators do, at a rate (client_load --step-hz) that offers this many
# steps/s in all; N closed loops would instead queue N requests at once, and each would wait N / rate.
LOAD_OFFERED = 10_240
LOAD_SECONDS = 8  # the timed phase

def _binary(name: str = "client_bench") -> Path:
    build = Path(os.environ.get("ZRL_CPP_BUILD_DIR", ROOT / "build" / "cpp"))
    path = build / name
    if not path.exists():
        raise BenchUnavailable(f"{path} not found: build the C++ client first (bash scripts/test.sh, or cmake -DZRL_BUILD_CLIENT=ON)")
    return path


def _start(argv: list[str], pattern: str, timeout: float = 60.0) -> tuple[subprocess.Popen, str]:
    """Starts a server process and returns it with the endpoint it printed (within `timeout`,
    even if it prints nothing). A thread reads its output for as long as it runs, so it never
    blocks on a full pipe."""
    import queue
    import threading

    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()

    def read():
        for line in p.stdout:
            lines.put(line)
        lines.put(None)  # the output ended

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        m = re.search(pattern, line)
        if m:
            return p, m.group(1)
    p.kill()
    p.wait()
    raise RuntimeError(f"{argv[2:4]} did not report its endpoint within {timeout:.0f}s")


def _summary(text: str, key: str) -> float:
    m = re.search(rf"\b{key}=([0-9.eE+-]+)", text)
    if m is None:
        raise RuntimeError(f"no {key}= in the summary line: {text.strip()[-500:]}")
    return float(m.group(1))


def _run_all(argvs: list[list[str]], outs: list[Path]) -> list[tuple[str, np.ndarray]]:
    """Runs the client processes at once; returns each one's output and latencies (us). Any
    failure stops them all."""
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for argv in argvs]
    done = []
    try:
        for p, out, argv in zip(procs, outs, argvs):
            text, _ = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"{Path(argv[0]).name} ({argv[argv.index('--mode') + 1]}) failed: {text.strip()[-500:]}")
            done.append((text, np.loadtxt(out, ndmin=1)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return done


def _argv(binary: Path, endpoint: str, mode: str, steps: int, warmup: int, out: Path) -> list[str]:
    return [str(binary), "--endpoint", endpoint, "--steps", str(steps), "--warmup", str(warmup), "--out", str(out),
            "--mode", mode, "--timeout-ms", "30000"]


def _clients(binary: Path, endpoint: str, mode: str, n: int, steps: int, warmup: int, tmp: Path) -> tuple[np.ndarray, float, int]:
    """n client_bench processes at once; returns all their latencies (us), the aggregate
    steps/s and the sessions refused (0: client_bench fails on any error)."""
    outs = [tmp / f"{mode}-{n}-{i}.txt" for i in range(n)]
    done = _run_all([_argv(binary, endpoint, mode, steps, warmup, out) for out in outs], outs)
    walls = [_summary(text, "wall_s") for text, _ in done]
    # Every client runs `steps` timed round trips; they overlap, so the aggregate rate is all
    # of them over the longest client's wall time (client_bench's: its connect, hello and
    # warm-up included, on both sides alike, so the ratio holds; the rates are low by that).
    return np.concatenate([lat for _, lat in done]), n * steps / max(walls), 0


def _loads(binary: Path, endpoint: str, mode: str, n: int, steps: int, warmup: int, tmp: Path, procs: int = LOAD_PROCS) -> tuple[np.ndarray, float, int]:
    """n sessions over `procs` client_load processes at once; returns all their latencies
    (us), the aggregate steps/s and the sessions refused or ended by an ERROR."""
    outs = [tmp / f"load-{mode}-{n}-{i}.txt" for i in range(procs)]
    hz = LOAD_OFFERED / n
    steps = int(hz * LOAD_SECONDS)
    extra = ["--sessions", str(n // procs), "--hello-rate", str(LOAD_HELLO_RATE / procs), "--step-hz", f"{hz:g}", "--allow-refused"]
    done = _run_all([_argv(binary, endpoint, mode, steps, min(warmup, 20), out) + extra for out in outs], outs)
    latencies = np.concatenate([lat for _, lat in done])
    # Timed phases overlap (the processes start together and open sessions at the same pace):
    # all timed round trips over the longest one, zrl and raw alike.
    rate = latencies.size / max(1e-9, *(_summary(text, "timed_s") for text, _ in done))
    return latencies, rate, int(sum(_summary(text, "refused") + _summary(text, "errors") for text, _ in done))


def _row(result: BenchResult, n: int, z: tuple[np.ndarray, float, int], r: tuple[np.ndarray, float, int]) -> None:
    zl, rl = z[0].tolist(), r[0].tolist()
    result.add(
        clients=n,
        zrl_p50_us=percentile(zl, 50), **{"zrl_p99_us": percentile(zl, 99), "zrl_p99.9_us": percentile(zl, 99.9), "zrl_steps/s": z[1]},
        raw_p50_us=percentile(rl, 50), **{"raw_p99_us": percentile(rl, 99), "raw_p99.9_us": percentile(rl, 99.9), "raw_steps/s": r[1]},
        p50_ratio=percentile(zl, 50) / percentile(rl, 50), zrl_refused=z[2],
    )


def _stop(started: list[subprocess.Popen]) -> None:
    for p in started:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _notes(result: BenchResult, total_steps: int, quick: bool) -> None:
    result.notes.append(f"zrl: `zrl serve --config configs/cartpole_serve.yaml` without a learner (inference only), MLP 64x64, obs float32[4], "
                        f"discrete(2); {total_steps} timed send() calls split over the clients (at least 200 each), after a warm-up; "
                        f"one client_bench process per client.")
    result.notes.append("raw: the same client_bench processes in raw mode, DEALER round trips of a frame of the ACT's exact size to a C++ echo ROUTER "
                        "(csrc/examples/zmq_echo: ZeroMQ alone).")
    result.notes.append("Percentiles over every timed round trip of all clients; steps/s = all timed round trips over the longest client process's "
                        "wall time (its connect, hello and warm-up included, zrl and raw alike: compare the two, not either with a rate elsewhere). "
                        "With more clients than cores, latency includes waiting for a CPU.")
    if not quick:
        result.notes.append(f"{' and '.join(str(n) for n in LOAD_COUNTS)} clients: {LOAD_PROCS} client_load processes of n/{LOAD_PROCS} sessions "
                            f"each (one DEALER per session, all driven by one thread per process, opened at {LOAD_HELLO_RATE / LOAD_PROCS:g}/s per process), zrl and raw alike; "
                            f"each session steps as a simulator at {LOAD_OFFERED:,}/n Hz ({LOAD_OFFERED:,} steps/s offered in all) for {LOAD_SECONDS} s, so steps/s is "
                            "the offered rate where the server keeps up, and latency is the service's, not a queue of n closed loops; "
                            "latency includes the wait for the client process's one thread. "
                            "zrl_refused: sessions refused at hello or ended by an ERROR (0 in a healthy run; client_bench rows fail on any).")


def _measure(result: BenchResult, binary: Path, load_binary: Path | None, endpoint: str, echo_endpoint: str, total_steps: int, quick: bool) -> None:
    counts = [(n, _clients, binary) for n in ([1, 8] if quick else [1, 8, 32, 64])]
    if not quick:
        counts += [(n, _loads, load_binary) for n in LOAD_COUNTS]
    with tempfile.TemporaryDirectory(prefix="zrl-bench-client-") as d:
        tmp = Path(d)
        for n, runner, exe in counts:
            steps = max(200, total_steps // n)
            warmup = max(50, steps // 10)
            # zrl then raw at each count, back to back, so that noise from the shared machine hits both alike.
            z = runner(exe, endpoint, "zrl", n, steps, warmup, tmp)
            r = runner(exe, echo_endpoint, "raw", n, steps, warmup, tmp)
            _row(result, n, z, r)


def run(opts: BenchOptions) -> BenchResult:
    binary = _binary()
    load_binary = None if opts.quick else _binary("client_load")
    total_steps = 2_000 if opts.quick else 40_000
    result = BenchResult(
        name="client",
        title="Agent server: act round trip of C++ clients (zrl serve, inference only) vs raw ZeroMQ request/reply of the same size",
        columns=["clients", "zrl_p50_us", "zrl_p99_us", "zrl_p99.9_us", "zrl_steps/s", "raw_p50_us", "raw_p99_us", "raw_p99.9_us", "raw_steps/s",
                 "p50_ratio", "zrl_refused"],
    )
    started = []  # stopped in the finally below, whichever start failed
    try:
        server, endpoint = _start([sys.executable, "-m", "zrl", "serve", "--config", str(CONFIG), "--bind", "tcp://127.0.0.1:*"], r"\[server\] serving .* on (tcp://\S+?)(,| \()")
        started.append(server)
        echo, echo_endpoint = _start([str(_binary("zmq_echo"))], r"(tcp://\S+)")
        started.append(echo)
        _measure(result, binary, load_binary, endpoint, echo_endpoint, total_steps, opts.quick)
    finally:
        _stop(started)
    _notes(result, total_steps, opts.quick)
    return result
