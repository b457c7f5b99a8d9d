"""Counts what ZeroMQ refuses on the learner's sockets without telling the application.

ZeroMQ cuts a peer off when it declares a message larger than the socket's
MAXMSGSIZE (learner.max_hello_bytes on the control socket), and a peer that is
not a zrl peer (a port scanner) leaves without a message too; with CURVE on, a
key outside the allow-list fails its handshake on any socket. Socket monitors
report these: on the control socket each connection's accept and end by file
descriptor, and each message says which descriptor it came from, so a
connection that ended before a whole message is counted (`control_dropped`);
on every socket a refused CURVE handshake is counted (`curve_refused`).
"""
from __future__ import annotations

import zmq
from zmq.utils.monitor import recv_monitor_message

CONTROL_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
DROPPED = ("control_dropped", "a control connection ended before a whole message: a hello over learner.max_hello_bytes, "
           "a refused handshake, or not a zrl peer")


class ConnectionWatch:
    """Made on the thread that made the sockets, then owned by the receiver thread:
    `drain()` before reading the control socket, `delivered(frame)` for each control
    message read, `close()` once the receiver has stopped. `sockets` maps a name to a
    socket: "control" is watched for connections that end early, every one (with CURVE
    on, `curve`) for refused handshakes."""

    def __init__(self, sockets: dict[str, zmq.Socket], curve: bool):
        self.sockets = sockets
        self.monitors: dict[str, zmq.Socket] = {}
        for name, sock in sockets.items():
            if name == "control":
                self.monitors[name] = sock.get_monitor_socket(CONTROL_EVENTS)
            elif curve:
                self.monitors[name] = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        self.open: dict[int, bool] = {}  # control fd -> a whole message came from it

    def drain(self) -> list[tuple[str, str]]:
        """(reason, detail) of each refusal reported since the last call."""
        found = []
        for name, monitor in self.monitors.items():
            while monitor.poll(0, zmq.POLLIN):
                found += self._on_event(name, recv_monitor_message(monitor))
        return found

    def _on_event(self, socket_name: str, event: dict) -> list[tuple[str, str]]:
        kind, value = event["event"], event["value"]
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return [("curve_refused", f"a CURVE key the {socket_name} socket's allow-list does not hold (ZAP status {value})")]
        if kind == zmq.EVENT_ACCEPTED:
            self.open.setdefault(value, False)
        elif not self.open.pop(value, True):
            return [DROPPED]
        return []

    def delivered(self, frame: zmq.Frame) -> None:
        try:
            fd = frame.get(zmq.SRCFD)
        except zmq.ZMQError:  # (inproc carries no descriptor)
            return
        if fd in self.open:
            self.open[fd] = True

    def close(self) -> None:
        for name, monitor in self.monitors.items():
            try:
                self.sockets[name].disable_monitor()
            except zmq.ZMQError:
                pass  # (the socket is closed already)
            monitor.close(linger=0)
        self.monitors.clear()
