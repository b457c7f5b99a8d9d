"""The zrl wire format: one ZeroMQ frame per message, never pickle.

    [header 48 B][descriptors 80 B x n][meta][pad][array 0][pad][array 1]...

The header (little-endian) carries magic, protocol version, message kind,
sender id, sequence number, policy version, the number of arrays, the meta
length, flags and the total length. Each descriptor names an array (32 bytes
of UTF-8), its dtype code, its shape (up to 6 dims) and where its bytes lie
(offset from the frame start, aligned to 64, and length). `meta` is UTF-8:
JSON for hello / hello-reply / stats-like messages, plain text for errors.
docs/PROTOCOL.md gives the layout byte by byte; tests/data holds golden frames.
This module defines those layouts, the message kinds, the dtype allow-list and
the reasons a frame is rejected; `message` reads frames and `layout` writes them.

One frame, not one frame per array: ZeroMQ's per-frame cost dominates small
messages (bench/TRANSPORT.md), and a sender that builds its arrays in place
inside the frame (`Layout`) sends it with no copy.
"""
from __future__ import annotations

import enum
import struct

import numpy as np

MAGIC = b"ZRLW"
PROTOCOL_VERSION = 1
HEADER = struct.Struct("<4sHHIIQQIIQ")  # 48 bytes
DESCRIPTOR = struct.Struct("<32sBBHI6IQQ")  # 80 bytes
HEADER_SIZE = HEADER.size
DESCRIPTOR_SIZE = DESCRIPTOR.size
ALIGN = 64
MAX_DIMS = 6
MAX_ARRAYS = 64
MAX_VIEW_BYTES = np.iinfo(np.intp).max  # numpy's limit on the bytes an array's shape spans, empty or not
NAME_BYTES = 32
assert HEADER_SIZE == 48 and DESCRIPTOR_SIZE == 80


class Kind(enum.IntEnum):
    HELLO = 1  # actor/server -> learner (or client -> agent server): meta JSON
    HELLO_REPLY = 2  # meta JSON; arrays: current weights
    TRAJECTORY = 3  # actor -> learner: the arrays an algorithm records
    WEIGHTS = 4  # learner -> actors: one float32 array "params"; header policy_version
    STATS = 5  # named float64 arrays (episode returns, client scalars) -> TensorBoard
    ERROR = 6  # meta: UTF-8 text, raised by the receiver with that text
    SHUTDOWN = 7  # learner -> actors: training is over, exit cleanly
    GRADIENT = 8  # actor -> learner: a gradient computed on the actor's rollout (A3C); header policy_version
    # Agent server (clients <-> `zrl serve`).
    ACT = 16  # client -> server: observation (+ reward, flags for the previous step)
    ACTION = 17  # server -> client: the action to take
    BYE = 18  # client -> server: disconnect


KIND_VALUES = frozenset(int(k) for k in Kind)

# dtype code <-> numpy dtype. The allow-list: anything else is bad_dtype.
DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.bool_),
    2: np.dtype(np.uint8),
    3: np.dtype(np.int8),
    4: np.dtype("<i2"),
    5: np.dtype("<i4"),
    6: np.dtype("<i8"),
    7: np.dtype("<f2"),
    8: np.dtype("<f4"),
    9: np.dtype("<f8"),
    10: np.dtype("<u2"),
    11: np.dtype("<u4"),
}
DTYPE_CODES: dict[np.dtype, int] = {dt: code for code, dt in DTYPES.items()}


class Reason(str, enum.Enum):
    """Why a message was rejected; each is a counted metric."""

    TOO_SHORT = "too_short"
    TOO_LARGE = "too_large"
    BAD_MAGIC = "bad_magic"
    BAD_VERSION = "bad_version"
    BAD_KIND = "bad_kind"
    BAD_HEADER = "bad_header"
    BAD_DESCRIPTOR = "bad_descriptor"
    BAD_DTYPE = "bad_dtype"
    BAD_LENGTH = "bad_length"
    BAD_META = "bad_meta"
    MISSING_FIELD = "missing_field"
    UNKNOWN_FIELD = "unknown_field"
    BAD_SHAPE = "bad_shape"
    UNEXPECTED_KIND = "unexpected_kind"
    BAD_VALUE = "bad_value"
    NOT_READY = "not_ready"
    UNKNOWN_SENDER = "unknown_sender"  # a sender id no hello reply handed out
    FUTURE_VERSION = "future_version"  # a policy version the learner has not reached


class WireError(ValueError):
    """A frame a receiver refuses: `reason` is the counted metric, `detail` says what is wrong."""

    def __init__(self, reason: Reason, detail: str):
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
