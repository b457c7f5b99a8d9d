"""Type stub for the C++ extension zrl._core (csrc/python/, one file per domain)."""
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

def pixels_to_channels_last(src: npt.NDArray[np.uint8], out: npt.NDArray[Any]) -> None:
    """uint8 [N, C, H, W] -> out [N, H, W, C], cast to out's dtype (float32, uint8, or int16/uint16 receiving bfloat16 bits)."""

def int8_layer(x: npt.NDArray[np.uint8], base: npt.NDArray[np.int64], w: npt.NDArray[np.int8], offs: npt.NDArray[np.int32],
               scale: npt.NDArray[np.float32], bias: npt.NDArray[np.float32], inv_out_scale: float, qmax: int,
               out: npt.NDArray[Any], kernel: str = "auto") -> None:
    """One int8 layer (a convolution without padding, or an FC) over P positions: acc = sum over j, q of
    x[base[p] + offs[j] + q] * w[oc // 16, j, 4 * (oc % 16) + q] (w in blocks of 16 outputs, [OC / 16, J, 64]:
    zrl.models.cnn.int8_blocks lays [J, OC, 4] weights out so); y = acc * scale + bias; out uint8 [P, OC]: clamp(round(y * inv_out_scale),
    0, qmax), out float32 [P, OC]: max(y, 0). AVX-512 VNNI or AVX2 where the CPU has it (int8_layer_kernels);
    kernel names one (for tests)."""

def int8_layer_kernels() -> list[str]:
    """The kernels int8_layer runs on this CPU, fastest first (the first is the one it picks): 'avx512_vnni' (exact for
    any int8 weights), 'avx2' (pairs of products summed in saturating int16: keep |w| <= 63 for x up to 255), 'portable'."""

def quantize_rows(src: npt.NDArray[Any], out: npt.NDArray[np.int8], scales: npt.NDArray[np.float32]) -> bool:
    """Weights [R, K] float32 (or int16/uint16 holding bfloat16 bits) -> out int8 [R, K] and scales [R],
    per row: round-half-even(w / scale) with scale = max(max|w| / 127, 1e-12). False if a weight is not finite."""

def sample_categorical(logits: npt.NDArray[np.float32], u: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """One action per row of logits [B, n] (inverse CDF of the softmax at u [B] in [0, 1)): (actions, log-probabilities)."""

def vtrace(
    log_rhos: npt.NDArray[np.float32],
    discounts: npt.NDArray[np.float32],
    rewards: npt.NDArray[np.float32],
    values: npt.NDArray[np.float32],
    bootstrap_value: npt.NDArray[np.float32],
    clip_rho_threshold: float,
    clip_pg_rho_threshold: float,
    clip_c_threshold: float,
    lambda_: float,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...

# Replay buffers (csrc/replay/); zrl.replay wraps these. Fields are
# [(name, shape, dtype name)] with dtype in float32, uint8, int64, bool.
# Every method that touches data releases the GIL; calls are atomic (one
# mutex per buffer).
FieldList = list[tuple[str, tuple[int, ...], str]]

class PrioritizedReplay:
    def __init__(self, capacity: int, fields: FieldList, alpha: float, seed: int) -> None: ...
    @property
    def capacity(self) -> int: ...
    @property
    def alpha(self) -> float: ...
    @property
    def fields(self) -> FieldList: ...
    @property
    def max_priority(self) -> float: ...
    def __len__(self) -> int: ...
    def add(self, batch: dict[str, np.ndarray], priorities: npt.ArrayLike | None = None) -> None: ...
    def sample(
        self, batch_size: int, beta: float
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], dict[str, np.ndarray]]: ...
    def update_priorities(self, keys: npt.ArrayLike, priorities: npt.ArrayLike) -> int: ...
    def state_dict(self) -> dict[str, np.ndarray]: ...
    def load_state_dict(self, state: dict[str, np.ndarray]) -> None: ...
    def _tree_total(self) -> float: ...
    def _tree_min(self) -> float: ...
    def _scaled_priorities(self) -> npt.NDArray[np.float32]: ...
    def _check_invariants(self) -> str: ...

class UniformReplay:
    def __init__(self, capacity: int, fields: FieldList, seed: int) -> None: ...
    @property
    def capacity(self) -> int: ...
    @property
    def fields(self) -> FieldList: ...
    def __len__(self) -> int: ...
    def add(self, batch: dict[str, np.ndarray]) -> None: ...
    def sample(self, batch_size: int) -> dict[str, np.ndarray]: ...
    def state_dict(self) -> dict[str, np.ndarray]: ...
    def load_state_dict(self, state: dict[str, np.ndarray]) -> None: ...

# The learner's one-call check of frames with a known layout (csrc/wire/wire_gate.h);
# zrl.wire.Gate wraps it.
class FrameGate:
    def __init__(self, kind: int, max_bytes: int) -> None: ...
    def add(
        self, block: bytes, first: int, end: int, bounds: list[tuple[int, int, int, int]],
        marks: list[tuple[int, int, int, int, int]] = ..., finite: list[tuple[int, int, int]] = ...,
    ) -> int: ...
    def clear(self) -> None: ...
    def __len__(self) -> int: ...
    def check(self, frame: bytes | memoryview) -> tuple[int, int, int, int, int, int] | None: ...

class ZmqFrame:
    """A received message (buffer protocol, read-only), freed with its last view (a plain CPython type)."""

class MessageBase:
    """The fields of a received message, in C so that ZmqNative.drain makes messages without
    running Python; zrl.wire.Message subclasses it with its methods."""

    kind: Any
    sender_id: int
    seq: int
    policy_version: int
    meta: bytes | memoryview
    infos: tuple[Any, ...]
    nbytes: int
    _buf: Any
    _arrays: dict[str, np.ndarray] | None

class ZmqNative:
    """pyzmq's own libzmq reached from C++ (csrc/wire/zmq_native.h); zrl.transport.native() builds one."""

    def __init__(self, module: str, major: int, minor: int, patch: int) -> None: ...
    @property
    def library(self) -> str: ...
    @property
    def send_frame(self) -> Callable[..., int]:
        """send_frame(socket, frame, total, seq, policy_version, wait[, to, from, n]) -> 0 or the zmq errno;
        with (to, from, n), a frame that went out copied then gets frame[to:to+n] = frame[from:from+n]."""
    @property
    def drain(
        self,
    ) -> Callable[[int, FrameGate, int, int, int, list[Any], type[MessageBase], Any], tuple[list[Any], int]]:
        """drain(socket, gate, max, copy_below, wait_ms, layouts, message_type, kind) -> (items, unvouched):
        an item is (message, bindings) for a frame the gate vouched for, else its payload."""
