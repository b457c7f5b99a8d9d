"""The zrl wire format: one ZeroMQ frame per message, never pickle.

    [header 48 B][descriptors 80 B x n][meta][pad][array 0][pad][array 1]...

The header (little-endian) carries magic, protocol version, message kind,
sender id, sequence number, policy version, the number of arrays, the meta
length, flags and the total length. Each descriptor names an array (32 bytes
of UTF-8), its dtype code, its shape (up to 6 dims) and where its bytes lie
(offset from the frame start, aligned to 64, and length). `meta` is UTF-8:
JSON for hello / hello-reply / stats-like messages, plain text for errors.
docs/PROTOCOL.md gives the layout byte by byte; tests/data holds golden frames.

One frame, not one frame per array: ZeroMQ's per-frame cost dominates small
messages (2 KB: ~400k msg/s as one frame, ~170k as two), and a sender that
builds its arrays in place inside the frame (`Layout`) sends it with no copy.

`decode` checks everything a hostile peer could get wrong and raises
`WireError(reason, detail)`; receivers count rejections by `reason` and drop
the message. Arrays are numpy views over the received frame (no copy).
"""
from __future__ import annotations

import enum
import json
import math
import struct
import sys
from collections import deque
from dataclasses import dataclass
from typing import Any, Collection, Iterable, Mapping

import numpy as np

from zrl import _core

MAGIC = b"ZRLW"
PROTOCOL_VERSION = 1
HEADER = struct.Struct("<4sHHIIQQIIQ")  # 48 bytes
DESCRIPTOR = struct.Struct("<32sBBHI6IQQ")  # 80 bytes
HEADER_SIZE = HEADER.size
# The header from seq on (seq, policy_version, meta_len, flags, total): what
# OutMessage.finish rewrites per message (csrc/zmq_native.cc stamps the same fields).
_HEADER_TAIL = struct.Struct("<QQIIQ")
_HEADER_TAIL_OFFSET = 16
DESCRIPTOR_SIZE = DESCRIPTOR.size
ALIGN = 64
MAX_DIMS = 6
MAX_ARRAYS = 64
MAX_VIEW_BYTES = np.iinfo(np.intp).max  # numpy's limit on the bytes an array's shape spans, empty or not
NAME_BYTES = 32
# Gate.drain copies a smaller message out of ZeroMQ into bytes and hands a larger one
# over as a view of ZeroMQ's own memory. A copy costs ~0.04 us per KB and a view ~0.2 us
# more than a small copy, so they break even at ~9 KB (measured on a 2-core EPYC; at
# 23 KB the view is 0.5 us cheaper). bench/TRANSPORT.md has the figures.
RECV_COPY_BELOW = 8 << 10
# An OutMessage frame from this size up lives in a `zrl._core.SendBuffer`, which
# transport.Pusher's C++ send hands to ZeroMQ without a copy and without pyzmq's
# zero-copy bookkeeping (a garbage-collector thread that takes the GIL for every
# sent frame). pyzmq copies frames below the same size (zmq.COPY_THRESHOLD).
SEND_ZERO_COPY_FROM = 64 << 10
REUSE_BYTES = 32 << 20  # a Layout tracks this many bytes of finished frames for reuse (2 to 64 frames)
assert HEADER_SIZE == 48 and DESCRIPTOR_SIZE == 80


class Kind(enum.IntEnum):
    HELLO = 1  # actor/server -> learner (or client -> agent server): meta JSON
    HELLO_REPLY = 2  # meta JSON; arrays: current weights
    TRAJECTORY = 3  # actor -> learner: the arrays an algorithm records
    WEIGHTS = 4  # learner -> actors: one float32 array "params"; header policy_version
    STATS = 5  # named float64 arrays (episode returns, client scalars) -> TensorBoard
    ERROR = 6  # meta: UTF-8 text, raised by the receiver with that text
    SHUTDOWN = 7  # learner -> actors: training is over, exit cleanly
    # Agent server (clients <-> `zrl serve`).
    ACT = 16  # client -> server: observation (+ reward, flags for the previous step)
    ACTION = 17  # server -> client: the action to take
    BYE = 18  # client -> server: disconnect


_TRAJECTORY = Kind.TRAJECTORY  # (a module global is read faster than an enum member, in hot loops)


KIND_VALUES = frozenset(int(k) for k in Kind)
_KIND_OF: dict[int, Kind] = {int(k): k for k in Kind}

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


class WireError(ValueError):
    def __init__(self, reason: Reason, detail: str):
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def _name_bytes(name: str) -> bytes:
    b = name.encode("utf-8")
    if not b or len(b) >= NAME_BYTES or b"\0" in b:
        raise ValueError(f"array name {name!r} must be 1..{NAME_BYTES - 1} UTF-8 bytes without NUL")
    return b


def _dtype_code(dt: np.dtype) -> int:
    code = DTYPE_CODES.get(np.dtype(dt).newbyteorder("<") if np.dtype(dt).byteorder == ">" else np.dtype(dt))
    if code is None:
        raise ValueError(f"dtype {dt} cannot cross the wire (allowed: {sorted(str(d) for d in DTYPES.values())})")
    return code


def _meta_bytes(meta: Any) -> bytes:
    if meta is None:
        return b""
    if isinstance(meta, (bytes, bytearray, memoryview)):
        return bytes(meta)
    if isinstance(meta, str):
        return meta.encode("utf-8")
    return json.dumps(meta, separators=(",", ":"), allow_nan=False).encode("utf-8")


# ---------------------------------------------------------------------------
# Encoding


def encode(
    kind: Kind,
    arrays: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]] = (),
    meta: Any = None,
    *,
    sender_id: int = 0,
    seq: int = 0,
    policy_version: int = 0,
) -> bytearray:
    """One frame holding `arrays` (copied in) and `meta` (dict -> JSON, str -> UTF-8)."""
    items = list(arrays.items()) if isinstance(arrays, Mapping) else list(arrays)
    meta_b = _meta_bytes(meta)
    specs = [(name, np.asarray(a).dtype, np.asarray(a).shape) for name, a in items]
    layout = Layout(kind, specs, meta_len=len(meta_b))
    buf = bytearray(layout.capacity)
    layout.write_header(buf, sender_id=sender_id, seq=seq, policy_version=policy_version, meta=meta_b)
    for (name, a), dt, shape, (off, nbytes) in zip(items, layout.dtypes, layout.shapes, layout.regions):
        if nbytes:
            # numpy writes straight into the frame, converting to dt (little-endian); a bytearray
            # slice assignment from another buffer copied it to a temporary first (2.7 MB: 171 -> ~90 us).
            np.frombuffer(buf, dt, nbytes // dt.itemsize, off).reshape(shape)[...] = a
    return buf


class Layout:
    """A precomputed frame layout for a fixed list of (name, dtype, shape).

    `allocate()` returns an `OutMessage` whose `.arrays` are writable numpy views
    inside one frame buffer: fill them in place and `finish()` gives the frame,
    so a sender pays no copy. An array whose leading dimension varies (a count
    of rows) is declared with its capacity and given its used rows at `finish`.
    """

    def __init__(self, kind: Kind, specs: list[tuple[str, Any, tuple[int, ...]]], meta_len: int = 0):
        if len(specs) > MAX_ARRAYS:
            raise ValueError(f"at most {MAX_ARRAYS} arrays per message, got {len(specs)}")
        self.kind = Kind(kind)
        self.names = [s[0] for s in specs]
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"duplicate array names in {self.names}")
        # Frames are little-endian: a big-endian dtype is sent as its little-endian twin
        # (a view of this dtype converts what is written into it; encode converts).
        self.dtypes = [np.dtype(s[1]).newbyteorder("<") for s in specs]
        self.shapes = [tuple(int(d) for d in s[2]) for s in specs]
        self._shapes_t = tuple(self.shapes)
        for name, shape in zip(self.names, self.shapes):
            if len(shape) > MAX_DIMS:
                raise ValueError(f"array {name!r}: at most {MAX_DIMS} dims, got shape {shape}")
            if any(d < 0 or d > 0xFFFFFFFF for d in shape):
                raise ValueError(f"array {name!r}: bad shape {shape}")
        self.codes = [_dtype_code(dt) for dt in self.dtypes]
        self.name_bytes = [_name_bytes(n) for n in self.names]
        self.meta_len = meta_len
        self.meta_offset = HEADER_SIZE + DESCRIPTOR_SIZE * len(specs)
        off = _align(self.meta_offset + meta_len)
        self.regions: list[tuple[int, int]] = []
        for dt, shape in zip(self.dtypes, self.shapes):
            nbytes = dt.itemsize * math.prod(shape)
            self.regions.append((off, nbytes))
            off = _align(off + nbytes)
        # Per array with dims: its offset, its bytes per index of the leading dim, and that dim (OutMessage.copy_row).
        self._rows = {
            name: (o, dt.itemsize * math.prod(shape[1:]), shape[0])
            for name, dt, shape, (o, _) in zip(self.names, self.dtypes, self.shapes, self.regions)
            if shape
        }
        self.capacity = self.regions[-1][0] + self.regions[-1][1] if self.regions else self.meta_offset + meta_len
        # Packed descriptors and the end of the last array, per list of shapes:
        # a sender that cuts the same rows again packs nothing.
        self._blocks: dict[tuple, tuple[bytes, int]] = {}
        # `cut`: the rows a sender cuts (a tuple of its `rows` items) -> Cut.
        self._cuts: dict[tuple, Cut] = {}
        self._kind = int(self.kind)
        self._n = len(specs)
        # Finished frames, oldest first (the order ZeroMQ sends and releases them):
        # `allocate` reuses the newest one nothing holds any more, so a sender with
        # frames queued in ZeroMQ needs no fresh (zeroed, page-faulting) buffer.
        self._finished: deque[OutMessage] = deque(maxlen=max(2, min(64, REUSE_BYTES // max(self.capacity, 1))))

    def _block(self, shapes: tuple) -> tuple[bytes, int]:
        hit = self._blocks.get(shapes)
        if hit is None:
            block = bytearray(DESCRIPTOR_SIZE * len(shapes))
            end = 0
            for i, shape in enumerate(shapes):
                off = self.regions[i][0]
                nbytes = self.dtypes[i].itemsize * math.prod(shape)
                dims = list(shape) + [0] * (MAX_DIMS - len(shape))
                DESCRIPTOR.pack_into(block, i * DESCRIPTOR_SIZE, self.name_bytes[i], self.codes[i], len(shape), 0, 0, *dims, off, nbytes)
                end = max(end, off + nbytes)
            if len(self._blocks) >= 256:
                self._blocks.clear()
            hit = self._blocks[shapes] = (bytes(block), end)
        return hit

    def cut(self, rows: Mapping[str, int] | None = None) -> "Cut":
        """The frame that sends `rows` rows of each variable array named (the others whole):
        its packed descriptors and length, for `OutMessage.seal` / `finish`. Cached; a
        sender that sends the same few cuts again and again keeps them (ImpalaRecorder)."""
        key = tuple(rows.items()) if rows else ()
        hit = self._cuts.get(key)
        if hit is not None:
            return hit
        for n, r in key:
            if n not in self.names:
                raise ValueError(f"rows names {n!r}, which is not an array of this layout ({self.names})")
            cap = self.shapes[self.names.index(n)]
            if not cap or not 0 <= r <= cap[0]:
                raise ValueError(f"{n}: {r} rows exceed the layout's capacity {cap[0] if cap else 0}")
        rows = dict(key)
        shapes = tuple((rows[n], *s[1:]) if n in rows else s for n, s in zip(self.names, self.shapes))
        block, end = self._block(shapes)
        if len(self._cuts) >= 256:
            self._cuts.clear()
        hit = self._cuts[key] = Cut(self, block, max(self.meta_offset, end))
        return hit

    def write_header(self, buf, *, sender_id: int, seq: int, policy_version: int, meta: bytes = b"", shapes=None) -> int:
        """Writes header, descriptors and meta into `buf`; returns the frame length."""
        if not shapes:
            shapes = self._shapes_t
        elif type(shapes) is not tuple:
            shapes = tuple(tuple(int(d) for d in s) for s in shapes)
        block, end = self._block(shapes)
        total = max(self.meta_offset + len(meta), end)
        if block:
            memoryview(buf)[HEADER_SIZE : HEADER_SIZE + len(block)] = block
        HEADER.pack_into(
            buf, 0, MAGIC, PROTOCOL_VERSION, int(self.kind), sender_id, len(shapes), seq, policy_version, len(meta), 0, total
        )
        if meta:
            buf[self.meta_offset : self.meta_offset + len(meta)] = meta
        return total

    def allocate(self) -> "OutMessage":
        """A frame to fill: the oldest finished one if nothing (ZeroMQ included) holds its frame any more, else a new one.

        A reused frame keeps its last contents wherever the caller does not
        write (the bytes between arrays stay zero). A Layout serves one thread.
        """
        finished = self._finished
        if not finished:
            return OutMessage(self)
        if finished[-1].reusable():
            # The frame sent last is free already (pyzmq copies small frames): reuse it,
            # so a stream of small messages writes one cache-hot buffer.
            m = finished.pop()
        elif finished[0].reusable():
            # ZeroMQ releases frames in the order it sent them, so the free ones are the
            # oldest: take the newest of those (the one most likely still in cache).
            lo, hi = 0, len(finished) - 1  # finished[lo] is free, finished[hi] is not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if finished[mid].reusable():
                    lo = mid
                else:
                    hi = mid
            m = finished[lo]
            del finished[lo]
        else:
            return OutMessage(self)
        m._done = False
        m._sealed = None
        return m


    def row_span(self, name: str, dst: int, src: int) -> tuple[int, int, int]:
        """(to, from, n): the frame offsets of arrays[name][dst] and arrays[name][src],
        and a row's bytes."""
        off, n, rows = self._rows[name]
        if not (0 <= dst < rows and 0 <= src < rows):
            raise IndexError(f"{name}: rows {dst} and {src} must lie in 0..{rows - 1}")
        return off + dst * n, off + src * n, n


class Cut:
    """The rows of each variable array a frame sends, as `Layout.cut` packed them."""

    __slots__ = ("layout", "block", "total")

    def __init__(self, layout: Layout, block: bytes, total: int):
        self.layout = layout
        self.block = block  # the packed descriptors
        self.total = total  # the frame's length


class OutMessage:
    """A frame being filled in place; see `Layout`."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.send_buffer = None
        if layout.capacity >= SEND_ZERO_COPY_FROM:
            self.send_buffer = _core.SendBuffer(layout.capacity)  # zeroed; see SEND_ZERO_COPY_FROM
            self.buffer = np.frombuffer(self.send_buffer, dtype=np.uint8)
        else:
            self.buffer = np.zeros(layout.capacity, dtype=np.uint8)
        self.arrays: dict[str, np.ndarray] = {}
        for name, dt, shape, (off, nbytes) in zip(layout.names, layout.dtypes, layout.shapes, layout.regions):
            self.arrays[name] = self.buffer[off : off + nbytes].view(dt).reshape(shape)
        self._done = False
        self._block: bytes | None = None  # the descriptor block last written into the buffer
        self._sender_id = -1  # and the sender id in its header
        self._sealed: Cut | None = None  # the Cut of the last seal, until allocate hands the frame out again
        self._total = 0
        self._bytes = memoryview(self.buffer)  # (row_copier's: made before _idle_refs counts it)
        self._row_views: dict[tuple, tuple[memoryview, memoryview]] = {}
        self._idle_refs = sys.getrefcount(self.buffer)  # the buffer's references from this object alone

    def reusable(self) -> bool:
        """Whether nothing holds this message's frame any more, ZeroMQ included: a
        sender may write its next message into it in place, as a small frame allows as
        soon as it is sent (it goes out copied)."""
        # Every memoryview or numpy view of the buffer (the frame pyzmq is still
        # sending, a caller's array) holds a reference to it: none left means unused.
        # A frame sent from C++ is counted in its SendBuffer instead.
        return sys.getrefcount(self.buffer) == self._idle_refs and (self.send_buffer is None or not self.send_buffer.in_flight)

    def row_copier(self, name: str, dst: int, src: int) -> tuple[memoryview, memoryview]:
        """(to, from): the bytes of arrays[name][dst] and arrays[name][src], so that
        `to[:] = from` copies the row, for a fraction of numpy's indexing cost (a
        recorder's bootstrap row at each chunk boundary). The views are this
        message's own: they do not count against `reusable`."""
        views = self._row_views.get((name, dst, src))
        if views is None:
            to, frm, n = self.layout.row_span(name, dst, src)
            mv = self._bytes
            before = sys.getrefcount(self.buffer)
            views = self._row_views[(name, dst, src)] = (mv[to : to + n], mv[frm : frm + n])
            self._idle_refs += sys.getrefcount(self.buffer) - before  # (each view holds the buffer)
        return views

    def seal(self, sender_id: int, rows: "Cut | Mapping[str, int] | None" = None) -> int:
        """`finish` but for the header's per-message fields (seq, policy_version, total),
        which the caller writes: transport.Pusher has C++ stamp them as it sends.
        `rows` is a mapping as for `finish`, or a `Layout.cut` of this message's layout.
        Returns the frame's length."""
        layout = self.layout
        if rows.__class__ is Cut:
            cut = rows
            if cut.layout is not layout:
                raise ValueError("rows is a Cut of another Layout: cut this message's layout")
        else:
            cut = layout.cut(rows)
        block = cut.block
        if self._block is not block or self._sender_id != sender_id:
            # A reused frame cut to the same rows for the same sender keeps its descriptors
            # and its header (but for seq, policy_version and total, written per message).
            buf = self.buffer
            if block:
                memoryview(buf)[HEADER_SIZE : HEADER_SIZE + len(block)] = block
            HEADER.pack_into(buf, 0, MAGIC, PROTOCOL_VERSION, layout._kind, sender_id, layout._n, 0, 0, 0, 0, cut.total)
            self._block = block
            self._sender_id = sender_id
        if not self._done:
            self._done = True
            layout._finished.append(self)
        self._total = cut.total
        self._sealed = cut
        return cut.total

    def finish(self, *, sender_id: int, seq: int, policy_version: int, rows: "Cut | Mapping[str, int] | None" = None) -> memoryview:
        """Writes the header; `rows` gives the used leading dimension of variable arrays. Returns the frame.

        The frame is a view of this message's buffer: write no more into this
        message after `finish`. Once the frame (and every view of it) is gone,
        `Layout.allocate` hands the buffer out again.
        """
        total = self.seal(sender_id, rows)
        _HEADER_TAIL.pack_into(self.buffer, _HEADER_TAIL_OFFSET, seq, policy_version, 0, 0, total)
        return memoryview(self.buffer)[:total]

    def frame(self) -> memoryview:
        """The frame as the last `finish` (or transport.Pusher's send) left it."""
        return memoryview(self.buffer)[: self._total]


# ---------------------------------------------------------------------------
# Decoding


@dataclass(frozen=True)
class ArrayInfo:
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


# ---------------------------------------------------------------------------
# Schemas: what an algorithm's messages must contain


Dim = int | str  # an int, or a symbol such as "T", "K", "M" or "T+1"


@dataclass(frozen=True)
class Field:
    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]


class Schema:
    """The arrays a message kind must carry: names, dtypes and shapes with symbols.

    Symbols are bound by `fixed` (e.g. T from the config) or by the first
    field that uses them (e.g. K, the sender's number of envs); `bounds`
    limits free symbols. `check` raises WireError or returns the bindings.
    """

    def __init__(self, fields: Iterable[Field], fixed: Mapping[str, int] | None = None, bounds: Mapping[str, tuple[int, int]] | None = None):
        self.fields = {f.name: Field(f.name, np.dtype(f.dtype), tuple(f.shape)) for f in fields}
        self.fixed = dict(fixed or {})
        self.bounds = dict(bounds or {})
        # Accepted layouts by id of decode's cached infos tuple (kept alive here, so the id
        # stays its own): hashing 8 frozen dataclasses per message costs more than the check.
        self._ok_layouts: dict[int, tuple[tuple[ArrayInfo, ...], dict[str, int]]] = {}

    def check(self, msg: Message) -> dict[str, int]:
        hit = self._ok_layouts.get(id(msg.infos))
        if hit is not None and hit[0] is msg.infos:
            return hit[1]
        got = {i.name: i for i in msg.infos}
        missing = [n for n in self.fields if n not in got]
        if missing:
            raise WireError(Reason.MISSING_FIELD, f"missing {missing}")
        extra = [n for n in got if n not in self.fields]
        if extra:
            raise WireError(Reason.UNKNOWN_FIELD, f"unexpected {extra}")
        env = dict(self.fixed)
        for name, f in self.fields.items():
            info = got[name]
            if info.dtype != f.dtype:
                raise WireError(Reason.BAD_DTYPE, f"{name}: dtype {info.dtype}, expected {f.dtype}")
            if len(info.shape) != len(f.shape):
                raise WireError(Reason.BAD_SHAPE, f"{name}: shape {info.shape}, expected {self.describe(f)}")
            for d, want in zip(info.shape, f.shape):
                if isinstance(want, int):
                    if d != want:
                        raise WireError(Reason.BAD_SHAPE, f"{name}: shape {info.shape}, expected {self.describe(f)}")
                    continue
                sym, plus = _parse_dim(want)
                value = d - plus
                if sym in env:
                    if env[sym] != value:
                        raise WireError(Reason.BAD_SHAPE, f"{name}: shape {info.shape}, expected {self.describe(f)} with {sym}={env[sym]}")
                else:
                    lo, hi = self.bounds.get(sym, (0, 1 << 31))
                    if not lo <= value <= hi:
                        raise WireError(Reason.BAD_SHAPE, f"{name}: {sym}={value} outside [{lo}, {hi}]")
                    env[sym] = value
        if len(self._ok_layouts) >= 64:
            self._ok_layouts.clear()
        self._ok_layouts[id(msg.infos)] = (msg.infos, env)
        return env

    def describe(self, f: Field) -> str:
        return "(" + ", ".join(str(self.fixed.get(d, d)) if isinstance(d, str) else str(d) for d in f.shape) + ")"


class Gate:
    """A receiver's checks of a data frame: `decode`, then, for TRAJECTORY frames, the
    algorithm's schema, finite floats (`check_finite`: for every algorithm) and the
    algorithm's value checks. Raises WireError; returns (message, bindings).

    The first frame of each layout (its descriptor block: names, dtypes, shapes,
    offsets) takes the Python path above. Once one passes, the layout goes to the C++
    `FrameGate` (csrc/wire_gate.h) with the algorithm's value rules (`value_bounds`
    and `value_marks`), and later frames with the same descriptors are checked there
    in one call: header, bounds, finite floats, marks. The C++ check only vouches; a frame it does not
    accept takes the Python path, which gives the reason. An algorithm whose checks
    are more than those rules (`Algorithm.gate_rules` is None) stays on the Python path.

    `drain` receives a burst from a socket and checks it: with `transport.native()`,
    C++ takes the burst from ZeroMQ and runs the FrameGate on it without the GIL.

    A learner that reads every value again when it joins chunks into a batch can leave
    the per-element rules of those arrays (finite floats, `value_bounds`) to that join
    (`set_trajectory_checks`' at_join; `Algorithm.checked_at_join`): the join checks
    each element as it copies it, and the receiver's thread never reads the values.
    """

    def __init__(self, max_bytes: int, allowed_kinds: frozenset[int], fast: bool = True):
        self.max_bytes = max_bytes
        self.allowed_kinds = allowed_kinds
        self.schema: Schema | None = None
        self._check_values = None
        self._value_rules = None
        self._at_join: frozenset[str] = frozenset()
        self._fast = None
        if fast and int(Kind.TRAJECTORY) in allowed_kinds:
            self._fast = _core.FrameGate(int(Kind.TRAJECTORY), max_bytes)
        self._layouts: list[tuple[tuple[ArrayInfo, ...], dict[str, int], bytes]] = []  # by FrameGate id
        self._blocks: set[bytes] = set()
        self._native_drain = None  # ZmqNative.drain, where transport.native() is there
        if self._fast is not None:
            from zrl import transport

            native = transport.native()
            self._native_drain = native.drain if native is not None else None

    def set_trajectory_checks(self, schema: "Schema", check_values, value_rules, at_join=frozenset()) -> None:
        """check_values(msg, bindings) raises WireError. value_rules(bindings) gives
        (bounds, marks): {array: bound} (every element, read as unsigned, < bound) and
        [(index, marked, excluded)] (see `check_marks`), either None, that check *all*
        of check_values; pass value_rules=None when check_values checks anything more
        (`Algorithm.gate_rules` says which).

        at_join: arrays whose bounds and finite-float rules this gate leaves to the
        consumer, which checks them as it copies them (`Algorithm.collate`); their marks
        stay here. Only with value_rules: check_values is otherwise checked whole."""
        self.schema, self._check_values, self._value_rules = schema, check_values, value_rules
        self._at_join = frozenset(at_join) if value_rules is not None else frozenset()
        if self._fast is not None:
            self._fast.clear()
        self._layouts = []
        self._blocks.clear()

    def check(self, frame) -> tuple[Message, dict[str, int] | None]:
        """The message, and its schema bindings (None for a kind other than TRAJECTORY)."""
        buf = frame.buffer if hasattr(frame, "buffer") else frame
        fast = self._fast
        if fast is not None:
            hit = fast.check(buf)
            if hit is not None:
                return _vouched(self._layouts, buf, *hit)
        msg = decode(buf, self.max_bytes, self.allowed_kinds)
        if msg.kind != Kind.TRAJECTORY:
            return msg, None
        if self.schema is None:
            raise WireError(Reason.NOT_READY, "trajectory before any hello agreed the specs")
        bindings = self.schema.check(msg)
        at_join = self._at_join
        check_finite(msg, at_join)
        if at_join:
            bounds, marks = self._value_rules(bindings)
            if bounds:
                check_bounds(msg, {name: b for name, b in bounds.items() if name not in at_join})
            if marks:
                check_marks(msg, marks)
        else:
            self._check_values(msg, bindings)
        if fast is not None and self._value_rules is not None and msg.infos:
            self._register(buf, msg, bindings)
        return msg, bindings

    def drain(self, sock, max_msgs: int, wait_ms: int = 0) -> list:
        """Up to max_msgs messages from a pyzmq socket, each checked: a list of
        (message, bindings) or of the WireError that rejected it. The first message is
        waited for up to wait_ms (0: not at all; -1: for ever), the rest not at all;
        an empty list when none came. With the C++ path, a first message that had to be
        waited for comes alone (the queue was empty: asking again would cost libzmq a
        poll, and the next message a wake-up of its pipe)."""
        native_drain = self._native_drain
        if native_drain is None:
            import zmq

            if wait_ms and not sock.poll(None if wait_ms < 0 else wait_ms, zmq.POLLIN):
                return []
            frames = []
            for _ in range(max_msgs):
                try:
                    frames.append(sock.recv(zmq.NOBLOCK, copy=False))
                except zmq.Again:
                    break
            return [self._checked(f) for f in frames]
        try:
            # C++ makes each vouched frame's (Message, bindings) with the table as it was
            # when the burst came in (a registration below that takes over a slot copies
            # the list, so this one stays as it was).
            burst, unvouched = native_drain(sock.underlying, self._fast, max_msgs, RECV_COPY_BELOW, wait_ms,
                                            self._layouts, Message, _TRAJECTORY)
        except OSError as e:  # as pyzmq's recv would raise it
            from zrl.transport import zmq_error

            raise zmq_error(e.errno) from None
        if unvouched:  # a new layout, another kind, or a frame the FrameGate refused: Python's checks
            burst = [item if type(item) is tuple else self._checked(item) for item in burst]
        return burst

    def _checked(self, frame):
        try:
            return self.check(frame)
        except WireError as e:
            return e

    def _register(self, buf, msg: Message, bindings: dict[str, int]) -> None:
        block = bytes(buf[HEADER_SIZE : HEADER_SIZE + DESCRIPTOR_SIZE * len(msg.infos)])
        if block in self._blocks:
            return
        bounds, marks = self._value_rules(bindings)
        if bounds is None and marks is None:
            return
        infos = {i.name: i for i in msg.infos}
        at_join = self._at_join
        rules = [(infos[n].offset, infos[n].nbytes // infos[n].dtype.itemsize, infos[n].dtype.itemsize, int(b))
                 for n, b in (bounds or {}).items() if n not in at_join]
        finite = [(i.offset, i.nbytes // i.dtype.itemsize, i.dtype.itemsize) for i in msg.infos
                  if i.dtype.kind == "f" and i.nbytes and i.name not in at_join]
        mark_rules = []
        for index, marked, excluded in marks or ():
            i, m, x = infos[index], infos[marked], infos[excluded]
            if i.dtype != np.int32 or m.dtype.itemsize != 1 or x.dtype.itemsize != 1 or m.nbytes != x.nbytes:
                return  # not a rule the C++ gate knows: this layout stays on the Python path
            mark_rules.append((i.offset, i.nbytes // 4, m.offset, x.offset, m.nbytes))
        first = min(i.offset for i in msg.infos)
        end = max(i.offset + i.nbytes for i in msg.infos)
        layout = self._fast.add(block, first, end, rules, mark_rules, finite)
        if layout == len(self._layouts):
            self._layouts.append((msg.infos, bindings, block))
        else:  # a full table: this slot's layout is forgotten, in a new list (see `drain`)
            self._blocks.discard(self._layouts[layout][2])
            self._layouts = self._layouts.copy()
            self._layouts[layout] = (msg.infos, bindings, block)
        self._blocks.add(block)


def _vouched(layouts, buf, layout, sender_id, seq, policy_version, meta_offset, meta_len):
    """The message (and bindings) of a frame the FrameGate vouched for with `layout`."""
    infos, bindings, _ = layouts[layout]
    meta = buf[meta_offset : meta_offset + meta_len] if meta_len else b""
    return Message(Kind.TRAJECTORY, sender_id, seq, policy_version, meta, infos, buf, len(buf)), bindings


def check_finite(msg: Message, skip: Collection[str] = ()) -> None:
    """WireError(bad_value) if a floating-point array (other than those in skip) holds a NaN
    or an infinity: in a trajectory, one such reward or observation turns every weight NaN
    at the next update."""
    for info in msg.infos:
        if info.dtype.kind == "f" and info.nbytes and info.name not in skip and not np.isfinite(msg.arrays[info.name]).all():
            raise WireError(Reason.BAD_VALUE, f"{info.name} holds a NaN or an infinity")


def check_bounds(msg: Message, bounds: Mapping[str, int]) -> None:
    """WireError(bad_value) unless every element of each named integer array, read as
    unsigned (so a negative one reads as huge), is below its bound."""
    for name, bound in bounds.items():
        a = msg.arrays[name]
        if a.size and int(a.view(_UNSIGNED[a.dtype.itemsize]).max()) >= bound:
            raise WireError(Reason.BAD_VALUE, f"{name} outside [0, {bound})")


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def check_marks(msg: Message, marks) -> None:
    """WireError(bad_value) unless, for each (index, marked, excluded): the integer array
    `index` lists, in increasing order, exactly the flat positions where `marked` (an array
    of bytes, e.g. bool) is non-zero, and `excluded` is zero at each of them. IMPALA: each
    truncated step has its one final observation, and no step is truncated and terminated."""
    for index, marked, excluded in marks:
        a = msg.arrays
        where = np.flatnonzero(a[marked].reshape(-1).view(np.uint8))
        idx = a[index].reshape(-1)
        if idx.shape != where.shape or not np.array_equal(idx.view(_UNSIGNED[idx.dtype.itemsize]), where):
            raise WireError(Reason.BAD_VALUE, f"{index} must list each step where {marked} is set, once and in order")
        if a[excluded].reshape(-1).view(np.uint8)[where].any():
            raise WireError(Reason.BAD_VALUE, f"a step both {marked} and {excluded}")


class HelloInvalid(ValueError):
    """A hello every receiver refuses (not a JSON object, another protocol, bad specs)."""


def read_hello(msg: Message, receiver: str):
    """A hello's meta and its (obs, action) specs, after the checks the learner and the
    agent server both make; HelloInvalid says what is wrong. Role checks are the caller's."""
    from zrl import spaces

    try:
        hello = msg.json()
    except WireError as e:
        raise HelloInvalid(f"hello meta is not a JSON object: {e.detail}") from None
    if hello.get("protocol") != PROTOCOL_VERSION:
        raise HelloInvalid(f"protocol {hello.get('protocol')!r} not supported ({receiver} speaks {PROTOCOL_VERSION})")
    try:
        obs = spaces.from_json(hello.get("obs_space"))
        action = spaces.from_json(hello.get("action_space"))
    except spaces.SpecError as e:
        raise HelloInvalid(f"bad space spec: {e}") from None
    return hello, obs, action


def _parse_dim(d: str) -> tuple[str, int]:
    if "+" in d:
        sym, plus = d.split("+", 1)
        return sym.strip(), int(plus)
    return d.strip(), 0
