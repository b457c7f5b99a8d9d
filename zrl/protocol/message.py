"""Reading frames: `decode` checks everything a hostile peer could get wrong and
raises `WireError(reason, detail)`; receivers count rejections by `reason` and drop
the message. A `Message`'s arrays are numpy views over the received frame (no copy).
Its fields live in the C base type `zrl._core.MessageBase`, so that the learner's
C++ receive path (`zrl.protocol.gate`) makes Messages with no Python run per frame.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from zrl import _core
from zrl.protocol.frame import (
    DESCRIPTOR,
    DESCRIPTOR_SIZE,
    DTYPES,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_ARRAYS,
    MAX_DIMS,
    MAX_VIEW_BYTES,
    PROTOCOL_VERSION,
    Kind,
    Reason,
    WireError,
)

_KIND_OF: dict[int, Kind] = {int(k): k for k in Kind}


@dataclass(frozen=True)
class ArrayInfo:
    """One array of a frame, as its checked descriptor gives it."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class Message(_core.MessageBase):
    """A decoded frame. `arrays` are read-only numpy views over the frame, made on first use.

    Its fields (kind, sender_id, seq, policy_version, meta, infos, nbytes and the
    private _buf, _arrays) live in the C base type, so that `Gate.drain` makes the
    learner's messages in C++, with no Python run per message."""

    __slots__ = ()

    def __init__(self, kind, sender_id, seq, policy_version, meta, infos, buf, nbytes):
        self.kind = kind
        self.sender_id = sender_id
        self.seq = seq
        self.policy_version = policy_version
        self.meta = meta
        self.infos: tuple[ArrayInfo, ...] = infos
        self._buf = buf
        self._arrays: dict[str, np.ndarray] | None = None
        self.nbytes = nbytes

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            buf = self._buf
            # np.ndarray over the buffer: one call per array (frombuffer + reshape is two, and 3x slower);
            # decode has checked that every array lies inside the frame.
            self._arrays = {i.name: np.ndarray(i.shape, i.dtype, buf, i.offset) for i in self.infos}
        return self._arrays

    def json(self) -> dict[str, Any]:
        """The meta as a JSON object; a WireError(bad_meta) if it is not one."""
        try:
            obj = json.loads(bytes(self.meta).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise WireError(Reason.BAD_META, f"meta is not UTF-8 JSON: {e}") from None
        except RecursionError:  # (arrays nested thousands deep: json.loads recurses)
            raise WireError(Reason.BAD_META, "meta is nested too deeply") from None
        if not isinstance(obj, dict):
            raise WireError(Reason.BAD_META, "meta must be a JSON object")
        return obj

    def text(self) -> str:
        return bytes(self.meta).decode("utf-8", errors="replace")


# Validated descriptor blocks, keyed by their bytes: a stream of messages with
# one layout (the common case) pays for descriptor checks once.
_layout_cache: dict[bytes, tuple[tuple[ArrayInfo, ...], int, int]] = {}  # infos, first offset, end
_LAYOUT_CACHE_MAX = 256


def decode(frame, max_bytes: int = 1 << 30, allowed_kinds: frozenset[int] | None = None) -> Message:
    """Parses and checks one frame (bytes, memoryview or zmq.Frame); raises WireError."""
    buf = frame.buffer if hasattr(frame, "buffer") else frame
    n = len(buf)
    if n > max_bytes:
        raise WireError(Reason.TOO_LARGE, f"{n} bytes > cap {max_bytes}")
    if n < HEADER_SIZE:
        raise WireError(Reason.TOO_SHORT, f"{n} bytes < header {HEADER_SIZE}")
    magic, version, kind, sender_id, n_arrays, seq, policy_version, meta_len, flags, total = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise WireError(Reason.BAD_MAGIC, f"magic {magic!r}")
    if version != PROTOCOL_VERSION:
        raise WireError(Reason.BAD_VERSION, f"protocol version {version}, this side speaks {PROTOCOL_VERSION}")
    kind_e = _KIND_OF.get(kind)
    if kind_e is None:
        raise WireError(Reason.BAD_KIND, f"unknown kind {kind}")
    if allowed_kinds is not None and kind not in allowed_kinds:
        raise WireError(Reason.UNEXPECTED_KIND, f"kind {kind_e.name} not accepted here")
    if total != n:
        raise WireError(Reason.BAD_LENGTH, f"header says {total} bytes, frame has {n}")
    if flags != 0 or n_arrays > MAX_ARRAYS:
        raise WireError(Reason.BAD_HEADER, f"flags {flags}, {n_arrays} arrays (max {MAX_ARRAYS})")
    if (seq | policy_version) >> 63:  # (readers keep both as int64)
        raise WireError(Reason.BAD_HEADER, f"seq {seq} or policy_version {policy_version} is 2^63 or more")
    meta_off = HEADER_SIZE + DESCRIPTOR_SIZE * n_arrays
    data_start = meta_off + meta_len
    if data_start > n:
        raise WireError(Reason.BAD_LENGTH, f"descriptors and meta end at {data_start}, frame has {n} bytes")
    if n_arrays:
        key = bytes(buf[HEADER_SIZE:meta_off])
        hit = _layout_cache.get(key)
        if hit is None:
            infos = _parse_descriptors(buf, n_arrays)
            hit = (infos, min(i.offset for i in infos), max(i.offset + i.nbytes for i in infos))
            if len(_layout_cache) >= _LAYOUT_CACHE_MAX:
                _layout_cache.clear()
            _layout_cache[key] = hit
        infos, first, end = hit
        if first < data_start or end > n:  # per-frame bounds: cached layouts are frame-independent
            for i in infos:
                if i.offset < data_start or i.offset + i.nbytes > n:
                    raise WireError(Reason.BAD_LENGTH, f"array {i.name!r} bytes [{i.offset}, {i.offset + i.nbytes}) outside data [{data_start}, {n})")
    else:
        infos = ()
    meta = buf[meta_off:data_start]
    return Message(kind_e, sender_id, seq, policy_version, meta, infos, buf, n)


def _parse_descriptors(buf, n_arrays: int) -> tuple[ArrayInfo, ...]:
    infos = []
    seen = set()
    for i in range(n_arrays):
        raw_name, code, ndim, r16, r32, d0, d1, d2, d3, d4, d5, offset, nbytes = DESCRIPTOR.unpack_from(buf, HEADER_SIZE + i * DESCRIPTOR_SIZE)
        name_b = raw_name.rstrip(b"\0")
        try:
            name = name_b.decode("utf-8")
        except UnicodeDecodeError:
            raise WireError(Reason.BAD_DESCRIPTOR, f"array {i}: name is not UTF-8") from None
        if not name or b"\0" in name_b or name in seen:
            raise WireError(Reason.BAD_DESCRIPTOR, f"array {i}: empty, NUL-containing or duplicate name {name!r}")
        seen.add(name)
        if r16 or r32:
            raise WireError(Reason.BAD_DESCRIPTOR, f"array {name!r}: reserved bytes are not zero")
        dt = DTYPES.get(code)
        if dt is None:
            raise WireError(Reason.BAD_DTYPE, f"array {name!r}: unknown dtype code {code}")
        if ndim > MAX_DIMS:
            raise WireError(Reason.BAD_DESCRIPTOR, f"array {name!r}: {ndim} dims > {MAX_DIMS}")
        dims = (d0, d1, d2, d3, d4, d5)
        if any(dims[ndim:]):
            raise WireError(Reason.BAD_DESCRIPTOR, f"array {name!r}: unused dims are not zero")
        shape = dims[:ndim]
        if nbytes != dt.itemsize * math.prod(shape):
            raise WireError(Reason.BAD_LENGTH, f"array {name!r}: {nbytes} bytes for shape {shape} of {dt}")
        if not nbytes and dt.itemsize * math.prod(d for d in shape if d) > MAX_VIEW_BYTES:
            # Empty, but numpy would refuse the view (it multiplies the non-zero dims too).
            raise WireError(Reason.BAD_SHAPE, f"array {name!r}: shape {shape} of {dt} is past what an array can index")
        if offset % dt.itemsize:
            raise WireError(Reason.BAD_DESCRIPTOR, f"array {name!r}: offset {offset} not aligned to {dt.itemsize}")
        infos.append(ArrayInfo(name, dt, shape, offset, nbytes))
    return tuple(infos)
