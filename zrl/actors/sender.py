"""Sender: frames an actor's messages and sends them on the actor's link to the learner.

A recorder (an algorithm's) fills a message in place and hands it here; the
Sender stamps it with the actor's sender id and a running sequence number and
sends it through the link's current `Pusher` if it can go without waiting.
A `ChunkSender` is the chunk boundary of a recorder that reuses one frame: it
sends the chunk and copies its last observation row to the first row of the
next chunk, in one C++ call where the pusher has the native path.
Algorithms reach sockets only through this class.
"""
from __future__ import annotations

from zrl import wire


class Sender:
    """Frames an actor's messages: its sender id (the learner's, through the link) and a
    running sequence number.

    With a `link` (the actor's LearnerLink, or anything whose `pusher` is a
    transport.Pusher), `finish` also sends the message through the link's current
    pusher if it can go without waiting, and then returns None; else it returns
    the frame, for the caller to send (and wait, or drop) as any other.
    """

    def __init__(self, sender_id: int = 0, link=None):
        self._sender_id = sender_id
        self.seq = 0
        self.link = link
        self.id_from = link  # whose `sender_id` frames carry (a LearnerLink: the learner's id for us)

    @property
    def sender_id(self) -> int:
        """The id the learner handed out (through `id_from`), else the one given."""
        return self.id_from.sender_id if self.id_from is not None else self._sender_id

    def finish(self, msg: wire.OutMessage, policy_version: int, rows: "wire.Cut | dict[str, int] | None" = None):
        self.seq += 1
        pusher = self.link.pusher if self.link is not None else None
        if pusher is not None:
            return pusher.send(msg, self.sender_id, self.seq, policy_version, rows)
        return msg.finish(sender_id=self.sender_id, seq=self.seq, policy_version=policy_version, rows=rows)

    def encode(self, kind: wire.Kind, arrays, policy_version: int, meta=None) -> bytearray:
        self.seq += 1
        return wire.encode(kind, arrays, meta, sender_id=self.sender_id, seq=self.seq, policy_version=policy_version)

    def chunk_sender(self, carry: tuple[str, int, int]) -> "ChunkSender":
        """The chunk boundary of one recorder that reuses its frame (see ChunkSender)."""
        return ChunkSender(self, carry)

    def carry_row(self, msg: wire.OutMessage, carry: tuple[str, int, int]) -> bool:
        """Copies row carry[2] of array carry[0] to row carry[1] within msg's frame, if nothing
        holds the frame any more; returns whether it did."""
        if not msg.reusable():
            return False
        to, last = msg.row_copier(*carry)
        to[:] = last
        return True

    def _direct_path(self, msg: wire.OutMessage, rows: wire.Cut, carry: tuple[str, int, int]) -> tuple | None:
        """What send_and_carry needs to send `msg` (sent copied just now, cut to `rows`) again
        in one C++ call, or None where the link has no C++ pusher."""
        pusher = self.link.pusher if self.link is not None else None
        if getattr(pusher, "_send_frame", None) is None or pusher.sock.closed:  # (a NoLearner has none)
            return None
        return (msg, rows, pusher, pusher.sock, pusher._send_frame, pusher.address, msg._total,
                *msg.layout.row_span(*carry))


class ChunkSender:
    """One recorder's chunk boundary: `send(msg, policy_version, rows)` sends `msg` cut to
    `rows` through the Sender, then, if its frame is free again (a small frame goes out
    copied), copies row carry[2] of array carry[0] to row carry[1] in it, so the recorder
    writes its next chunk in place. Returns (the frame left for the caller to send or None,
    whether the row was carried: if not, `msg` is still held and the recorder needs
    another). Once a frame has gone that way, the same frame and cut go out again in one
    C++ call (send and row copy) while the link's pusher stays the same. One per recorder:
    the recorders of an actor's env groups share a Sender, each with its own frame."""

    __slots__ = ("sender", "carry", "direct")

    def __init__(self, sender: Sender, carry: tuple[str, int, int]):
        self.sender = sender
        self.carry = carry
        self.direct: tuple | None = None  # (msg, rows, pusher, sock, send_frame, address, total, to, frm, n)

    def send(self, msg: wire.OutMessage, policy_version: int, rows: wire.Cut):
        d = self.direct
        if d is not None and d[0] is msg and d[1] is rows:
            _, _, pusher, sock, send_frame, address, total, to, frm, n = d
            sender = self.sender
            if sender.link.pusher is pusher and not sock.closed:
                seq = sender.seq = sender.seq + 1
                buf = msg.buffer  # (not kept in d: a reference to it would count against msg.reusable)
                err = send_frame(address, buf, total, seq, policy_version, False, to, frm, n)
                if err == 0:
                    return None, True
                return self._after(msg, rows, pusher._retry(msg, buf, err, seq, policy_version, False))  # (no row copied)
        return self._after(msg, rows, self.sender.finish(msg, policy_version, rows))

    def _after(self, msg: wire.OutMessage, rows: wire.Cut, frame):
        self.direct = None
        if not self.sender.carry_row(msg, self.carry):
            return frame, False
        if frame is None and msg._sealed is rows and msg.send_buffer is None:
            self.direct = self.sender._direct_path(msg, rows, self.carry)
        return frame, True


class NoLearner:
    """A link for a Sender whose messages go nowhere: the agent server's without a learner
    (inference only). Each message is taken as sent at once, so its recorders reuse their
    frames as they do when a learner takes them: serving costs what it costs in training."""

    def __init__(self, sender_id: int):
        self.sender_id = sender_id
        self.pusher = self

    def send(self, msg, sender_id: int, seq: int, policy_version: int, rows=None, wait: bool = False):
        return None  # (nothing left to send)
