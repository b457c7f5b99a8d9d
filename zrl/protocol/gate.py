"""The learner's receive-side check of data frames (`Gate`): decode, the algorithm's
schema and value rules, with a C++ fast path (`zrl._core.FrameGate`) that vouches for
frames of a layout already seen, and a C++ drain of a pyzmq socket
(`zrl.protocol.native`) that checks a burst without the GIL.
"""
from __future__ import annotations

import numpy as np
import zmq

from zrl import _core
from zrl.protocol.frame import DESCRIPTOR_SIZE, HEADER_SIZE, Kind, Reason, WireError
from zrl.protocol.message import ArrayInfo, Message, decode
from zrl.protocol.native import native, zmq_error
from zrl.protocol.schema import Schema

# Gate.drain copies a smaller message out of ZeroMQ into bytes and hands a larger one
# over as a view of ZeroMQ's own memory: a copy grows with the size and a view costs a
# fixed amount more, so they break even near here (bench/TRANSPORT.md has the figures).
RECV_COPY_BELOW = 8 << 10
_TRAJECTORY = Kind.TRAJECTORY  # (a module global is read faster than an enum member, in hot loops)


class Gate:
    """A receiver's checks of a data frame: `decode`, then, for TRAJECTORY frames (and
    GRADIENT frames, `set_gradient_schema`), the algorithm's schema and every per-element
    rule it declares (finite floats, ranges, norms, bounds, marks: `Schema.check_values`).
    Raises WireError; returns (message, bindings).

    The first frame of each layout (its descriptor block: names, dtypes, shapes,
    offsets) takes the Python path above. Once one passes, the layout goes to the C++
    `FrameGate` (csrc/wire/wire_gate.h) with the schema's rules, and later frames with
    the same descriptors are checked there in one call: header, bounds, finite floats,
    marks. The C++ check only vouches; a frame it does not accept takes the Python
    path, which gives the reason. A schema with rules the C++ gate does not have (float
    ranges: `Schema.vouchable` is False) keeps its frames on the Python path.

    `drain` receives a burst from a socket and checks it: with `native.native()`,
    C++ takes the burst from ZeroMQ and runs the FrameGate on it without the GIL.

    A learner that reads every value again when it joins chunks into a batch can leave
    the per-element rules of the schema's `at_join` fields (finite floats, bounds) to
    that join (`set_trajectory_schema(..., leave_to_join=True)`): the join checks each
    element as it copies it, and the receiver's thread never reads those values.
    """

    def __init__(self, max_bytes: int, allowed_kinds: frozenset[int], fast: bool = True):
        self.max_bytes = max_bytes
        self.allowed_kinds = allowed_kinds
        self.schema: Schema | None = None
        self.gradient_schema: Schema | None = None
        self._agreed = False  # a schema has been set: a missing one now means the algorithm takes no such frames
        self._at_join: frozenset[str] = frozenset()
        self._fast = None
        if fast and int(Kind.TRAJECTORY) in allowed_kinds:
            self._fast = _core.FrameGate(int(Kind.TRAJECTORY), max_bytes)
        self._layouts: list[tuple[tuple[ArrayInfo, ...], dict[str, int], bytes]] = []  # by FrameGate id
        self._blocks: set[bytes] = set()
        self._native_drain = None  # ZmqNative.drain, where native.native() is there
        if self._fast is not None:
            api = native()
            self._native_drain = api.drain if api is not None else None

    def set_trajectory_schema(self, schema: Schema | None, leave_to_join: bool = False) -> None:
        """The schema trajectories must follow, with its rules (None: the algorithm takes no
        trajectories, and they are refused as unexpected_kind). leave_to_join: the consumer
        joins every chunk with its schema's `at_join` rules checked (a stream learner's
        `Algorithm.collate`), so this gate leaves those fields' finite and bound rules to
        it; their marks stay here."""
        self.schema = schema
        self._agreed = True
        self._at_join = schema.join_fields if schema is not None and leave_to_join else frozenset()
        if self._fast is not None:
            self._fast.clear()
        self._layouts = []
        self._blocks.clear()

    def set_gradient_schema(self, schema: Schema | None) -> None:
        """The schema GRADIENT frames must follow (an actor's gradient: `Algorithm.gradient_schema`),
        or None: the algorithm takes none. They are always checked here, in Python."""
        self.gradient_schema = schema
        self._agreed = True

    def check(self, frame) -> tuple[Message, dict[str, int] | None]:
        """The message, and its schema bindings (None for a kind without a schema: STATS)."""
        buf = frame.buffer if hasattr(frame, "buffer") else frame
        fast = self._fast
        if fast is not None:
            hit = fast.check(buf)
            if hit is not None:
                return _vouched(self._layouts, buf, *hit)
        msg = decode(buf, self.max_bytes, self.allowed_kinds)
        if msg.kind != Kind.TRAJECTORY:
            return (msg, self._check_gradient(msg)) if msg.kind == Kind.GRADIENT else (msg, None)
        if self.schema is None:
            raise self._no_schema("trajectory")
        schema = self.schema
        bindings = schema.check(msg)
        schema.check_values(msg, bindings, self._at_join)
        if fast is not None and schema.vouchable and msg.infos:
            self._register(buf, msg, bindings)
        return msg, bindings

    def _check_gradient(self, msg: Message) -> dict[str, int]:
        schema = self.gradient_schema
        if schema is None:
            raise self._no_schema("gradient")
        bindings = schema.check(msg)
        schema.check_values(msg, bindings)
        return bindings

    def _no_schema(self, what: str) -> WireError:
        if not self._agreed:
            return WireError(Reason.NOT_READY, f"{what} before any hello agreed the specs")
        return WireError(Reason.UNEXPECTED_KIND, f"a {what} message, which this learner's algorithm does not take")

    def drain(self, sock, max_msgs: int, wait_ms: int = 0) -> list:
        """Up to max_msgs messages from a pyzmq socket, each checked: a list of
        (message, bindings) or of the WireError that rejected it. The first message is
        waited for up to wait_ms (0: not at all; -1: for ever), the rest not at all;
        an empty list when none came. With the C++ path, a first message that had to be
        waited for comes alone (the queue was empty: asking again would cost libzmq a
        poll, and the next message a wake-up of its pipe)."""
        native_drain = self._native_drain
        if native_drain is None:
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
        bounds, marks = self.schema.value_rules(bindings)
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
