"""zrl: distributed reinforcement learning over ZeroMQ with a C++ hot path.

Actors step environments and stream trajectory chunks to a learner over
PUSH/PULL; the learner trains with PyTorch and broadcasts version-tagged
weights over PUB/SUB. See DESIGN.md in docs/ for the map.
"""

import importlib

__version__ = "0.1.0"

# The Python API (docs/API.md, docs/TRAIN.md), {name: its module}: imported on first use, so that `import zrl`
# and `zrl --help` do not load torch.
_LAZY = {"load": "zrl.agent", "Agent": "zrl.agent", "train": "zrl.training", "RunResult": "zrl.training"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'zrl' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
