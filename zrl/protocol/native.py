"""The per-message hot paths in C++ (csrc/wire/zmq_native.h): pyzmq's own libzmq reached
from `zrl._core.ZmqNative` (`native()`), which an actor's `Pusher` sends its chunks
through and the learner's `zrl.protocol.gate.Gate.drain` receives its bursts through,
one C++ call per message or burst instead of pyzmq's Python layers. Where it is off
(ZRL_NATIVE_ZMQ=0, or the library cannot be found) everything takes pyzmq's path,
with the same results.
"""
from __future__ import annotations

import errno
import logging
import os
import sys

import zmq

from zrl import _core

log = logging.getLogger("zrl.transport")  # (the name it has always logged under)

NATIVE_ENV = "ZRL_NATIVE_ZMQ"  # "0" keeps pyzmq's own send and recv everywhere
_native: list = []  # [ZmqNative or None, why], filled on first use


def native():
    """pyzmq's own libzmq reached from C++ (`zrl._core.ZmqNative`), or None.

    Actors send their trajectory chunks through it (`Pusher`) and the learner
    drains its PULL socket through it (`gate.Gate.drain`): one C++ call per
    message or burst instead of pyzmq's Python layers. None where the library
    cannot be found from pyzmq's extension (`native_note` says why) or where
    ZRL_NATIVE_ZMQ=0; everything then takes pyzmq's path, with the same results.
    """
    if not _native:
        why = ""
        api = None
        if os.environ.get(NATIVE_ENV, "1") == "0":
            why = f"{NATIVE_ENV}=0"
        else:
            try:
                api = _core.ZmqNative(backend_path(), *zmq.zmq_version_info())
                why = f"through {api.library}"
            except (AttributeError, KeyError, RuntimeError) as e:
                why = f"unavailable: {e}"
        if api is None:
            log.info("native ZeroMQ path off (%s): pyzmq's send and recv", why)
        _native[:] = [api, why]
    return _native[0]


def backend_path() -> str:
    """The file of pyzmq's backend extension, through which C++ finds its libzmq;
    RuntimeError where the backend is not an extension module."""
    module = sys.modules[zmq.backend.Socket.__module__]
    path = getattr(module, "__file__", None) or ""
    if not path.endswith((".so", ".pyd", ".dylib")):  # (the CFFI backend, a frozen build, ...)
        raise RuntimeError(f"pyzmq's backend {module.__name__} is not an extension module ({path or 'no file'})")
    return path


def zmq_error(err: int) -> zmq.ZMQError:
    """The exception pyzmq raises for a libzmq errno (zmq.Again for EAGAIN, ...)."""
    cls = {errno.EAGAIN: zmq.Again, zmq.ETERM: zmq.ContextTerminated, errno.EINTR: zmq.InterruptedSystemCall}.get(err, zmq.ZMQError)
    return cls(err)


def native_note() -> str:
    """How `native()` went: the library used, or why there is none."""
    native()
    return _native[1]


class Pusher:
    """Sends layout.OutMessage frames (an actor's chunks) on one pyzmq socket.

    Through `native()` where there is one, each frame goes out in one C++ call
    that stamps its header's per-message fields and hands it to ZeroMQ: a small
    frame copied (the OutMessage is free again at once), a large one (from
    layout.SEND_ZERO_COPY_FROM, kept in a SendBuffer) without a copy, ZeroMQ
    holding the SendBuffer until it has sent it. Without `native()`, frames get
    `OutMessage.finish` and pyzmq's send (zero-copy from zmq.COPY_THRESHOLD up).
    The socket stays pyzmq's: use a Pusher from the socket's thread only, and
    drop it when the socket closes.
    """

    __slots__ = ("sock", "api", "address", "_send_frame")

    def __init__(self, sock: zmq.Socket, use_native: bool = True):
        self.sock = sock
        self.api = native() if use_native else None
        self.address = sock.underlying
        self._send_frame = self.api.send_frame if self.api is not None else None

    def send(self, msg, sender_id: int, seq: int, policy_version: int, rows=None, wait: bool = False):
        """Sends `msg` (a layout.OutMessage) now: None if it went, else its finished frame for
        the caller to send later (the queue stayed full: `wait` is False, or the socket's
        SNDTIMEO ran out). Raises zmq.ZMQError for any other failure, as pyzmq would.
        `rows` is as for OutMessage.seal: a layout.Cut of msg's layout, a mapping, or None.
        (The actor's per-chunk path: kept flat.)"""
        if self._send_frame is not None and not self.sock.closed:  # (a closed socket's address dangles)
            buf = msg.send_buffer
            if buf is None:
                buf = msg.buffer
            if rows is not None and msg._sealed is rows and msg._sender_id == sender_id:  # (sent again as it was cut: seal has nothing to do)
                total = msg._total
            else:
                total = msg.seal(sender_id, rows)
            err = self._send_frame(self.address, buf, total, seq, policy_version, wait)
            if err == 0:
                return None
            return self._retry(msg, buf, err, seq, policy_version, wait)
        frame = msg.finish(sender_id=sender_id, seq=seq, policy_version=policy_version, rows=rows)
        try:
            self.sock.send(frame, 0 if wait else zmq.NOBLOCK, copy=False)
            return None
        except zmq.Again:
            return frame

    def _retry(self, msg, buf, err: int, seq: int, policy_version: int, wait: bool):
        while True:
            if err == errno.EAGAIN:
                return msg.frame()  # stamped: the finished frame
            if err != errno.EINTR:  # (a signal: Python has run its handler; try again)
                raise zmq_error(err)
            err = self._send_frame(self.address, buf, msg._total, seq, policy_version, wait)
            if err == 0:
                return None
