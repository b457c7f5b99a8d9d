"""Writing frames: `encode` copies arrays into a new frame, and a `Layout` lays out a
fixed list of arrays once so that a sender fills them in place inside the frame
(`OutMessage`) and sends it with no copy. A `Cut` is a layout's frame sent with fewer
rows of its variable arrays. Frames keep the format of `zrl.protocol.frame`;
`zrl.protocol.native.Pusher` sends them from C++.
"""
from __future__ import annotations

import json
import math
import struct
import sys
from collections import deque
from typing import Any, Iterable, Mapping

import numpy as np

from zrl import _core
from zrl.protocol.frame import (
    ALIGN,
    DESCRIPTOR,
    DESCRIPTOR_SIZE,
    DTYPE_CODES,
    DTYPES,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_ARRAYS,
    MAX_DIMS,
    NAME_BYTES,
    PROTOCOL_VERSION,
    Kind,
)

# The header from seq on (seq, policy_version, meta_len, flags, total): what
# OutMessage.finish rewrites per message (csrc/wire/zmq_native.cc stamps the same fields).
_HEADER_TAIL = struct.Struct("<QQIIQ")
_HEADER_TAIL_OFFSET = 16

# An OutMessage frame from this size up lives in a `zrl._core.SendBuffer`, which
# native.Pusher's C++ send hands to ZeroMQ without a copy and without pyzmq's
# zero-copy bookkeeping (a garbage-collector thread that takes the GIL for every
# sent frame). pyzmq copies frames below the same size (zmq.COPY_THRESHOLD).
SEND_ZERO_COPY_FROM = 64 << 10
REUSE_BYTES = 32 << 20  # a Layout tracks this many bytes of finished frames for reuse (2 to 64 frames)


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
            # slice assignment from another buffer would copy it to a temporary first.
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
        which the caller writes: native.Pusher has C++ stamp them as it sends.
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
        """The frame as the last `finish` (or native.Pusher's send) left it."""
        return memoryview(self.buffer)[: self._total]

