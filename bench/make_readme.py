#!/usr/bin/env python3
"""Rebuilds bench/README.md: the definition of every benchmark and its latest table.

    zrl bench all --out bench/out && python bench/make_readme.py

(`zrl bench all` runs the learning benchmark's CartPole task; its other tasks run with
`zrl bench learning --task NAME`: RUN_COMMANDS.)

Each section is the text below followed by bench/out/NAME.md as `zrl bench`
wrote it (machine, date, table, notes). A benchmark with no output yet says so.
"""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"

INTRO = """# zrl benchmarks

`zrl bench NAME --out DIR` runs one benchmark (`zrl bench all` runs every
one), prints each row of its table as soon as it is measured, and writes
`DIR/NAME.json` and `DIR/NAME.md`; `--quick` is a smoke test
with small sizes, not a measurement; `--seconds` sets the length of the
one-run benchmarks (`pong`, `soak`; 600 s by default). Every benchmark runs the reference it is
judged against **in the same run**, reports medians of several timed repeats
after a warm-up, and states the machine, because the machines here are
shared and noisy: only ratios taken side by side mean anything. Speed targets
live here, never in the test suite. This page is rebuilt from the latest
outputs by `python bench/make_readme.py`. A benchmark that starts `zrl run`
runs it in a process group of its own. Stopping `zrl bench` with Ctrl-C or
SIGTERM stops that group the way Ctrl-C stops a run (SIGINT, then SIGKILL
after a minute) and removes its temporary directory.

The tables below were measured on the development machine: 2 vCPUs (AMD EPYC,
x86-64: some sessions had one with AVX-512, VNNI and BF16, later ones one
with AVX2 only, and 11-26 a slower one with AVX-512, VNNI and BF16 (Zen 4);
stamps from late 11-24 on name the SIMD level, older ones do not),
24 GiB, Debian 12, Python 3.11, torch 2.13.0 CPU build, no GPU, shared with
other jobs. Longer analyses: [REPLAY.md](REPLAY.md) (how the replay gets its
speed), [TRANSPORT.md](TRANSPORT.md) (where transport time goes, and the
changes it led to), [PIPELINE.md](PIPELINE.md) (what moved the Pong
actor's rate, and what did not) and [SERVER.md](SERVER.md) (the agent
server's request path against its targets, run by run). [REDESIGN.md](REDESIGN.md) has every
benchmark before and after the package redesign of 11-27, side by side.
"""

SECTIONS = [
    ("kernels", """## kernels: V-trace

V-trace through `zrl.learner.vtrace.from_importance_weights` (numpy float32
inputs, argument checks included, the C++ kernel underneath) against the same
formula as the reverse-scan loop of TorchBeast's `vtrace.py` in PyTorch (CPU
tensors, 1 thread) and as a numpy loop. All three agree to 1e-4 before
timing. `zrl_GB/s` counts the bytes the kernel must touch. Target (issue 2):
at least 50x the PyTorch loop at (T, B) = (80, 32)."""),
    ("replay", """## replay: prioritised replay against cpprb

zrl's C++ `PrioritizedReplay` (16-ary sum tree with per-group prefix sums,
lock-step descents with prefetching, one pass for the gather) against cpprb
11's `PrioritizedReplayBuffer` and a vectorised numpy sum tree, buffers full,
alpha 0.6, beta 0.4. cycle = `sample(512)` + `update_priorities(512)` with
fresh random priorities every call (cpprb skips unchanged ones otherwise);
add = batches of 256 into a full, wrapping buffer. cartpole: capacity 1M of
obs float32[4] transitions; atari: capacity 100k of single 84x84 uint8 frames
(obs and next_obs; 4-frame stacks would need 5.6 GB per implementation).
Targets (issue 3): the cycle at least 5x cpprb (10x the aim), add at least
equal."""),
    ("transport", """## transport: trajectory messages against raw pyzmq

Two processes (an actor-side sender and a learner-side receiver) over tcp and
ipc. zrl: the IMPALA recorder's `end_chunk`. Below 64 KiB its usual case is
one C++ call, which stamps the header, hands pyzmq's own libzmq a copy of
the frame, and then writes the next chunk's bootstrap row into the same
frame. Larger frames go through the actor's `Sender.finish` and
`transport.Pusher`, without a copy, and the next chunk starts in another
frame. The receiver does what the learner does before batching:
`wire.Gate.drain` takes bursts from libzmq in C++ and checks them. The
first frame of a layout gets the IMPALA schema and the gate's value checks
in Python, the rest get the C++ FrameGate. Since 11-27 (evening) the
learner's gate leaves the rules on each element of the arrays it joins into
a batch (finite floats, the action and flag ranges) to that join, which
checks each element as it copies it at the cost of numpy's join, so the
receiver reads only final_index and the truncation flags its marks
compare. Each burst is dropped once checked. raw: a preallocated payload of
the zrl frame's length, `send`/`recv(copy=False)` only. Chunks: CartPole
T=20 x K=2 (the "2 KB" class), the default config's T=20 x K=32, and an
Atari chunk of 20 observations of 4x84x84 uint8 (565 KB). Target (issue 5):
at least 0.9 of raw.

**Since the values are read once, by the learner's batch join, every row
reached 0.9 in six of seven runs, and the seventh had one row at 0.898
(2 KB over tcp, interval 0.86-0.99). 23 KB over ipc, the row that fell
short most often, went from a median of 0.90 over 13 runs to 0.92-0.98
(median 0.96).**
Each row is the median of 50 windows of 0.25 s a side (10 per
`--repeats`), and `ratio 95% CI` is a bootstrap interval for its ratio, so
a row's distance from 0.9 can be read against that run's noise. One
window's rate varies by 8-20% on these shared 2-vCPU machines (an AMD EPYC
with AVX-512, Zen 4). Runs of 11-27 with 50 windows a side (tcp / ipc, at
2 KB, 23 KB and Atari; end times in UTC); the table below is the 15:08
run:

| time (UTC) | code | tcp | ipc |
| --- | --- | --- | --- |
| 10:16 | gate reads the values | 0.97, 0.98, 1.01 | 0.94, 0.92, 0.89 |
| 10:23 | | 0.96, 0.97, 0.96 | 0.90, 0.89, 0.98 |
| 10:26 | | 0.96, 0.95, 1.13 | 0.95, 0.90, 1.00 |
| 10:29 | | 0.96, 0.96, 1.00 | 0.92, 0.87, 1.03 |
| 11:31 | | 0.93, 0.96, 0.96 | 0.92, 0.89, 0.96 |
| 11:41 | | 1.00, 0.93, 0.96 | 0.95, 0.94, 0.99 |
| 11:44 | | 0.95, 0.96, 0.95 | 0.93, 0.91, 0.98 |
| 12:02 | | 0.887, 0.91, 0.894 | 0.93, 0.90, 0.94 |
| 12:05 | | 1.00, 0.94, 0.99 | 0.94, 0.897, 0.95 |
| 12:08 | | 0.95, 0.92, 0.93 | 0.95, 0.92, 0.99 |
| 12:50 | | 0.887, 1.00, 1.00 | 0.94, 0.903, 0.97 |
| 13:52 | | 0.99, 0.955, 1.02 | 0.913, 0.888, 0.801 |
| 13:55 | | 0.904, 1.00, 0.984 | 0.928, 0.898, 0.974 |
| 14:56 | the join checks them | 0.965, 0.985, 1.06 | 0.962, 0.962, 0.936 |
| 14:59 | | 0.898, 0.945, 0.929 | 0.934, 0.977, 0.937 |
| 15:02 | | 0.950, 0.948, 1.04 | 0.945, 0.930, 0.972 |
| 15:08 | | 1.00, 0.974, 0.966 | 0.949, 0.956, 1.005 |
| 15:25 | | 0.982, 0.998, 1.02 | 0.949, 0.968, 0.986 |
| 15:28 | | 0.956, 0.953, 1.04 | 0.912, 0.962, 0.993 |
| 15:31 | | 0.941, 0.980, 0.989 | 0.921, 0.923, 0.973 |

What moved it, and what is left (TRANSPORT.md, last sections):
- **At 23 KB, reading the values.** The gate read every float (no NaN or
  infinity) and every action and flag (in range) on the core that did not
  receive them, and the learner read them all again when it joined the
  chunks. Now the join alone reads them: `_core.join_checked` checks each
  element as it copies it, a chunk that fails is counted and dropped there
  (`bad_value`), and the chunks taken with it make the next batch. In 8
  alternating pairs of one-row runs the row went from a median of 0.889 to
  0.960 (higher in 7 of 8); the receiver's main thread now costs +0.4 to
  +0.9 µs a message over raw's (was +1.0 to +2.1).
- **For Atari over ipc, a cold frame.** ZeroMQ holds a frame until it is
  sent, so the recorder cycles through as many frames as the queue holds
  (29 of 565 KB), and the frame sent has left the caches. raw sends one
  payload, which never leaves them. The informative `raw fresh` column
  sends from a ring of payloads instead, each as cold as a new message.
  In a noisy phase this row fell to 0.80 (13:52, followed three minutes
  later by 0.974); in the seven runs since the change it gave 0.94-1.01.
- **On a shared 2-vCPU machine any row can land under 0.9 in one run**: the
  2 KB tcp row, whose frames hold 160 floats and whose threads are within
  0.33 µs of raw's, gave 0.898 at 14:59.

The columns `zrl CPU us/msg`, `raw CPU us/msg` and `CPU ratio` (raw / zrl)
give the CPU time both processes spent per message, their I/O threads
included. On 2 shared cores the throughput ratio follows the CPU ratio.
The next column splits zrl's extra CPU per message by thread: the sender's
and the receiver's main thread (S main, R main) and their ZeroMQ I/O
threads. Two receivers tried before the change were not kept: a nap after a
burst that emptied the socket raised 23 KB to 1.02-1.09 but cost Atari
6-30%, and would gather nothing at a learner's rates; and a prefetch of the
checked lines changed nothing.
Details: [TRANSPORT.md](TRANSPORT.md)."""),
    ("client", """## client: agent-server round trips

C++ clients (`client_bench`, one process each) against `zrl serve` doing
inference only (no learner), 1/8/32/64 clients; beside them, in the same run,
the same processes doing raw ZeroMQ DEALER round trips of the same request
size against a C++ echo ROUTER (`zmq_echo`). 256 and 1,024 clients: 4
`client_load` processes holding the sessions, each session stepping as a
simulator at 10,240/n Hz. Latency percentiles over every timed round trip;
steps/s over all clients. With more clients than cores, latency includes
waiting for a CPU. Targets (issue 47): 1 client p50 at most 2x raw; 8 to 64
clients at least 0.7 of raw's steps/s; 32 clients p99 under 5 ms; 1,024
sessions p99 under 50 ms with none refused."""),
    ("pipeline", """## pipeline: the whole pipeline against its ceilings

raw env: the actor's vector env alone, random actions (the ceiling).
actor -> sink: one real `zrl actor` against a learner that receives and
discards (target on Atari: at least 0.8 of raw). zrl run: learner + n actors
training (rates from the learner's first batch on), the learner's share of
time waiting for data, policy lag in updates. learner update: zrl's step from
wire messages (the learner's `wire.Gate` checks, counted in line though its
receiver thread runs them; collate; then the learner's own `Algorithm.update`:
loss with the C++ V-trace, backward, clip, the non-finite gradient guard,
step; weights written into a frame) against a plain PyTorch loop on the
same batch already in tensors (target: at most 1.10).

**Where it stands.** The table is from 11-27 (15:20 UTC), on the same AMD
EPYC with AVX-512, VNNI and BF16 (Zen 4) as on 11-26, in its faster mode
(the raw Pong env at 5,754 steps/s, CartPole at 135k; at 08:31 that day
4,307 and 103k). Its code has the learner's batch join checking the values
the gate used to read (see transport), and the day's three changes to the
actor's own CPU (PIPELINE.md, "the actor's own CPU, cut by a third"):
- the int8 kernel reads its weights in blocks of 16 outputs (Pong's FC
  inside the actor went from ~175-300 to ~75-90 µs per call);
- act() runs no torch op around the int8 torso;
- the episode statistics are kept in Python lists.

It also includes the one-call chunk boundary of small frames (see
transport). The actor thread's CPU per env step went from ~99-125 µs to
~53-73 µs. Two older tables are kept below: 11-26 (17:12 UTC) and the
AVX2-only CPU of 11-25. With the shipped Pong config (24 envs, the policy
acting on the first 8 ready, `actor.int8_torso: auto`):
- **Pong actor -> sink: 0.882 of the raw env** (target 0.8). Its five
  bracketed runs gave 0.874-0.965, all five above 0.8.
  - Earlier the same day: 0.882 at 08:31 (runs 0.860-0.981) and 0.939 at
    07:03 (runs 0.863-1.085). Before the actor's changes: 0.771 (runs
    0.754-0.868). On 11-26, three tables gave 0.839, 0.858 and 0.885.
  - Single runs spread widely here: alternating runs of the code before and
    after the FC change gave 0.80-0.93 on both sides. So the figure is the
    table's median, not any one run.
  - The actor's CPU per env step, apart from its emulator threads, is the
    steadier figure: 52.8 µs here (72.5 at 08:31, in the slower mode), with
    the emulator threads at ~316 (~390).
  - With a core of its own for the policy (the row "emulator on 1 core"),
    the actor runs at the emulator's speed: 1.05 (runs 1.03-1.06).
- On the AVX2-only CPU of 11-25 (its table is kept below, from before these
  changes) the same row gave 0.82 (runs 0.782-0.907), and single runs since
  11-24 0.76-0.98 there; the changes above have not been run there. On 2
  cores the emulator threads alone keep both cores busy (~320-470 µs of CPU
  per env step here, depending on the machine's mode, ~500-700 there), so
  every µs the actor's own thread spends acting (~60-80 µs per env step here
  now, ~105 there: the int8 CNN and Python) is taken from them, and the raw
  env's rate drifts by tens of percent within minutes. Each ratio is therefore a
  median of actor runs bracketed by raw runs.
- Learner update against a plain PyTorch loop on the same batch: 1.03 for
  Pong and 1.06 for CartPole (target at most 1.10). Earlier tables: 1.05 /
  1.05 at 08:31, 1.07 / 1.04 at 07:03, 1.06 / 1.05 on 11-26, and 0.82-1.09
  across all tables.
- `zrl run` with 2 Pong actors: 3,172 env steps/s in this table. Earlier:
  2,872 at 08:31 and 2,542 at 07:03 (the slower mode), ~3,000-3,100 on
  11-26, ~2,100 on the AVX2 CPU (its table is kept below; 1,600-1,900 in its
  earlier tables). The learner waits for data 9% of its time, so on 2 cores
  the CPU learner, not the actors, sets the pace. CartPole's rows have no
  target.
- On a GPU (an H100, 11-26: no table here, the bench's CUDA rows need one):
  the CUDA path copies batches through pinned memory, non-blocking, and makes
  no synchronising call in the update beyond V-trace's round trip (checked by
  PyTorch's sync debug mode in the suite). zrl's update against the plain
  loop: 1.02 for the deep net at 32 columns and 1.12 at 8, 1.19-1.29 for the small nets,
  where its CPU work per update shows; batches made on a prefetch thread (now
  the default on a GPU) took Pong's shallow net at 32 columns from 1.93 to
  1.29. Figures and runs: PIPELINE.md, "the learner on a GPU".

What moved the ratio and what did not (int8 CNN kernels, acting on the first
envs ready, emulator threads that give way, channels-last, C++ sampling),
each with its A/B runs: [PIPELINE.md](PIPELINE.md)."""),
    ("pipeline_1126", """## pipeline on 11-26 (kept)

The same benchmark on the same machine the day before (17:12 UTC), with the
weights published through `WeightsFrames` and the learner's receiver
waiting inside `Gate.drain`, before its messages were made in C++."""),
    ("pipeline_avx2", """## pipeline on an AVX2-only CPU (kept)

The same benchmark on an AMD EPYC with AVX2 alone (no AVX-512, VNNI or BF16;
11-25, 05:22 UTC), with that day's code: the learner's gate refusing NaN and
infinite floats, the learner-update row timing the learner's own
`update_step` (now `Algorithm.update`). There the int8 torso runs in zrl's AVX2 kernel and the
learner in fp32."""),
    ("learning", """## learning: time to solve CartPole-v1

Wall time from the command's start (process start-up included) and env steps
until the mean return of the last 100 episodes reaches 475, for each shipped
CartPole config, seeds 1-3, beside Stable-Baselines3 PPO with
rl-baselines3-zoo's CartPole-v1 hyper-parameters in the same run. Ape-X
counts a greedy evaluation actor's episodes. Issue 2's aim: under 10 s
including start-up.

`zrl bench learning` is this task (`--task cartpole`, the default); the
other tasks follow, each in a sitting of its own (`--task NAME`; `--seeds
1,2,3` sets the seeds). In a sitting every system runs seed 1, then every
system seed 2, and so on. A config that does not exist yet, does not load,
or trains another env is skipped with a note, and so is a task whose env
needs an extra that is not installed (`pip install -e .[box2d]`,
`.[mujoco]`). The targets of the newer configs, judged in the `met`
column (`ratio`: the row's median time over the reference's):
- `cartpole_ppo`: every seed faster than `cartpole_impala` in the same
  sitting, and a median at most 0.4 of SB3 PPO's;
- `cartpole_appo`: every seed within 60 s; `cartpole_a3c`: within 90 s
  (beside `cartpole_impala`).

The table at the end of this section is a run of 11-27 at 21:58 UTC, while
the machine was in a very slow phase (SB3 took 39.7-57.7 s, against 15.4-21.4
at 13:08 the same day and 10.4 on 11-24): `cartpole_impala` took a median of
16.45 s against SB3's 49.1 s in the same run, 0.34 of SB3's time (0.40 at
13:08, 7.82 s against 19.7; 0.47 on 11-24, 4.92 s against 10.38 s).
PPO took 0.49 of SB3's time on 191k env steps (SB3: 69.5k): it is
synchronous, so its actors wait while it trains (about four fifths of a
rollout's wall time on this machine, 12 minibatch steps of about 5 ms), and
the 100-episode window needs about 50k steps of a solved policy either way.
Its two targets (0.4 of SB3, faster than IMPALA on each seed) are not met.
APPO (17-20 s) and A3C (11-14 s) met theirs.

**The curves** (learning.png below, drawn since 11-27: each seed's mean
return against seconds from its start and against env steps) show what the
table cannot:
- zrl needs 8-11 times SB3's env steps (medians 535k for IMPALA and 797k for
  Ape-X against 69.5k) and still finishes first with IMPALA, as its actors
  step 64 envs at once.
- IMPALA's return rises to 200-330 in its first 1-3 s of episodes, falls
  back to 60-85, stays low for 1-3 s, then climbs to 475 in 0.5-1.5 s, in
  all three seeds. In a sweep of 10 seeds (500-509, `zrl run` with the curve
  logged every 0.5 s, variants alternating seed by seed) the shipped config
  fell by more than 100 points in 8 of 10 runs (median fall 174) and reached
  475 in a median of 7.88 s. `learner.learning_rate=0.0005` (10.86 s, 9 of
  10 fell), `algo.entropy_cost=0.01` (8.24 s, 10 of 10) and
  `learner.batch_size=128` (11.15 s, 10 of 10) kept the fall and were
  slower (11-27, 13:10-13:20 UTC). Ten more seeds (510-519) tried three
  more: `algo.baseline_cost=1.0` (8.55 s, 9 of 10 fell),
  `learner.max_grad_norm=2.0` (9.39 s, 10 of 10) and
  `algo.normalize_advantages=false` (7.29 s, 7 of 10), against 8.68 s
  (7 of 10) for the shipped config. So the fall, 1-3 s of most runs, stays:
  none of these settings removes it. In the TensorBoard log of one such run
  (seed 501) each fall came with a jump of the baseline loss (0.4-0.8 to
  1.3-2.7) and of the gradient norm (1.5 to 4-5.6, clipped at 0.5), while
  the policy lag stayed at 1.3-2.4 versions: the value net falling behind
  returns that grew faster than it could follow.
- Without advantage normalization the shipped config may be a little
  faster now that rewards are scaled (it lost 11 of 23 runs before the
  scale, in the table below). Over 90 seeds (510-599), each run with and
  without it: 7.65 s against 8.11 s at the median, faster in 61 of 90 pairs
  (a sign test's p = 0.001), slowest 11.6 s against 11.0. But 40 of those
  pairs always ran the shipped config first; in the 50 whose order was
  reversed or alternated it was faster in 32 (p = 0.065), by 0.19 s at the
  median. So the gain is at most a few percent, and normalizing keeps the
  policy's step independent of the reward scale a user picks: the config
  keeps it.
- At zrl's rate the last 100 episodes span well under a second of play, so
  its curve follows the policy closely; SB3's 8 envs average over longer.
- Ape-X's greedy evaluation actor climbs slowly: past 100 at 8-12 s, 150-280
  at 20-24 s, then 475 at 32-39 s.

**With `algo.reward_scale: 0.1` (shipped since 11-24) `cartpole_impala`
reached the target in all of 39 seeds, none slower than 6.4 s** (on 11-24).
Until then single runs on 2 cores took
4-30 s and some stalled. 61 more seeds of the shipped config (700-760, one
after another) all reached it too: median 4.95 s, slowest 7.6 s. In 39 seeds
each (500-538, variants alternating seed by seed, each run capped at 25 s):

| `cartpole_impala` with | reached | over 10 s | median s | slowest s |
| --- | ---: | ---: | ---: | ---: |
| `algo.reward_scale: 0.1` (shipped now) | 39/39 | 0 | 4.58 | 6.38 |
| `algo.reward_scale: 0.01` | 39/39 | 0 | 5.31 | 8.36 |
| no reward scale (shipped before) | 38/39 | 5 | 4.84 | 19.9, and one collapse |

Why: at a discount of 0.995 returns reach ~180. Adam moves each weight by
about the learning rate per update, so a value net whose outputs must grow to
the hundreds needs thousands of updates to get there, while the policy moves
on the advantages it gives. In the stalls' TensorBoard logs the value loss
climbs to 200-270 (an error of ~15-20 in the value) while the return falls
from ~300 back to 100-170 and stays there. Scaled by 0.1 the values stay under
~18. The advantages are normalized per batch, so the scale leaves the policy
gradient alone. Episode returns in logs, and the stop target, stay unscaled.
Ape-X has the same knob (it scales the n-step rewards in the TD targets and
the actors' initial priorities), but 0.1 did not help `cartpole_apex`
(seeds 600-605, alternating): 15.0-21.8 s in 6 runs without; 16.7-36.7 s in 4
runs with, and a fifth short of 475 at 40 s. Its config stays unscaled.

Settings tried before that one, which did not remove the stalls (11-24;
seeds 100-360, capped at 25 s, alternating; "failed": no 475 by then):

| variant (no reward scale) | runs | failed | over 10 s | median s |
| --- | ---: | ---: | ---: | ---: |
| as shipped then | 63 | 4 | 17 | 5.7 |
| `algo.discount=0.99` (0.995 shipped) | 39 | 2 | 7 | 5.3 |
| `learner.lr_final_scale=1.0` (no decay) | 19 | 1 | 3 | 5.5 |
| `learner.max_grad_norm=40` (0.5) | 23 | 1 | 4 | 5.5 |
| `algo.entropy_cost=0.01` (0) | 23 | 2 | 3 | 5.4 |
| `algo.baseline_cost=0.25` (0.5) | 22 | 1 | 3 | 5.6 |
| `learner.learning_rate=0.0005` (0.001) | 20 | 6 | 9 | 9.4 |
| `algo.normalize_advantages=false` | 23 | 11 | 13 | over 25 |

A lower learning rate was clearly worse and a smaller discount a little
better, both as the value-scale account predicts. Failures took two forms:
stalls (the return peaks early, then falls to 100-170 and climbs back slowly)
and, about one run in 30-50, a collapse to a deterministic policy with a
return of 9 that never recovers. The test suite's learning test (400 within
300 s) survived stalls but not a collapse; it failed once in local runs,
never in CI."""),
    ("learning_pendulum", """## learning: time to a mean return of -200 on Pendulum-v1

`zrl bench learning --task pendulum`: as for CartPole, the wall time from
the command's start and env steps until the mean return of the last 20
training episodes reaches -200, seeds 1-3, for `configs/pendulum_sac.yaml`
beside Stable-Baselines3 SAC with rl-baselines3-zoo's Pendulum-v1 settings
(learning rate 1e-3, SB3's defaults otherwise), which stops at the same rule
and may run past the zoo's 20k steps. Target: a median at most 0.7 of SB3
SAC's (`ratio`)."""),
    ("learning_lunarlander", """## learning: time to a mean return of 200 on LunarLander-v3

`zrl bench learning --task lunarlander` (needs `pip install -e .[box2d]`):
the time until the mean return of the last 100 training episodes reaches
200, seeds 1-3, for `configs/lunarlander_ppo.yaml`, beside Stable-Baselines3
PPO with rl-baselines3-zoo's LunarLander-v3 settings (16 envs, n_steps 1024,
batch 64, 4 epochs, gamma 0.999, GAE 0.98, entropy 0.01; it also stops at
the zoo's 1M steps). Each run is capped at 30 minutes. Target: every seed
within 10 minutes.

The bench has not had a sitting yet (the reference's 1M steps take most of
an hour per seed here). zrl alone, `zrl run --config
configs/lunarlander_ppo.yaml --seed S` on 11-27 (AVX2 EPYC, 2 vCPUs; seeds 2
and 3 beside a test-suite run): 194 s (1.26M env steps), 309 s (1.61M) and
221 s (0.83M) to the 100-episode mean of 200, every seed within the 10
minutes."""),
    ("learning_acrobot", """## learning: time to a mean return of -100 on Acrobot-v1

`zrl bench learning --task acrobot`: the wall time from the command's start
and env steps until the mean return of the last 100 training episodes
reaches -100 (rl-baselines3-zoo's threshold), seeds 1-3, for
`configs/acrobot_impala.yaml` beside Stable-Baselines3 PPO with
rl-baselines3-zoo's Acrobot-v1 settings (16 envs under VecNormalize,
n_steps 256, GAE 0.94, 4 epochs; it also stops at the zoo's 1M steps). No
target: the row records the shipped config's result."""),
    ("learning_halfcheetah", """## learning: HalfCheetah after 15 minutes

`zrl bench learning --task halfcheetah` (needs `pip install -e .[mujoco]`):
`configs/halfcheetah_sac.yaml` and Stable-Baselines3 SAC with
rl-baselines3-zoo's HalfCheetah settings (learning_starts 10k, SB3's
defaults otherwise) each train for 15 minutes on HalfCheetah-v5, seeds 1
and 2, one run after another on the same machine, then play 5 greedy
episodes (zrl: `zrl eval` of the last checkpoint, SB3: `predict(...,
deterministic=True)`). The table gives their mean returns side by side."""),
    ("atari_pong", """## atari_pong: Pong learned per minute, beside SB3 PPO

`zrl bench atari --game pong --seconds S --seeds 1,2 --reference sb3`
(`zrl bench pong` is `zrl bench atari --game pong`; `--configs` picks some
of the game's configs): each shipped Pong config (`configs/pong_impala.yaml`,
`pong_apex.yaml`) trains through `zrl run` for S seconds, then
Stable-Baselines3 PPO with rl-baselines3-zoo's Atari settings trains for the
same wall time on the same env settings (listed under the table), one run
after another, seeds interleaved. Rows: the mean return of the last 20
episodes (game score, unclipped) and the emulator frames seen, at the end of
each minute from the command's start (start-up included). Targets (issue 46,
on an AVX2-only 2-core machine): IMPALA +10 within 60 minutes (+18 on the
AVX-512 one), the median of seeds 1 and 2; Ape-X 10 points above its start
within 60 minutes.

**The table below: three sittings on the AVX2 EPYC, merged.** (1) 11-28
06:09-07:50 UTC, seed 1, 50 minutes of zrl IMPALA then 50 of SB3 PPO
(`--seeds 1 --reference sb3 --seconds 3000`); (2) 08:29-09:30, seed 2, 60
minutes of IMPALA (`--configs pong_impala --seeds 2 --seconds 3600`; two
2.5-minute Ape-X smoke runs and niced unit tests ran beside its first 20
minutes); (3) 09:49-10:51, seed 1, 60 minutes of Ape-X (`--configs pong_apex
--seeds 1 --seconds 3600`, nothing else running).

- IMPALA: seed 1 -20.4, -18.8, -1.3, +1.3 at 10, 20, 40, 50 minutes (16.1M
  frames in 50); seed 2 -20.6, -19.6, -7.3, -4.1, +4.9 at 10, 20, 40, 50, 60
  (17.8M frames; actors ~5,000 frames/s, 7.7 updates/s of one 8 x 20 chunk,
  the learner waiting for data 3% of its time). Both stay flat to ~5M frames
  (~7,000 updates), then climb about a point a minute, the 20-episode mean
  swinging by up to 10 points after minute 30. Not yet met: +10 within 60
  minutes.
- SB3 PPO, seed 1: -20.6, -20.4, -19.4, -18.8 at 10, 20, 40, 50 minutes on
  1.9M frames (8 envs in one process, ~630 frames/s). Its seed 2 was not run.
- Ape-X (`configs/pong_apex.yaml`: each frame stored once; double and
  dueling DQN on 3-step returns; batch 64; actors held to 8 sampled
  transitions per env step), seed 1: -20.8, -20.6, -19.0, -18.1, -17.9 at
  10, 20, 40, 50, 60 minutes, +3.2 over its first minute's -21.0, on 1.7M
  frames (14.5 updates/s, the actors 464 frames/s). It rose from minute ~28
  (~0.8M frames, ~24,000 updates). Not yet met: 10 points above its start
  within 60 minutes."""),
    ("pong", """## pong (kept): short IMPALA runs on Pong, before `zrl bench atari`

`configs/pong_impala.yaml` (shallow CNN; 2 actors x 24 envs, the policy
acting on the first 8 ready; acting in int8, `actor.int8_torso: auto`: 8-bit
activations and int8 weights, in zrl's own kernels on CPUs with AVX-512 VNNI
or AVX2; CPU learner with bf16 forward passes where the CPU does bf16
natively: `learner.precision` auto) for a few minutes: the mean episode
return (game score, unclipped) over time, and frames/s (a step is 4 emulator
frames). Random play scores about -20.5. These runs came from the
`zrl bench pong` of 11-24 to 11-27 (10 minutes by default), which
`zrl bench atari` replaced.

**The table below (11-27, 09:06-09:26 UTC): 20 minutes on the AVX-512 EPYC
(Zen 4), -20.4 -> -1.7** (`zrl bench pong --seconds 1200`; 11.1k
frames/s; 13.2M frames). The run used today's actor: the int8 FC in blocks,
act() without torch, and the one-call chunk boundary. The return held at
-19.7 to -20.5 for 9 minutes. It stood a point up at minute 10 (6.4M
frames), climbed ~2 points a minute (~2.5 at its steepest, minutes 13-17)
to -1.3 at minute 19, and ended at
-1.7. The learner waited for data 11% of its time. The table before it
(11-26, same machine, 12.4k frames/s) went -20.4 -> -5.7 at minute 18 and
-8.2 at minute 20, with its rise at minute 10 too. This machine trains at
~70% of the speed of the AVX-512 machine of 11-24 (its learner update takes
28 ms against 18-19 there), and the rise comes about as many frames in as
there (6-8M). The learner is the bottleneck.

Two settings, both in the config since 11-23, took the curve from flat on
the 11-24 machine:

- **Batches of one chunk, 8 x 20 steps.** Until 11-23 the config took the
  paper's 32 x 20; an update took 95-150 ms, depending on how busy the
  machine was, so a run got 2,800-4,000 updates (PPO and A2C take tens of
  thousands of gradient steps over the same frames). At 8 x 20 an update
  takes 22 ms: about 12,000 updates in a run, over about as many frames.
- **An entropy cost of 0.0006 (TorchBeast's) instead of the paper's 0.01.**
  With batches of 32 this made no difference (the policy had had too few
  updates for the bonus to matter); with batches of 8 it does.

The runs so far (10 minutes unless said; the last row is the table below):

| date  | batch | entropy cost | other         | frames/s | first minute -> tenth minute |
| ----- | ----- | ------------ | ------------- | -------- | ---------------------------- |
| 11-22 | 32    | 0.01         |               | 17.0k    | -20.24 -> -19.76             |
| 11-23 | 32    | 0.01         |               | 11.9k    | -20.26 -> -20.34 (flat)      |
| 11-23 | 32    | 0.01         |               | 11.5k    | -20.32 -> -20.02             |
| 11-23 | 32    | 0.01         | lr 1e-3       | -        | -20.4 -> -20.2               |
| 11-23 | 32    | 0.0006       |               | 11.2k    | -21.0 -> -20.1               |
| 11-23 | 8     | 0.01         |               | 13.0k    | -20.17 -> -19.06             |
| 11-23 | 8     | 0.01         |               | 12.9k    | -20.24 -> -19.44             |
| 11-23 | 8     | 0.0006       | unroll 40     | 14.0k    | -20.32 -> -20.13 (half the updates) |
| 11-23 | 8     | 0.0006       | lr 1e-3       | 13.5k    | -20.47 -> -20.30             |
| 11-24 | 4     | 0.0006       | 4 env groups  | 9.4k     | -20.37 -> -18.03 (the learner is slower per sample) |
| 11-23 | 8     | 0.0006       |               | 13.9k    | -20.27 -> -14.75             |
| 11-24 | 8     | 0.0006       |               | 13.7k    | -20.45 -> -13.73             |
| 11-24 | 8     | 0.0006       | channels_last CNNs | 16.1k | -20.48 -> -16.23             |
| 11-24 | 8     | 0.0006       | int8 first conv, C++ draw | 16.1k | -20.39 -> -7.02       |
| 11-24 | 8     | 0.0006       | int8 torso    | 17.7k    | -20.59 -> -10.79             |
| 11-26 | 8     | 0.0006       | 24 envs, first 8 ready; zrl's VNNI kernel; a slower machine | 12.2k | -20.35 -> -19.34 |
| 11-26 | 8     | 0.0006       | the same, 20 minutes | 12.4k | -20.38 -> -18.93 (-5.69 at minute 18) |
| 11-27 | 8     | 0.0006       | the same, 20 minutes; today's actor | 11.1k | -20.38 -> -18.61 (-1.32 at minute 19, -1.73 at 20) |

The rise starts late (minute 6-8 on the 11-24 machine, 9-10 here) and is
steep once it starts, so single runs of a variant say little about small
differences: the first three runs of the 11-24 config ended within 2.5
points of each other, the fourth 7 points above them (its rise came at
minute 6, not 8, and minute 10 jumped from -17.3 to -7.0). The third, with
the CNNs in channels_last (11-24), ran 18% more frames per second than the
one before it; the fourth, acting with an int8 first conv, as many frames
per second as the third (the learner is the bottleneck); its actors' first
conv ran with int8 weights, and in this one run that did not hold the
learning back. The fifth (11-24, later), its actors' whole CNN in int8 with
8-bit activations, rose from minute 6 to -10.8 at 17.7k frames/s, inside the
spread of the others.

A 20-minute run on the 11-24 machine (`zrl run --config
configs/pong_impala.yaml --max-seconds 1200`, 13.7k frames/s, 25,600
updates) went on from there: -20.4 (minute 1), -17.2 (10), -7.4 (13),
-4.5 (14), then -2 to -5 until minute 20 (-2.8 at the end, 16.4M frames).
The 20-minute runs ended between -1.7 and -8 (11-27: -1.7, still climbing;
11-24: -2.8; 11-26: -8.2): Pong is not learned in 20
minutes on a CPU learner (a learned game scores +18 to +21); give it longer,
or a GPU learner."""),
    ("pong_avx512_1124", """## pong on the AVX-512 machine of 11-24 (kept)

The 10-minute bench of 11-24 on a faster AVX-512 EPYC, with that day's
config (2 actors x 16 envs in 2 groups, oneDNN's int8 kernels): -20.59 ->
-10.79 at 17.7k frames/s (the last of the 11-24 rows above)."""),
    ("pong_avx2", """## pong on an AVX2-only CPU (the same config, 11-24 and 11-25, later sessions)

The tables above are from AVX-512 machines. On the AVX2-only EPYC (no
AVX-512, VNNI or BF16) the same 10-minute run (11-24; the table at the end
of this section is now a 25-minute run of the bench), with the actors of that
session (24 envs acting on the first 8 ready, zrl's int8 kernel), trains at
6.8k frames/s (1,700 env steps/s): the learner is the bottleneck (fp32
there: `learner.precision: auto` finds no native bf16; waiting for data 5% of
its time), at about 40% of the AVX-512 machine's 17k frames/s. In those 10
minutes the return barely moves (-20.56 in the first minute, -20.23 in the
tenth). The run got ~6,300 updates (1.01M env steps in batches of 8 x 20);
the AVX-512 runs above got ~12,000 in their 10 minutes and began to rise
after 6-8 of them, some 7,000-10,000 updates in. Not a measurement of the
actors, which deliver 0.74-0.96 of the raw env in actor -> sink (pipeline).

**Given 25 minutes, the curve moves here too.** A later session ran the same
config with `zrl run --config configs/pong_impala.yaml --max-seconds 1500`
(11-24, 22:00 UTC). It trained at 5.9k frames/s on average. Pytest runs on
the same 2 cores held minutes 2-5 to 4-5k. The run got 13,933 updates,
2.23M env steps, 8.9M frames. The return stayed at -20.1 to -20.7 for 12
minutes (~7,500 updates). It rose from minute 13 on, to -18.25 at minute 25:
about as many updates in as on the AVX-512 machine, at half the updates per
minute. The minutes below count from the first episode's end:

| minute | 1 | 5 | 10 | 12 | 13 | 14 | 17 | 20 | 22 | 25 |
| ------ | - | - | -- | -- | -- | -- | -- | -- | -- | -- |
| mean return | -20.27 | -20.66 | -20.25 | -20.16 | -20.12 | -19.61 | -19.54 | -18.81 | -18.44 | -18.25 |
| env frames (M) | 0.55 | 1.96 | 3.62 | 4.41 | 4.80 | 5.17 | 6.32 | 7.37 | 8.04 | 8.91 |

![pong, 25 minutes on the AVX2 machine](out/pong_avx2_25min.png)

One actor instead of two does not bring the rise forward. A 14-minute run
with `-o run.num_actors=1` (11-25, 00:44 UTC) trained at 1,830 env steps/s
(7.3k frames/s), with a policy lag of 3.4-4.1 updates instead of 8-15. It
got 9,510 updates, and the return was still -20.2 to -20.7 at the end.
That is one seed against one, so it rules nothing out, but the config keeps
its two actors.

**Where the CPU goes, and three ways to more updates that did not help
(11-25).** Per-thread CPU over 10 s of the shipped run (`schedstat`) on this
machine: the learner's training thread 0.61 of a core, the 4 emulator
threads 0.95, the 2 actors' main threads 0.37, at ~1,600 env steps/s. One
update (8 x 20 steps) thus costs ~61 ms of learner CPU and ~130 ms of CPU
on the env side (emulation ~590 us a step, acting ~230): the learner waits
for data only ~5% of its time, yet two thirds of the CPU goes to making its
data. The learner's update is near what these cores do (a profile: the two
convs forward and backward take ~34 of its 55 ms alone, at ~55 GFLOP/s in
fp32). So three runs of 10 minutes bought more updates per minute a
different way, each one seed:

| change | updates | env steps | policy lag | return, minute 1 -> 10 |
| ------ | ------- | --------- | ---------- | ---------------------- |
| none (the 10-minute bench run of 11-24) | ~6,300 | 1,011,360 | 10.3 | -20.56 -> -20.23 |
| two gradient steps on each batch (a trial `learner.passes: 2`, not kept) | 7,602 | 608,640 | 38 | -20.6 -> -20.6 |
| `actor.unroll_length: 10` (batches of 8 x 10) | 10,381 | 830,720 | 14 | -20.1 -> -20.2 |
| `algo.normalize_advantages: true` | (stopped at 5 min) | - | 8-17 | -20.5 -> -21.0 from minute 3 |

Twice the updates (unroll 10) in 10 minutes is more than the AVX-512 runs
had when they rose (7,000-10,000), and the return did not move: on this
config the rise needs frames as well as updates. Every run that rose had
seen at least ~5M frames first (4.8M in the 25-minute run above, 5.3M in the
bench run below, 6-8M on the AVX-512 machine), and this machine reaches 5M
after ~12 minutes. Reusing each batch slowed the actors (blocked on a full queue) and
quadrupled the policy lag; advantages standardised over each batch of 160
steps, nearly all of them without a reward, drove the policy to lose every
point (-21.0). The config is unchanged.

**The bench, given 25 minutes: -20.2 -> -12.8.** `zrl bench pong` takes
`--seconds` (since 11-25), and reports the minute at which the return first
stands a point above the first minute's. On this machine `zrl bench pong
--seconds 1500` (11-25, 02:15 UTC, nothing else running) trained at 6.7k
frames/s: 2.5M env steps, 10.1M frames. The return held at -20.0 to -20.5
for 12 minutes, moved from minute 13 (5.3M frames) and stood a point up at
minute 18; from there it climbed about a point a minute, to -12.8 at minute
25, still steepening. That is a second seed beside the hand-made 25-minute
run above (-18.25 at minute 25): both rose from minute 13."""),
    ("soak", """## soak: resident memory over a long run

A 10-minute `zrl run` of the default config with no return target; the
resident set size of the learner and every actor is sampled every 5 s.
Growth compares the first and last fifths of the samples after a warm-up
(the first fifth of the run). Target (issue 6): under 5%."""),
]

# The sections whose output another command than `zrl bench NAME` writes.
RUN_COMMANDS = {
    "atari_pong": "zrl bench atari --game pong --seeds 1,2 --reference sb3",
    "learning_pendulum": "zrl bench learning --task pendulum",
    "learning_lunarlander": "zrl bench learning --task lunarlander",
    "learning_acrobot": "zrl bench learning --task acrobot",
    "learning_halfcheetah": "zrl bench learning --task halfcheetah",
}


def main() -> None:
    parts = [INTRO]
    for name, text in SECTIONS:
        parts.append(text)
        md = OUT / f"{name}.md"
        if md.exists():
            body = md.read_text().split("\n", 1)[1].strip()  # drop its own title line
            parts.append(body)
        else:
            parts.append(f"(no output yet: run `{RUN_COMMANDS.get(name, f'zrl bench {name}')} --out bench/out`)")
        if (OUT / f"{name}.png").exists():
            parts.append(f"![{name}](out/{name}.png)")
    (HERE / "README.md").write_text("\n\n".join(parts) + "\n")
    print(f"wrote {HERE / 'README.md'}")


if __name__ == "__main__":
    main()
