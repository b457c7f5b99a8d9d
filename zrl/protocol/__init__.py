"""zrl's protocol: the wire format, the checks a receiver makes, and the sockets it
travels on, one concept per module. This package imports nothing itself, so that a
light module (`endpoints`, which config.py reads at start-up) costs only itself.

frame      the format: header and descriptor layouts, message kinds, dtypes, reasons
message    decode: a received frame checked and viewed as a Message
layout     encode, and frames built in place (Layout, Cut, OutMessage)
schema     what an algorithm's messages must hold (Schema, Field) and value checks
gate       the learner's receive-side checks, with the C++ fast path
hello      the hello checks the learner and the agent server share
endpoints  endpoint strings: their checks and derivations (no zmq)
sockets    pyzmq sockets with zrl's defaults
native     the per-message C++ paths into pyzmq's libzmq (native(), Pusher)
curve      CURVE keys and the ZAP authenticator

`zrl.wire` and `zrl.transport` re-export these under their former names.
"""
