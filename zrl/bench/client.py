"""`zrl bench client`: act round-trip latency through the agent server.

C++ clients (csrc/examples/client_bench, one process each) step against a
`zrl serve` that does inference only (no learner, so nothing trains during
the measurement), with 1, 8, 32 and 64 clients at once: latency p50 / p99 /
p99.9 over every timed round trip, and aggregate steps/s. Side by side, in
the same run, the same number of client_bench processes in raw mode do plain
ZeroMQ DEALER round trips of exactly the same request size against a raw
echo ROUTER (pyzmq, in a process of its own): the transport floor that the
server's decode, batching, inference and encode sit on.

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

ECHO = r"""
import sys, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.ROUTER)
s.setsockopt(zmq.LINGER, 0)
s.bind("tcp://127.0.0.1:*")
print(s.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
while True:
    s.send_multipart(s.recv_multipart(copy=False), copy=False)
"""


def _binary() -> Path:
    build = Path(os.environ.get("ZRL_CPP_BUILD_DIR", ROOT / "build" / "cpp"))
    path = build / "client_bench"
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


def _clients(binary: Path, endpoint: str, mode: str, n: int, steps: int, warmup: int, tmp: Path) -> tuple[np.ndarray, float]:
    """n client processes at once; returns all their latencies (us) and the aggregate steps/s."""
    procs = []
    t0 = time.perf_counter()
    for i in range(n):
        out = tmp / f"{mode}-{n}-{i}.txt"
        procs.append((subprocess.Popen([str(binary), "--endpoint", endpoint, "--steps", str(steps), "--warmup", str(warmup),
                                        "--out", str(out), "--mode", mode, "--timeout-ms", "30000"],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), out))
    lat, walls = [], []
    try:
        for p, out in procs:
            text, _ = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"client_bench ({mode}) failed: {text.strip()[-500:]}")
            walls.append(float(re.search(r"wall_s=([0-9.eE+-]+)", text).group(1)))
            lat.append(np.loadtxt(out, ndmin=1))
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    del t0
    latencies = np.concatenate(lat)
    # Every client runs `steps` timed round trips; they overlap, so the aggregate rate is all
    # of them over the longest client's wall time (client_bench's: its connect, hello and
    # warm-up included, on both sides alike, so the ratio holds; the rates are low by that).
    return latencies, n * steps / max(walls)


def run(opts: BenchOptions) -> BenchResult:
    binary = _binary()
    counts = [1, 8] if opts.quick else [1, 8, 32, 64]
    total_steps = 2_000 if opts.quick else 40_000
    result = BenchResult(
        name="client",
        title="Agent server: act round trip of C++ clients (zrl serve, inference only) vs raw ZeroMQ request/reply of the same size",
        columns=["clients", "zrl_p50_us", "zrl_p99_us", "zrl_p99.9_us", "zrl_steps/s", "raw_p50_us", "raw_p99_us", "raw_p99.9_us", "raw_steps/s", "p50_ratio"],
    )
    started = []  # stopped in the finally below, whichever start failed
    try:
        server, endpoint = _start([sys.executable, "-m", "zrl", "serve", "--config", str(CONFIG), "--bind", "tcp://127.0.0.1:*"], r"\[server\] serving .* on (tcp://\S+?)(,| \()")
        started.append(server)
        echo, echo_endpoint = _start([sys.executable, "-c", ECHO], r"(tcp://\S+)")
        started.append(echo)
        with tempfile.TemporaryDirectory(prefix="zrl-bench-client-") as d:
            tmp = Path(d)
            for n in counts:
                steps = max(200, total_steps // n)
                warmup = max(50, steps // 10)
                # zrl then raw at each count, back to back, so that noise from the shared machine hits both alike.
                z, z_rate = _clients(binary, endpoint, "zrl", n, steps, warmup, tmp)
                r, r_rate = _clients(binary, echo_endpoint, "raw", n, steps, warmup, tmp)
                zl, rl = z.tolist(), r.tolist()
                result.add(
                    clients=n,
                    zrl_p50_us=percentile(zl, 50), **{"zrl_p99_us": percentile(zl, 99), "zrl_p99.9_us": percentile(zl, 99.9), "zrl_steps/s": z_rate},
                    raw_p50_us=percentile(rl, 50), **{"raw_p99_us": percentile(rl, 99), "raw_p99.9_us": percentile(rl, 99.9), "raw_steps/s": r_rate},
                    p50_ratio=percentile(zl, 50) / percentile(rl, 50),
                )
    finally:
        for p in started:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    result.notes.append(f"zrl: `zrl serve --config configs/cartpole_serve.yaml` without a learner (inference only), MLP 64x64, obs float32[4], "
                        f"discrete(2); {total_steps} timed send() calls split over the clients, after a warm-up; one client_bench process per client.")
    result.notes.append("raw: the same client_bench processes in raw mode, DEALER round trips of a frame of the ACT's exact size to a pyzmq echo ROUTER.")
    result.notes.append("Percentiles over every timed round trip of all clients; steps/s = all timed round trips over the longest client process's "
                        "wall time (its connect, hello and warm-up included, zrl and raw alike: compare the two, not either with a rate elsewhere). "
                        "With more clients than cores, latency includes waiting for a CPU.")
    return result
