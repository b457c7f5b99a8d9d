"""The learner's device: which one, and whether a model's training state fits in it."""
from __future__ import annotations

import psutil
import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"learner.device: {name} requested but CUDA is not available")
    return dev


def parameter_count(algo) -> int | None:
    """The number of parameters algo.build_model() makes, counted on the meta device (no
    memory, no random numbers drawn); None where the model cannot be built there."""
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            return sum(p.numel() for p in algo.build_model().parameters())
    except Exception:  # noqa: BLE001 - an init that meta tensors cannot run: the real build decides
        return None


def check_training_fits(algo, device: torch.device) -> None:
    """Raises MemoryError when the model's float32 weights, gradients and the optimiser's two
    moments would not fit in the device's free memory. The specs come from a peer's hello:
    an observation shape can ask for terabytes of weights, and where the OS overcommits
    memory, allocating them does not fail at once but initialises them for minutes."""
    n = parameter_count(algo)
    if n is None:
        return
    need = 16 * n
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else psutil.virtual_memory().available
    if need > free:
        raise MemoryError(f"its {n:,} parameters need about {need / 2**30:,.1f} GiB for training (float32 weights, "
                          f"gradients and the optimiser's two moments), and {device} has {free / 2**30:,.1f} GiB free")
