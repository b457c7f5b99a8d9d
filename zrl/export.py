"""`zrl export`: a checkpoint's deterministic policy as a TorchScript or ONNX file that runs
without zrl.

The file is the agent's own `policy` module (`zrl.load(...).policy`, the algorithm's
`deterministic_policy`) traced: input `obs`, a batch [B, *obs] in the env's dtype (any B);
output `action`, int64 [B] (Discrete) or float32 [B, *shape] (Box), observation
normalisation and action rescaling or clipping included. An LSTM policy also takes `h`, `c`
[B, lstm_size] and returns `h_out`, `c_out`. The spaces and these names travel in the file
as JSON (`metadata`). The written file is run once on random observations and compared
with the agent before the export counts as done. docs/API.md has examples.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zrl import __version__
from zrl.agent import Agent, load
from zrl.env_ids import is_atari

__all__ = ["EXTRA_FILE", "FORMATS", "ExportError", "Exported", "export_policy", "metadata", "run_file"]

FORMATS = ("torchscript", "onnx")
EXTRA_FILE = "zrl_policy.json"  # the metadata's name among a TorchScript file's _extra_files
_SUFFIXES = {".onnx": "onnx", ".pt": "torchscript", ".ts": "torchscript", ".torchscript": "torchscript"}


class ExportError(RuntimeError):
    """An export that cannot be done (a missing package, an unknown format) or that came out wrong."""


def format_for(out: str | Path, fmt: str | None) -> str:
    """The format asked for, or the one --out's suffix names (.onnx; .pt, .ts: torchscript)."""
    if fmt is None:
        fmt = _SUFFIXES.get(Path(out).suffix.lower())
        if fmt is None:
            raise ExportError(f"cannot tell the format from {Path(out).name!r}: give --format torchscript or onnx")
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    return fmt


def io_names(agent: Agent) -> tuple[list[str], list[str]]:
    """The exported file's input and output names."""
    if agent.recurrent:
        return ["obs", "h", "c"], ["action", "h_out", "c_out"]
    return ["obs"], ["action"]


def metadata(agent: Agent) -> dict[str, Any]:
    """What the file says about itself: spaces, inputs and outputs, and where it came from."""
    inputs, outputs = io_names(agent)
    env = agent.config.env
    meta = {
        "format": "zrl-policy",
        "format_version": 1,
        "zrl_version": __version__,
        "algo": agent.config.algo.name,
        "env_id": env.id,
        "observation_space": agent.obs_spec.to_json(),
        "action_space": agent.action_spec.to_json(),
        "inputs": inputs,
        "outputs": outputs,
        "lstm_size": agent.lstm_size,
        "deterministic": True,
        "checkpoint": str(agent.checkpoint),
    }
    if is_atari(env.id):  # what the frames must be: zrl's preprocessing (docs/API.md)
        meta["atari"] = {"frame_stack": env.frame_stack, "screen_size": env.screen_size}
    return meta


def random_inputs(agent: Agent, n: int, seed: int = 0) -> list[np.ndarray]:
    """n random observations of the agent's spec (and a random core state for an LSTM)."""
    rng = np.random.default_rng(seed)
    spec = agent.obs_spec
    shape = (n, *spec.shape)
    if spec.np_dtype == np.uint8:
        obs = rng.integers(0, 256, shape, dtype=np.uint8)
    else:  # uniform within the bounds where an element has both, else around 0
        low, high = spec.bound_array("low"), spec.bound_array("high")
        bounded = np.isfinite(low) & np.isfinite(high)
        obs = np.where(bounded, rng.uniform(np.where(bounded, low, 0.0), np.where(bounded, high, 1.0), shape),
                       rng.normal(0.0, 2.0, shape))
    inputs = [obs.astype(spec.np_dtype)]
    if agent.recurrent:
        inputs += [rng.normal(0.0, 0.5, (n, agent.lstm_size)).astype(np.float32) for _ in range(2)]
    return inputs


@contextlib.contextmanager
def _quiet_exporters():
    """PyTorch's exporters warn about their own deprecations and optional packages (torchvision)
    on every call; nothing in those messages is about the policy."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", message=".*axis name.*will not be used.*")
            yield
    finally:
        registration.setLevel(level)


def write_torchscript(agent: Agent, out: Path, meta: dict[str, Any]) -> None:
    example = tuple(torch.from_numpy(x) for x in random_inputs(agent, 2))
    with _quiet_exporters():
        traced = torch.jit.trace(agent.policy, example)
        torch.jit.save(traced, str(out), _extra_files={EXTRA_FILE: json.dumps(meta)})


def check_onnx_available() -> None:
    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(f"--format onnx needs {' and '.join(missing)}, which are not installed: pip install \"zrl[export]\"")


def write_onnx(agent: Agent, out: Path, meta: dict[str, Any]) -> None:
    import onnx  # lazy: an optional package (zrl[export]), only this format needs it

    example = tuple(torch.from_numpy(x) for x in random_inputs(agent, 2))
    inputs, outputs = io_names(agent)
    batch = torch.export.Dim("batch")
    with _quiet_exporters():
        torch.onnx.export(agent.policy, example, str(out), input_names=inputs, output_names=outputs,
                          dynamic_shapes=tuple({0: batch} for _ in example), dynamo=True, external_data=False, verbose=False)
    model = onnx.load(str(out))
    for key, value in meta.items():  # ONNX metadata is strings: each value as JSON
        model.metadata_props.add(key=key, value=json.dumps(value))
    onnx.save(model, str(out))


def run_file(path: str | Path, fmt: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The outputs of an exported file on `inputs` (numpy, in the file's input order), as numpy:
    TorchScript in torch, ONNX in onnxruntime."""
    if fmt == "torchscript":
        with _quiet_exporters():
            module = torch.jit.load(str(path))
        with torch.inference_mode():
            out = module(*(torch.from_numpy(x) for x in inputs))
        return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]
    import onnxruntime  # lazy: an optional package (zrl[export]), only ONNX files need it

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: x for i, x in zip(session.get_inputs(), inputs)})


def agent_outputs(agent: Agent, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """What the agent gives for the same inputs, in the exported file's output order."""
    if not agent.recurrent:
        return [agent.act(inputs[0])]
    action, (h, c) = agent.act(inputs[0], (inputs[1], inputs[2]))
    return [action, h, c]


def check_agrees(agent: Agent, out: Path, fmt: str) -> bool:
    """Runs the written file on random observations against the agent; ExportError if they
    differ. False (unchecked) for ONNX without onnxruntime."""
    if fmt == "onnx" and importlib.util.find_spec("onnxruntime") is None:
        return False
    inputs = random_inputs(agent, 5, seed=1)
    names = io_names(agent)[1]
    for name, got, want in zip(names, run_file(out, fmt, inputs), agent_outputs(agent, inputs)):
        same = np.array_equal(got, want) if want.dtype.kind == "i" else np.allclose(got, want, rtol=1e-4, atol=1e-5)
        if got.shape != want.shape or got.dtype != want.dtype or not same:
            raise ExportError(f"{out}: the exported {fmt} file's {name!r} differs from the agent's on random observations "
                              f"(shape {got.shape} vs {want.shape}, dtype {got.dtype} vs {want.dtype}); the file is removed")
    return True


@dataclass(frozen=True)
class Exported:
    """A written file: where, in which format, what it says about itself, and whether it was
    run and checked against the agent."""

    path: Path
    fmt: str
    meta: dict[str, Any]
    checked: bool

    def summary(self) -> list[str]:
        m = self.meta
        return [f"wrote {self.path} ({self.fmt}): {', '.join(m['inputs'])} -> {', '.join(m['outputs'])}",
                f"observation space {json.dumps(m['observation_space'])}, action space {json.dumps(m['action_space'])}",
                f"from {m['checkpoint']}; " + ("its outputs match zrl.load's on random observations" if self.checked
                                               else "not run (onnxruntime is not installed)")]


def export_policy(source: str | Path, fmt: str | None, out: str | Path) -> Exported:
    """Writes the deterministic policy of `source` (a logdir, a checkpoints folder or a .pt
    checkpoint) to `out` as `fmt` (None: from out's suffix), then runs it against the agent."""
    fmt = format_for(out, fmt)
    if fmt == "onnx":
        check_onnx_available()
    agent = load(source)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = metadata(agent)
    (write_onnx if fmt == "onnx" else write_torchscript)(agent, out, meta)
    try:
        checked = check_agrees(agent, out, fmt)
    except ExportError:
        out.unlink(missing_ok=True)  # a file that acts otherwise than the agent must not be used
        raise
    return Exported(out, fmt, meta, checked)
