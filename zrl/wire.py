"""The zrl wire format under its public name: `zrl.wire` re-exports the protocol's
frame, message, layout, schema, gate and hello modules (`zrl.protocol`), so that code
and tools written against `zrl.wire.X` keep working. New code inside zrl imports from
`zrl.protocol` directly. docs/PROTOCOL.md gives the format byte by byte.
"""
from __future__ import annotations

from zrl.protocol.frame import (
    ALIGN,
    DESCRIPTOR,
    DESCRIPTOR_SIZE,
    DTYPE_CODES,
    DTYPES,
    HEADER,
    HEADER_SIZE,
    KIND_VALUES,
    MAGIC,
    MAX_ARRAYS,
    MAX_DIMS,
    MAX_VIEW_BYTES,
    NAME_BYTES,
    PROTOCOL_VERSION,
    Kind,
    Reason,
    WireError,
)
from zrl.protocol.gate import RECV_COPY_BELOW, Gate
from zrl.protocol.hello import BUSY, HelloInvalid, read_hello, short, show
from zrl.protocol.layout import REUSE_BYTES, SEND_ZERO_COPY_FROM, Cut, Layout, OutMessage, encode
from zrl.protocol.message import ArrayInfo, Message, decode
from zrl.protocol.schema import Dim, Field, Mark, Schema, check_bounds, check_finite, check_marks

__all__ = [
    "ALIGN",
    "DESCRIPTOR",
    "DESCRIPTOR_SIZE",
    "DTYPE_CODES",
    "DTYPES",
    "HEADER",
    "HEADER_SIZE",
    "KIND_VALUES",
    "MAGIC",
    "MAX_ARRAYS",
    "MAX_DIMS",
    "MAX_VIEW_BYTES",
    "NAME_BYTES",
    "PROTOCOL_VERSION",
    "RECV_COPY_BELOW",
    "REUSE_BYTES",
    "SEND_ZERO_COPY_FROM",
    "BUSY",
    "ArrayInfo",
    "Cut",
    "Dim",
    "Field",
    "Mark",
    "Gate",
    "HelloInvalid",
    "Kind",
    "Layout",
    "Message",
    "OutMessage",
    "Reason",
    "Schema",
    "WireError",
    "check_bounds",
    "check_finite",
    "check_marks",
    "decode",
    "encode",
    "read_hello",
    "short",
    "show",
]
