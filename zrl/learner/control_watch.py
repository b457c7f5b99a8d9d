"""Counts the control socket's connections that end before a whole message arrived.

ZeroMQ cuts a peer off, without telling the application, when it declares a
message larger than the socket's MAXMSGSIZE (learner.max_hello_bytes), and a
peer that is not a zrl peer (a port scanner, a failed CURVE handshake) leaves
without one too. A socket monitor reports each connection's accept and end by
file descriptor, and each message says which descriptor it came from, so such
connections are counted (`control_dropped`) rather than vanishing.
"""
from __future__ import annotations

import zmq
from zmq.utils.monitor import recv_monitor_message

EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED


class ControlWatch:
    """Owned by the receiver thread: `drain()` before reading the control socket,
    `delivered(frame)` for each message read, `close()` at the end."""

    def __init__(self, control: zmq.Socket):
        self.control = control
        self.monitor = control.get_monitor_socket(EVENTS)
        self.open: dict[int, bool] = {}  # fd -> a whole message came from it

    def drain(self) -> int:
        """Handles the events that arrived; returns how many connections ended without a message."""
        dropped = 0
        while self.monitor.poll(0, zmq.POLLIN):
            event = recv_monitor_message(self.monitor)
            fd = event["value"]
            if event["event"] == zmq.EVENT_ACCEPTED:
                self.open.setdefault(fd, False)
            elif not self.open.pop(fd, True):
                dropped += 1
        return dropped

    def delivered(self, frame: zmq.Frame) -> None:
        try:
            fd = frame.get(zmq.SRCFD)
        except zmq.ZMQError:  # (inproc and IPC-less transports carry no descriptor)
            return
        if fd in self.open:
            self.open[fd] = True

    def close(self) -> None:
        try:
            self.control.disable_monitor()
        except zmq.ZMQError:
            pass  # (the control socket is closed already)
        self.monitor.close(linger=0)
