"""The learner's update loop reads nothing back from its device (issue 5: "no synchronising
calls in the loop beyond V-trace's one round trip").

On a GPU every read of a tensor's values by the host (`.item()`, `float(t)`, `.cpu()`,
`.numpy()`, a boolean mask, `nonzero`, ...) waits for the GPU to finish all the work queued
before it. No GPU is needed to see such reads: they are Python calls on tensors, and a
`TorchFunctionMode` sees every one made on the learner's thread. The loop may read only
through its host-transfer points (`vtrace_on_host`, `HostWeights`, `HostPriorities`, and
`impala._join`, which fills a batch in host memory), and when it logs. The modes are thread-local, so the receiver thread is not watched (it
handles numpy frames, not tensors).

What the mode cannot see: syncs inside PyTorch's own C++ (a blocking copy from pageable
memory, say). The learner's copies to a device go through pinned memory with
non_blocking=True (impala._join and _to_device, apex_dqn). On a GPU, DeviceSyncs (below) sees those
too: PyTorch's sync debug mode reports each synchronising CUDA call as it is made.
"""
from __future__ import annotations

import contextlib
import sys
import warnings

import pytest
import torch
from torch.overrides import TorchFunctionMode

from zrl.config import load_config
from zrl.learner import learner as learner_mod
from zrl.learner import publisher
from zrl.algorithms.apex_dqn import algorithm as apex_dqn
from zrl.algorithms.impala import algorithm as impala
from zrl.models import cnn
from helpers import ROOT, apex_config, small_config, wait_for

pytestmark = pytest.mark.timeout(120)

T = torch.Tensor
# Calls that hand a tensor's values to the host. On a GPU each one synchronises.
READS = {
    T.item, T.tolist, T.numpy, T.__array__, T.__bool__, T.__float__, T.__int__, T.__index__,
    T.__format__, T.__repr__, T.cpu, T.nonzero, torch.nonzero, T.argwhere, torch.argwhere,
    T.masked_select, torch.masked_select, T.unique, torch.unique, torch.unique_consecutive,
}
# Indexing reads only with a boolean mask (its size depends on the values).
MASKABLE = {T.__getitem__, T.__setitem__, T.index_put_, T.index_put, torch.index_put}
# Where the loop may read: its host-transfer points (V-trace's is counted: once per update).
TRANSFERS = {
    impala.vtrace_on_host.__code__,
    impala._join.__code__,  # writes a batch into host memory (pinned for a GPU) and sends it
    publisher.HostWeights.ready.__code__,
    publisher.publishable.__code__,
    apex_dqn.HostPriorities.put.__code__,
    apex_dqn.HostPriorities.flush.__code__,
}
# Outside the update: logging, checkpoints.
NOT_THE_UPDATE = {learner_mod.TrainingLog.log.__code__, learner_mod.Learner.save_checkpoint.__code__}
# Paths taken only for CPU tensors, which reach their memory through numpy: the CNNs' C++
# cast of uint8 pixels (on a GPU, conv_input is obs.to(dtype)).
CPU_ONLY = {cnn.conv_input.__code__}


def _has_bool_index(obj) -> bool:
    if isinstance(obj, torch.Tensor):
        return obj.dtype == torch.bool
    if isinstance(obj, (tuple, list)):
        return any(_has_bool_index(o) for o in obj)
    return False


def _to_host(args, kwargs) -> bool:
    """Whether a `.to(...)` call moves its tensor to the host."""
    targets = [*args[1:], kwargs.get("device"), kwargs.get("other")]
    if args[0].device.type != "cpu":  # from a GPU: any move to the CPU
        return any(
            (isinstance(a, (str, torch.device)) and torch.device(a).type == "cpu")
            or (isinstance(a, torch.Tensor) and a.device.type == "cpu")
            for a in targets
        )
    # On a CPU learner only a literal "cpu" says "to the host". A device object is the
    # device of something (the learner's, a tensor's: `.to(grad.device)` in
    # clip_grad_norm_), which would be the GPU there.
    return any(isinstance(a, str) and torch.device(a).type == "cpu" for a in targets)


def _is_read(func, args, kwargs) -> bool:
    if func in READS:
        return True
    if func is T.to:
        return _to_host(args, kwargs)
    if func in MASKABLE:
        return len(args) > 1 and _has_bool_index(args[1])
    return False


class HostReads(TorchFunctionMode):
    """Records every host read made inside `Learner._train`, other than at its transfer
    points and in its logging, with the line of zrl code that made it."""

    def __init__(self):
        super().__init__()
        self.learner = None
        self.reads: list[str] = []

    def watching(self, learner):
        """For make_learner(around=...): the mode, entered on the learner's thread."""
        self.learner = learner  # its optimizer is made when run() starts
        return self

    def _optimizer_step_counter(self, t) -> bool:
        # Adam's step count is a CPU tensor even on a GPU (not capturable): reading it is free.
        opt = self.learner.optimizer
        return opt is not None and any(s.get("step") is t for s in opt.state.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_read(func, args, kwargs) and not self._optimizer_step_counter(args[0] if args else None):
            where, in_train = None, False
            f = sys._getframe(1)
            while f is not None:
                code = f.f_code
                if code in TRANSFERS or code in NOT_THE_UPDATE or (code in CPU_ONLY and args[0].device.type == "cpu"):
                    break
                if where is None and "/torch/" not in code.co_filename:  # the innermost caller outside torch
                    where = f"{'/'.join(code.co_filename.rsplit('/', 2)[-2:])}:{f.f_lineno} ({code.co_name}): {func.__name__}"
                if code is learner_mod.Learner._train.__code__:
                    in_train = True
                    break
                f = f.f_back
            if in_train:
                self.reads.append(where or func.__name__)
        return func(*args, **kwargs)


def _configs(device: str):
    # Batches joined in line (auto prefetches on a GPU), but for impala-prefetch: the loop's own thread is watched.
    lead = [f"learner.device={device}", "learner.log_interval_s=0.05", "learner.publish_interval=1", "learner.prefetch_batches=0"]
    return {
        "impala": small_config(*lead),
        "impala-lstm": small_config(*lead, "model.lstm_size=16"),
        "impala-bf16": small_config(*lead, "learner.precision=bf16"),
        "impala-prefetch": small_config(*lead, "learner.prefetch_batches=2"),  # batches made on another thread
        "apex": apex_config(*lead, "algo.target_update_interval=5"),
        # The CNNs on real Pong frames (uint8 to float on the learner's device), kept small.
        "pong": load_config(PONG_CONFIG, [*lead, *PONG_SMALL]),
        "pong-deep-lstm": load_config(PONG_CONFIG, [*lead, *PONG_SMALL, "model.network=impala_deep", "model.lstm_size=32"]),
        # With their statistics: observation and return normalisation update on the device.
        "ppo": load_config(ROOT / "configs" / "cartpole_ppo.yaml", [*lead, *SMALL, "run.num_actors=1", *NORMALIZED]),
        "appo": load_config(ROOT / "configs" / "cartpole_appo.yaml", [*lead, *SMALL, "learner.batch_size=8", *NORMALIZED]),
        "a3c": load_config(ROOT / "configs" / "cartpole_a3c.yaml", [*lead, *SMALL]),
    }


SMALL = ["actor.num_envs=4", "actor.unroll_length=5", "run.max_seconds=null", "run.stop_at_return=null"]
NORMALIZED = ["model.normalize_obs=true", "algo.normalize_returns=true"]


PONG_CONFIG = ROOT / "configs" / "pong_impala.yaml"
PONG_SMALL = ["actor.num_envs=4", "actor.env_groups=1", "actor.env_batching=groups", "actor.unroll_length=5",
              "learner.batch_size=4", "run.num_actors=1", "run.max_seconds=null"]


def _watch(cfg, make_learner, make_actor, updates: int, watcher=None):
    """Trains cfg's learner, its loop watched (by a HostReads unless watcher says otherwise),
    for `updates` updates: (the watcher, updates done)."""
    watcher = watcher if watcher is not None else HostReads()
    learner, runner = make_learner(cfg, around=watcher.watching)
    make_actor(cfg)
    wait_for(lambda: learner.updates >= updates or not runner.thread.is_alive(), 90, f"{updates} updates")
    learner.request_stop()
    runner.join(30)
    return watcher, learner.updates


def _plant_in_loss(monkeypatch, call) -> list:
    """Makes IMPALA's loss also run call(loss, batch); returns the list of what each call gave."""
    real_loss = impala.Impala.loss
    planted = []

    def loss_with_plant(self, model, batch):
        loss, stats = real_loss(self, model, batch)
        planted.append(call(loss, batch))
        return loss, stats

    monkeypatch.setattr(impala.Impala, "loss", loss_with_plant)
    return planted


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["impala", "impala-lstm", "impala-bf16", "impala-prefetch", "apex", "pong", "pong-deep-lstm",
                                  "ppo", "appo", "a3c"])
def test_the_update_loop_reads_nothing_back(name, device, make_learner, make_actor, monkeypatch):
    cfg = _configs(device)[name]
    calls = {"vtrace": 0}
    real_vtrace = impala.vtrace_on_host

    def counted(*a, **kw):
        calls["vtrace"] += 1
        return real_vtrace(*a, **kw)

    monkeypatch.setattr(impala, "vtrace_on_host", counted)
    # Enough updates for logging, publishing, Adam's state and (Ape-X) target syncs to come round.
    mode, updates = _watch(cfg, make_learner, make_actor, 20)
    assert mode.reads == [], "host reads in the update loop:\n" + "\n".join(sorted(set(mode.reads)))
    if cfg.algo.name == "impala":
        # V-trace's round trip: once per update.
        assert calls["vtrace"] == updates, (calls, updates)


# What a loss might do: (the call, the read the watcher must report, or None for none).
PLANTS = {
    "float": (lambda loss, batch: float(loss.detach()), "__float__"),
    "cpu": (lambda loss, batch: loss.detach().cpu(), "cpu"),
    "to-cpu": (lambda loss, batch: loss.detach().to("cpu"), "to"),
    "bool-mask": (lambda loss, batch: batch["reward"][batch["terminated"]], "__getitem__"),
    "to-its-device": (lambda loss, batch: batch["reward"].to(loss.device), None),  # on a GPU, no read
    "int-index": (lambda loss, batch: batch["reward"][batch["action"]], None),  # a gather, no read
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_read_in_the_loss_is_caught(plant, make_learner, make_actor, monkeypatch):
    # The watcher is not vacuous: a loss that reads a value back (a sync per update on a
    # GPU) is reported, once per update, with the line that did it; one that moves or
    # indexes on the device is not.
    call, read = PLANTS[plant]
    planted = _plant_in_loss(monkeypatch, call)
    mode, _ = _watch(_configs("cpu")["impala"], make_learner, make_actor, 5)
    assert len(planted) >= 5
    if read is None:
        assert mode.reads == [], mode.reads
    else:
        assert len(mode.reads) == len(planted), mode.reads
        assert all(r.endswith(f"(<lambda>): {read}") for r in mode.reads), mode.reads


class DeviceSyncs:
    """Records every synchronising CUDA call that PyTorch itself reports
    (`torch.cuda.set_sync_debug_mode("warn")`) inside `Learner._train`, other than at its
    transfer points and when it logs, with the line of code outside torch that made it. This
    sees what HostReads cannot: a sync inside PyTorch's C++, such as a blocking copy from
    pageable memory. The debug mode and the warning hook are process-wide; in these tests
    only the learner's thread uses the GPU (the actors act on the CPU)."""

    def __init__(self):
        self.reads: list[str] = []
        self.at_transfers = 0  # V-trace's round trip, a HostPriorities wait: allowed, counted

    def _record(self, f) -> None:
        where = None
        while f is not None:
            code = f.f_code
            if code in TRANSFERS:
                self.at_transfers += 1
                return
            if code in NOT_THE_UPDATE:
                return
            name = code.co_filename
            if where is None and "/torch/" not in name and not name.endswith("warnings.py") and code is not DeviceSyncs._record.__code__:
                where = f"{'/'.join(name.rsplit('/', 2)[-2:])}:{f.f_lineno} ({code.co_name})"
            if code is learner_mod.Learner._train.__code__:
                self.reads.append(where or "?")
                return
            f = f.f_back

    @contextlib.contextmanager
    def watching(self, learner):
        """For make_learner(around=...)."""
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            show = warnings.showwarning

            def hook(message, category, filename, lineno, file=None, line=None):
                if "synchronizing CUDA operation" in str(message):
                    self._record(sys._getframe(1))
                else:
                    show(message, category, filename, lineno, file, line)

            warnings.showwarning = hook
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield self
            finally:
                torch.cuda.set_sync_debug_mode("default")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("name", ["impala", "impala-lstm", "impala-bf16", "impala-prefetch", "apex", "pong", "pong-deep-lstm"])
def test_the_gpu_update_loop_makes_no_synchronising_call(name, make_learner, make_actor):
    cfg = _configs("cuda")[name]
    syncs, updates = _watch(cfg, make_learner, make_actor, 20, DeviceSyncs())
    print(f"\n{name}: {updates} updates, {syncs.at_transfers} synchronising calls at the transfer points")
    assert updates >= 20
    assert syncs.reads == [], "synchronising CUDA calls in the update loop:\n" + "\n".join(sorted(set(syncs.reads)))


# A loss that synchronises: (the call, whether PyTorch's sync debug mode must report it).
SYNC_PLANTS = {
    "item": (lambda loss, batch: loss.detach().item(), True),
    "pageable-copy-in": (lambda loss, batch: torch.ones(3).to(loss.device), True),  # invisible to HostReads
    "pinned-copy-in": (lambda loss, batch: torch.ones(3).pin_memory().to(loss.device, non_blocking=True), False),
}


@needs_cuda
@pytest.mark.parametrize("plant", sorted(SYNC_PLANTS))
def test_a_sync_in_the_gpu_loss_is_caught(plant, make_learner, make_actor, monkeypatch):
    call, caught = SYNC_PLANTS[plant]
    planted = _plant_in_loss(monkeypatch, call)
    syncs, _ = _watch(_configs("cuda")["impala"], make_learner, make_actor, 5, DeviceSyncs())
    assert len(planted) >= 5
    if caught:
        assert len(syncs.reads) == len(planted), syncs.reads
        assert all(r.endswith("(<lambda>)") for r in syncs.reads), syncs.reads
    else:
        assert syncs.reads == [], syncs.reads
