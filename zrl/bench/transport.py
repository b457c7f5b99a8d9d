"""`zrl bench transport`: IMPALA trajectory chunks through zrl's send and
receive paths against raw pyzmq PUSH/PULL moving the same bytes per message.

Two worker processes (spawned, so no state leaks from the parent) stand for
an actor and the learner; the parent only gives orders over pipes. The
receiver binds one PULL socket per side (tcp://127.0.0.1:* or ipc:// in a
temporary directory) and reports the endpoints; the sender connects one PUSH
to each. Both sides get the same socket options: SNDHWM = RCVHWM = HWM
(`_hwm`: 16 MiB worth of messages, between 8 and 1000), ZMQ_MAXMSGSIZE set to
the learner's cap, one I/O thread per context.

- zrl, sender (an actor at each chunk boundary): the IMPALA recorder's own
  `end_chunk`, with no truncated rows (M = 0): the actor's `Sender.finish`,
  which sends through its link's `transport.Pusher` (with
  `transport.native()`, one C++ call that stamps the header and hands the
  frame to libzmq: copied under 64 KiB; from 64 KiB up without a copy, from
  the frame's SendBuffer; else `OutMessage.finish` and pyzmq's send), then the
  next chunk's bootstrap row, obs[0] = obs[T]: in the same frame when it went
  out copied, else in a fresh frame from the recorder's `wire.Layout`.
  Writing the T steps into the frame is not included: it is the environment
  loop's work, which any sender needs to build its payload.
- zrl, receiver (the learner's receiver thread up to batching): the learner's
  `wire.Gate` with its allowed kinds (TRAJECTORY, STATS), cap
  (`learner.max_message_bytes`), the real `Impala.trajectory_schema(batch_size)`
  and the checks the learner's gate makes: the final_index range and marks;
  the per-element rules of the arrays the learner joins into a batch (finite
  floats, action and flag ranges) are left to that join, which checks each
  element as it copies it (the schema's `at_join` fields), as in the learner;
  not counted here, as raw's reference never joins), draining bursts of
  up to 64 with `Gate.drain`: with `transport.native()`, C++ waits for the
  burst's first message in a blocking receive (as the learner's receiver does;
  a message that was waited for is its burst alone), takes the burst from
  libzmq and the FrameGate checks each frame of a known layout, without the
  GIL, and C++ makes each such frame's `wire.Message`; the first frame of a
  layout takes the Python path (decode, the schema and its rules) and registers it. The arrays' numpy views are made later, by
  `collate` on the trainer thread, as in the learner. Each burst is dropped once checked, as raw drops each frame
  (batching, where a learner keeps its messages, is measured by `zrl bench pipeline`).
- raw: a preallocated bytes payload as long as the zrl frame, `send` with
  copy=False when it is at least pyzmq's copy threshold (64 KiB) and the
  default copy otherwise; `recv(copy=False)` and nothing else.
- raw fresh (frames from 64 KiB up, informative): raw from a ring of HWM + 2
  payloads, each as cold in the caches as a new message's bytes (`FRESH`).

Each timed window moves a fixed number of messages, sized from a warm-up
window to last about `WINDOW_S`; the receiver times from its first message to
its last, so start-up and shut-down of the window are not counted, and every
message sent is received (nothing is left queued for the next window). zrl
and raw alternate window by window (the order flips each round), so a noisy
neighbour hits both alike; each figure is the median of the windows, and each
ratio comes with a bootstrap 95% interval over them (`harness.ratio_interval`).
Each window's CPU is also split by thread (each process's main thread and its
ZeroMQ I/O thread, `_thread_cpu`), so a row shows where zrl's extra CPU goes.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import tempfile
import time
import traceback
import types
from dataclasses import dataclass
from typing import Any

import zmq

from zrl import spaces, wire
from zrl.actors.sender import Sender
from zrl.bench.harness import BenchOptions, BenchResult, ratio_interval
from zrl.config import ActorConfig, Config, LearnerConfig
from zrl.transport import Pusher, native_note

WINDOW_S = 0.25
ROUNDS_PER_REPEAT = 10  # 50 windows a side by default (--repeats 5)
QUICK_WINDOW_S = 0.05
WARMUP_S = 0.25
QUICK_WARMUP_S = 0.02
FIRST_WINDOW_MSGS = 64  # the first warm-up window, before any rate is known
TARGET_RATIO = 0.9
HWM_BYTES = 16 << 20
REPLY_TIMEOUT_S = 60.0  # a worker that says nothing for this long is taken for dead


@dataclass(frozen=True)
class Chunk:
    """One IMPALA trajectory chunk: T steps of K envs, observations of obs_shape / obs_dtype."""

    name: str
    T: int
    K: int
    obs_shape: tuple[int, ...]
    obs_dtype: str
    n_actions: int
    what: str


CHUNKS = [
    Chunk("cartpole T20xK2", 20, 2, (4,), "float32", 2, "CartPole, 2 envs: the ~2 KB class"),
    Chunk("cartpole T20xK32", 20, 32, (4,), "float32", 2, "CartPole, the default config's 32 envs"),
    Chunk("atari T19xK1", 19, 1, (4, 84, 84), "uint8", 6, "20 stacked observations of 4x84x84 uint8 (19 steps + bootstrap), 1 env"),
]
TRANSPORTS = ["tcp", "ipc"]
MODES = ("zrl", "raw")
# A third side for frames sent without a copy: raw again, but each message from the next
# of a ring of payloads (one more than the queue holds, so none is still queued when it
# comes round), cold in the caches as a fresh message's bytes are. raw's one payload never
# leaves the caches. Informative only: the target is against raw.
FRESH = "raw fresh"


def _impala(chunk: Chunk):
    """The real IMPALA algorithm object for a chunk (imports torch)."""
    from zrl.algorithms.impala.algorithm import Impala  # lazy: imports torch, which only the spawned workers need

    batch = max(64, chunk.K)
    cfg = Config(actor=ActorConfig(num_envs=chunk.K, unroll_length=chunk.T), learner=LearnerConfig(batch_size=batch))
    return Impala(cfg, spaces.BoxSpec(chunk.obs_shape, chunk.obs_dtype), spaces.DiscreteSpec(chunk.n_actions))


def _recorder(algo, K: int, sender):
    """The actor's IMPALA recorder: its wire.Layout is what actors send."""
    return algo.make_recorder(None, num_envs=K, sender=sender)


def _fresh(nbytes: int) -> bool:
    """Whether a row also measures raw from fresh payloads: frames raw sends without a copy."""
    return nbytes >= zmq.COPY_THRESHOLD


def _hwm(nbytes: int) -> int:
    return max(8, min(1000, HWM_BYTES // max(nbytes, 1)))


def _socket(ctx, kind, hwm: int, cap: int):
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, hwm)
    s.setsockopt(zmq.RCVHWM, hwm)
    s.setsockopt(zmq.MAXMSGSIZE, cap)
    s.setsockopt(zmq.RCVTIMEO, int(REPLY_TIMEOUT_S * 1000))  # a window never hangs forever
    s.setsockopt(zmq.SNDTIMEO, int(REPLY_TIMEOUT_S * 1000))
    return s


# ---------------------------------------------------------------------------
# Worker processes. Each obeys (command, *args) tuples from its pipe and answers
# ("ok", value) or ("error", traceback); it closes its sockets on every exit path.


def _thread_cpu() -> dict[str, float]:
    """CPU seconds this process has used so far and its sleeps (voluntary context
    switches), its main thread apart from the others (ZeroMQ's I/O thread; the rest
    idle), from Linux's /proc/self/task: threads alive now (ZeroMQ's live as long as
    the context). Elsewhere the whole process counts as main."""
    out = {"main": 0.0, "io": 0.0, "main sleeps": 0.0, "io sleeps": 0.0}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        tids = []
    pid = str(os.getpid())
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])  # time on the CPU, in ns
            with open(f"/proc/self/task/{tid}/status") as f:
                sleeps = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches:"))
        except (OSError, ValueError, IndexError, StopIteration):
            continue  # a thread that ended meanwhile
        part = "main" if tid == pid else "io"
        out[part] += ns / 1e9
        out[part + " sleeps"] += sleeps
    if out["main"] == 0.0:  # no /proc (or no main thread in it): the process total, as main
        return {"main": time.process_time(), "io": 0.0, "main sleeps": 0.0, "io sleeps": 0.0}
    return out


def _serve(conn, handlers: dict, cleanup) -> None:
    try:
        while True:
            cmd, *args = conn.recv()
            if cmd == "exit":
                conn.send(("ok", None))
                return
            try:
                conn.send(("ok", handlers[cmd](*args)))
            except Exception:
                conn.send(("error", traceback.format_exc()))
    except (EOFError, KeyboardInterrupt):
        pass  # the parent went away
    finally:
        cleanup()


def _receiver_main(conn) -> None:
    ctx = zmq.Context()
    state: dict[str, Any] = {"socks": {}}

    def teardown():
        for s in state["socks"].values():
            s.close(0)
        state["socks"] = {}

    def setup(chunk: Chunk, transport: str, ipc_dir: str, frame_bytes: int):
        teardown()
        algo = _impala(chunk)
        cap = algo.config.learner.max_message_bytes
        from zrl.learner.receiver import DATA_KINDS  # lazy: imports torch, which only the spawned workers need

        gate = wire.Gate(cap, DATA_KINDS)  # as the learner builds it
        gate.set_trajectory_schema(algo.trajectory_schema(algo.config.learner.batch_size), leave_to_join=True)
        state.update(gate=gate, frame_bytes=frame_bytes)
        endpoints = {}
        for mode in MODES:
            s = _socket(ctx, zmq.PULL, _hwm(frame_bytes), cap)
            state["socks"][mode] = s
            s.bind("tcp://127.0.0.1:*" if transport == "tcp" else f"ipc://{ipc_dir}/{mode}.sock")
            endpoints[mode] = s.getsockopt_string(zmq.LAST_ENDPOINT)
        return endpoints, native_note()

    def window(mode: str, n: int) -> float:
        """Receives n messages; returns seconds from the first to the last."""
        perf = time.perf_counter
        if mode != "zrl":  # raw, or raw fresh (same socket, same loop)
            recv = state["socks"]["raw"].recv
            first = recv(copy=False)
            if len(first) != state["frame_bytes"]:
                raise RuntimeError(f"raw message of {len(first)} bytes, expected {state['frame_bytes']}")
            t0 = perf()
            for _ in range(n - 1):
                recv(copy=False)
            return perf() - t0
        return _gate_window(state["socks"][mode], state["gate"], n, state["frame_bytes"])

    _serve(conn, {"setup": setup, "window": window, "teardown": teardown, "cpu": _thread_cpu},
           lambda: (teardown(), ctx.term()))


def _gate_window(sock, gate: wire.Gate, n: int, frame_bytes: int) -> float:
    """What the learner's receiver runs: n messages in bursts of up to 64 through its
    wire.Gate; returns seconds from the first to the last."""
    perf, drain = time.perf_counter, gate.drain
    wait_ms = int(REPLY_TIMEOUT_S * 1000)
    first = drain(sock, 1, wait_ms)
    if len(first) != 1 or isinstance(first[0], Exception) or first[0][0].nbytes != frame_bytes:
        raise RuntimeError(f"zrl frame not accepted or of the wrong size: {first}")
    t0 = perf()
    got, rejected = 1, 0
    while got < n:
        burst = drain(sock, min(64, n - got), wait_ms)
        if not burst:
            raise RuntimeError(f"no message for {REPLY_TIMEOUT_S:.0f}s after {got} of {n}")
        for checked in burst:
            got += 1
            rejected += isinstance(checked, Exception)
        # Nothing kept once checked, as raw's loop keeps no frame: the messages of this
        # burst must not stay alive through the next one's wait (bench/TRANSPORT.md).
        del burst, checked
    dt = perf() - t0
    if rejected:
        raise RuntimeError(f"the gate rejected {rejected} of {n} zrl frames")
    return dt


def _sender_main(conn) -> None:
    ctx = zmq.Context()
    state: dict[str, Any] = {"socks": {}}

    def teardown():
        for s in state["socks"].values():
            s.close(0)
        state["socks"] = {}

    def frame_size(chunk: Chunk) -> int:
        rec = _recorder(_impala(chunk), chunk.K, Sender(0))
        rows = {name: 0 for name in ("final_index", "final_obs")}
        return len(rec.layout.allocate().finish(sender_id=0, seq=0, policy_version=0, rows=rows))

    def setup(chunk: Chunk, endpoints: dict[str, str], frame_bytes: int):
        teardown()
        for mode in MODES:
            s = _socket(ctx, zmq.PUSH, _hwm(frame_bytes), -1)
            state["socks"][mode] = s
            s.connect(endpoints[mode])
        pusher = Pusher(state["socks"]["zrl"])
        # The actor's Sender, sending through its link's pusher (actors.actor.LearnerLink).
        sender = Sender(0, link=types.SimpleNamespace(pusher=pusher, sender_id=0))
        rec = _recorder(_impala(chunk), chunk.K, sender)
        rec.msg.arrays["obs"][:] = 1  # (the recorder's arrays are zeroed; raw sends ones)
        state.update(
            pusher=pusher,
            recorder=rec,
            payload=b"\x01" * frame_bytes,
            ring=[bytes([1 + i % 255]) * frame_bytes for i in range(_hwm(frame_bytes) + 2)] if _fresh(frame_bytes) else [],
            copy_raw=frame_bytes < zmq.COPY_THRESHOLD,
        )
        return pusher.api is not None  # whether the C++ path sends

    def window(mode: str, n: int) -> None:
        if mode == FRESH:
            send, ring = state["socks"]["raw"].send, state["ring"]
            k, i = len(ring), state.get("next", 0)
            for _ in range(n):
                send(ring[i], copy=False)
                i = (i + 1) % k
            state["next"] = i
            return
        send = state["socks"][mode].send
        if mode == "raw":
            payload, copy = state["payload"], state["copy_raw"]
            for _ in range(n):
                send(payload, copy=copy)
            return
        end_chunk, sock = state["recorder"].end_chunk, state["pusher"].sock
        for _ in range(n):
            # What the IMPALA recorder does at each chunk boundary (its T steps written):
            # the sender's finish, which sends the frame if the queue has room, as an
            # actor's does, then the next chunk's bootstrap row, from the last.
            for frame in end_chunk():  # the queue was full: wait, as the actor's link does
                sock.send(frame, copy=False)

    _serve(conn, {"frame_size": frame_size, "setup": setup, "window": window, "teardown": teardown, "cpu": _thread_cpu},
           lambda: (teardown(), ctx.term()))


# ---------------------------------------------------------------------------
# The parent: starts both workers, runs the windows, always stops the workers.


class _Worker:
    def __init__(self, mp_ctx, target, name: str):
        self.name = name
        self.conn, child = mp_ctx.Pipe()
        self.proc = mp_ctx.Process(target=target, args=(child,), name=f"zrl-bench-{name}", daemon=True)
        self.proc.start()
        child.close()

    def send(self, *cmd) -> None:
        self.conn.send(cmd)

    def reply(self, timeout: float = REPLY_TIMEOUT_S) -> Any:
        if not self.conn.poll(timeout):
            raise RuntimeError(f"bench {self.name} gave no answer in {timeout:.0f}s")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"bench {self.name} failed:\n{value}")
        return value

    def call(self, *cmd) -> Any:
        self.send(*cmd)
        return self.reply()

    def stop(self) -> None:
        try:
            if self.proc.is_alive():
                self.conn.send(("exit",))
                self.proc.join(5)
        except (OSError, BrokenPipeError):
            pass
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


# The parts of the CPU a window is split into: each process's main thread and its others
# (ZeroMQ's I/O thread), in CPU seconds, and how often each slept (see _thread_cpu).
PARTS = ("sender main", "sender io", "receiver main", "receiver io")
SLEEPS = tuple(p + " sleeps" for p in PARTS)
BY_THREAD = "zrl - raw CPU us/msg: S main, S I/O, R main, R I/O"


def _cpu(receiver: _Worker, sender: _Worker) -> dict[str, float]:
    """CPU seconds (and sleeps) the two processes have used so far, by thread (PARTS, SLEEPS)."""
    r, s = receiver.call("cpu"), sender.call("cpu")
    return {**{"sender " + k: v for k, v in s.items()}, **{"receiver " + k: v for k, v in r.items()}}


def _window(receiver: _Worker, sender: _Worker, mode: str, n: int) -> tuple[float, dict[str, float]]:
    """Messages per second over one window of n messages (timed at the receiver), and the CPU
    (us) and sleeps per message that each thread of both processes spent on it (PARTS, SLEEPS)."""
    cpu0 = _cpu(receiver, sender)
    receiver.send("window", mode, n)
    sender.send("window", mode, n)
    sender.reply()
    dt = receiver.reply()
    cpu1 = _cpu(receiver, sender)
    per_msg = {k: (cpu1[k] - cpu0[k]) / n * (1e6 if k in PARTS else 1) for k in PARTS + SLEEPS}
    return (n - 1) / max(dt, 1e-9), per_msg


def _measure(receiver: _Worker, sender: _Worker, frame_bytes: int, rounds: int, window_s: float, warmup_s: float):
    """Per mode: the per-window msg/s and CPU us per message, after a warm-up that sizes the windows."""
    modes = MODES + (FRESH,) if _fresh(frame_bytes) else MODES
    n = {}
    for mode in modes:
        rate, _ = _window(receiver, sender, mode, FIRST_WINDOW_MSGS)
        rate, _ = _window(receiver, sender, mode, max(16, int(rate * warmup_s)))
        n[mode] = max(16, int(rate * window_s))
    rates: dict[str, list[float]] = {m: [] for m in modes}
    cpu_us: dict[str, list[float]] = {m: [] for m in modes}
    threads: dict[str, dict[str, list[float]]] = {m: {k: [] for k in PARTS + SLEEPS} for m in modes}
    for r in range(rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            rate, parts = _window(receiver, sender, mode, n[mode])
            rates[mode].append(rate)
            cpu_us[mode].append(sum(parts[k] for k in PARTS))  # both processes, all their threads
            for k, v in parts.items():
                threads[mode][k].append(v)
    return rates, cpu_us, threads, n


def _add_row(result: BenchResult, samples: dict, below: list, transport: str, chunk: Chunk, frame_bytes: int,
             rates: dict, cpu_us: dict, threads: dict, sizes) -> None:
    """One (transport, chunk) row of the table, its windows in `samples`, and a note in `below`
    when under the target."""
    zrl, raw = statistics.median(rates["zrl"]), statistics.median(rates["raw"])
    zrl_cpu, raw_cpu = statistics.median(cpu_us["zrl"]), statistics.median(cpu_us["raw"])
    lo, hi = ratio_interval(rates["zrl"], rates["raw"])
    if zrl < TARGET_RATIO * raw:
        below.append(f"{transport}/{chunk.name} {zrl / raw:.3f} (95% CI {lo:.2f}-{hi:.2f}"
                     + (", wholly below)" if hi < TARGET_RATIO else ")"))
    fresh = statistics.median(rates[FRESH]) if FRESH in rates else None
    medians = {m: {k: statistics.median(v) for k, v in parts.items()} for m, parts in threads.items()}
    extra_cpu = ", ".join(f"{medians['zrl'][k] - medians['raw'][k]:+.2f}" for k in PARTS)
    result.add(
        transport=transport,
        chunk=chunk.name,
        **{
            "bytes/msg": frame_bytes,
            "zrl msg/s": zrl,
            "raw msg/s": raw,
            "zrl GB/s": zrl * frame_bytes / 1e9,
            "raw GB/s": raw * frame_bytes / 1e9,
        },
        ratio=zrl / raw,
        **{"ratio 95% CI": f"{lo:.2f}-{hi:.2f}"},
        **{"zrl CPU us/msg": zrl_cpu, "raw CPU us/msg": raw_cpu, "CPU ratio": raw_cpu / zrl_cpu,
           BY_THREAD: extra_cpu},
        **({"raw fresh msg/s": fresh, "ratio to fresh": zrl / fresh} if fresh else {"raw fresh msg/s": "-", "ratio to fresh": "-"}),
    )
    samples[f"{transport}/{chunk.name}"] = {
        "msg_per_s": rates, "ratio_ci95": [lo, hi], "cpu_us_per_msg": cpu_us,
        "by_thread_per_msg": medians, "window_msgs": sizes, "hwm": _hwm(frame_bytes), "zrl_env_steps_per_s": zrl * chunk.T * chunk.K,
    }


def _method_notes(rounds: int, window_s: float, native_used: bool, native_note: str, chunks) -> list[str]:
    """The notes that say how the table was measured."""
    senders = ("one C++ call (header stamp + zmq_send): copied below 64 KiB, zero-copy from a C++-owned SendBuffer above"
               if native_used else "OutMessage.finish + pyzmq send(copy=False) (C++ path unavailable: " + native_note + ")")
    receivers = ("C++ waits for each burst's first message in a blocking receive (a message that was waited for is "
                 "its burst alone), takes the burst from libzmq and runs the FrameGate on known layouts, without the "
                 "GIL, then makes each vouched frame's wire.Message in C++, with no Python per message "
                 f"({native_note})" if native_used
                 else "pyzmq poll, recv(copy=False) + Gate.check (C++ path unavailable: " + native_note + ")")
    return [
        f"Target: ratio (zrl msg/s / raw msg/s) >= {TARGET_RATIO}. Medians of {rounds} windows of ~{window_s} s per side, "
        "zrl and raw alternating (order flipped each round), after warm-up windows; timed at the receiver, first to last message.",
        "ratio 95% CI: a bootstrap interval of the ratio of medians (each side's windows resampled on their own, 2000 "
        "times, seed 0): how far this run's noise leaves the ratio uncertain.",
        "CPU us/msg: the CPU time both processes (their ZeroMQ I/O threads included) used over a window, per message; "
        "medians of the same windows. CPU ratio = raw / zrl: the share of raw's throughput zrl would keep where the "
        "CPU is the limit, as it is with 4 busy threads on 2 cores.",
        f"{BY_THREAD}: where zrl's CPU per message differs from raw's, by thread: the sender's (S) and the "
        "receiver's (R) main thread, and each process's other threads (ZeroMQ's I/O thread; the rest are idle); "
        "medians of the same windows, from /proc/self/task. The JSON has each thread's CPU and sleeps (voluntary "
        "context switches) per message for every side.",
        "zrl sender: the IMPALA recorder's end_chunk (M = 0 truncated rows): the actor's Sender.finish through its "
        "transport.Pusher (" + senders + "), then the next chunk's bootstrap row obs[0] = obs[T], in the same frame "
        "when it went out copied, else in a fresh one from the recorder's wire.Layout. Filling the T steps is the env "
        "loop's work and is not counted.",
        "zrl receiver: the learner's wire.Gate (TRAJECTORY/STATS allowed, cap learner.max_message_bytes, Impala's schema "
        "and the checks its gate makes: final_index's range and marks; finite floats and the action and flag ranges "
        "are checked by the learner's batch join as it copies each element, the schema's at_join fields, so the receiver "
        "reads only final_index and the truncation flags that its marks compare) draining bursts of up to 64: " + receivers + "; each burst is dropped once checked, as raw "
        "drops each frame.",
        "raw: a preallocated bytes payload of the zrl frame's length, send(copy=False) from 64 KiB up (pyzmq's copy "
        "threshold), default copy below; recv(copy=False) only.",
        "raw fresh (frames from 64 KiB up; informative, the target is against raw): raw, but each message from the next "
        "of a ring of HWM + 2 payloads, so that its bytes are as cold in the caches as a new message's, as zrl's are: "
        "ZeroMQ holds a frame until it is sent, so the recorder cycles through as many frames as the queue holds. "
        "raw's one payload stays in the caches. ratio to fresh = zrl msg/s / raw fresh msg/s.",
        "Sender and receiver are separate spawned processes; tcp://127.0.0.1 (port chosen by the OS) or ipc:// in a "
        f"temporary directory; SNDHWM = RCVHWM = {HWM_BYTES >> 20} MiB of messages clamped to [8, 1000], identical for zrl and raw.",
        "Chunks: " + "; ".join(f"{c.name}: {c.what}, obs {c.obs_dtype}[{c.T + 1}, {c.K}, {', '.join(map(str, c.obs_shape))}]" for c in chunks)
        + "; every chunk also carries action int64, reward/behaviour_logp float32, terminated/truncated bool [T, K], "
        "final_index int32[0], final_obs [0, *obs].",
    ]


def run(opts: BenchOptions) -> BenchResult:
    result = BenchResult(
        name="transport",
        title="Transport: IMPALA trajectory chunks through zrl vs raw pyzmq PUSH/PULL (same bytes per message)",
        columns=["transport", "chunk", "bytes/msg", "zrl msg/s", "raw msg/s", "zrl GB/s", "raw GB/s", "ratio",
                 "ratio 95% CI", "zrl CPU us/msg", "raw CPU us/msg", "CPU ratio", BY_THREAD, "raw fresh msg/s",
                 "ratio to fresh"],
    )
    # Many short windows: on a shared 2-vCPU VM one window's rate varies by 8 to 20% (its
    # coefficient of variation) whether it lasts 0.125, 0.25 or 0.5 s, so a row's precision
    # comes from the number of windows. With 15 a side a row's 95% interval was +-0.05 to
    # +-0.1; with 50, +-0.03 to +-0.09 (bench/TRANSPORT.md).
    rounds = 2 if opts.quick else max(ROUNDS_PER_REPEAT * opts.repeats, 3)
    window_s = QUICK_WINDOW_S if opts.quick else WINDOW_S
    warmup_s = QUICK_WARMUP_S if opts.quick else WARMUP_S
    chunks = CHUNKS
    mp_ctx = mp.get_context("spawn")
    workers: list[_Worker] = []
    samples: dict[str, Any] = {}
    below: list[str] = []  # the rows under the target, for the last note
    try:
        receiver = _Worker(mp_ctx, _receiver_main, "receiver")
        workers.append(receiver)
        sender = _Worker(mp_ctx, _sender_main, "sender")
        workers.append(sender)
        with tempfile.TemporaryDirectory(prefix="zrl-bench-") as tmp:
            for transport in TRANSPORTS:
                for chunk in chunks:
                    frame_bytes = sender.call("frame_size", chunk)
                    ipc_dir = os.path.join(tmp, f"{transport}-{chunk.T}x{chunk.K}")
                    os.makedirs(ipc_dir, exist_ok=True)
                    endpoints, native_note = receiver.call("setup", chunk, transport, ipc_dir, frame_bytes)
                    native_used = sender.call("setup", chunk, endpoints, frame_bytes)
                    rates, cpu_us, threads, sizes = _measure(receiver, sender, frame_bytes, rounds, window_s, warmup_s)
                    sender.call("teardown")
                    receiver.call("teardown")
                    _add_row(result, samples, below, transport, chunk, frame_bytes, rates, cpu_us, threads, sizes)
    finally:
        for w in reversed(workers):
            w.stop()
    result.extra["windows"] = samples
    result.extra["native"] = native_note
    result.notes += _method_notes(rounds, window_s, native_used, native_note, chunks)
    steps = min(samples.items(), key=lambda kv: kv[1]["zrl_env_steps_per_s"])
    result.notes.append(
        f"A message carries T x K env steps; the fewest zrl carried here were {steps[1]['zrl_env_steps_per_s'] / 1e6:.2f} M env steps/s ({steps[0]})."
    )
    result.notes.append(f"Rows under the target of {TARGET_RATIO}: " + ("; ".join(below) if below else "none") + ".")
    if opts.quick:
        result.notes.append(f"QUICK run: {rounds} windows of {window_s} s; a smoke test, not a measurement.")
    return result
