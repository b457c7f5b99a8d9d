#!/usr/bin/env python3
"""Writes the golden wire frames in tests/data/golden/ (run from the repository root).

Each case is a frame made by zrl.wire.encode from fixed inputs, saved as
NAME.bin, and described in manifest.json (kind, header fields, meta, and for
each array its name, dtype, shape and values as a flat list), so any
implementation of the protocol — pytest here, GoogleTest for the C++ client —
can check both that it decodes these bytes to these values and that it
encodes these values to these bytes.

    python tests/data/make_golden.py          # rewrite the files
    python tests/data/make_golden.py --check  # exit 1 if the files differ
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from zrl import wire  # noqa: E402

OUT = Path(__file__).resolve().parent / "golden"


def cases():
    yield "hello", wire.Kind.HELLO, {}, {"role": "actor", "index": 3, "protocol": 1}, dict(sender_id=3, seq=1, policy_version=0)
    yield "error", wire.Kind.ERROR, {}, "observation spec differs: expected float32[4]", dict(sender_id=0, seq=0, policy_version=0)
    yield "weights", wire.Kind.WEIGHTS, {"params": np.array([0.5, -1.25, 3.0, 0.0], np.float32)}, None, dict(sender_id=0, seq=9, policy_version=42)
    yield "stats", wire.Kind.STATS, {"episode_return": np.array([10.0, 500.0]), "episode_length": np.array([10.0, 500.0])}, None, dict(sender_id=1, seq=5, policy_version=7)
    T, K = 2, 3
    yield "trajectory", wire.Kind.TRAJECTORY, {
        "obs": np.arange((T + 1) * K * 2, dtype=np.float32).reshape(T + 1, K, 2) / 4,
        "action": np.array([[0, 1, 1], [1, 0, 1]], np.int64),
        "reward": np.ones((T, K), np.float32),
        "terminated": np.array([[False, True, False], [False, False, False]]),
        "truncated": np.array([[False, False, False], [True, False, False]]),
        "behaviour_logp": np.full((T, K), -0.6931472, np.float32),
        "final_index": np.array([3], np.int32),
        "final_obs": np.array([[9.0, -9.0]], np.float32),
    }, None, dict(sender_id=2, seq=17, policy_version=5)
    # Agent server <-> client (docs/PROTOCOL.md, "Agent server").
    box4 = {"type": "box", "shape": [4], "dtype": "float32", "low": None, "high": None}
    yield "client_hello", wire.Kind.HELLO, {}, {"role": "client", "protocol": 1, "name": "golden", "obs_space": box4, "action_space": {"type": "discrete", "n": 2}}, dict(sender_id=0, seq=0, policy_version=0)
    yield "client_hello_reply", wire.Kind.HELLO_REPLY, {}, {"ok": True, "client_id": 7, "policy_version": 3}, dict(sender_id=0, seq=0, policy_version=3)
    yield "act_first", wire.Kind.ACT, {"obs": np.array([0.1, 0.2, 0.3, 0.4], np.float32), "reward": np.float32(0.0), "flags": np.uint8(1)}, None, dict(sender_id=0, seq=1, policy_version=0)
    yield "act_step_uint8", wire.Kind.ACT, {"obs": np.arange(12, dtype=np.uint8).reshape(3, 4), "reward": np.float32(1.5), "flags": np.uint8(0)}, None, dict(sender_id=0, seq=2, policy_version=0)
    yield "act_last_truncated", wire.Kind.ACT, {"obs": np.array([1.0, -1.0, 0.5, 0.0], np.float32), "reward": np.float32(1.0), "flags": np.uint8(6)}, None, dict(sender_id=0, seq=3, policy_version=0)
    yield "act_last_terminated", wire.Kind.ACT, {"reward": np.float32(-1.0), "flags": np.uint8(2)}, None, dict(sender_id=0, seq=4, policy_version=0)
    yield "action_discrete", wire.Kind.ACTION, {"action": np.int64(1)}, None, dict(sender_id=0, seq=2, policy_version=12)
    yield "action_box", wire.Kind.ACTION, {"action": np.array([0.5, -0.25], np.float32)}, None, dict(sender_id=0, seq=2, policy_version=12)
    yield "action_ack", wire.Kind.ACTION, {}, None, dict(sender_id=0, seq=3, policy_version=12)
    yield "client_stats", wire.Kind.STATS, {"score": np.array([42.0])}, None, dict(sender_id=0, seq=5, policy_version=0)
    yield "bye", wire.Kind.BYE, {}, None, dict(sender_id=0, seq=6, policy_version=0)

def build():
    manifest = {}
    frames = {}
    for name, kind, arrays, meta, hdr in cases():
        frame = bytes(wire.encode(kind, arrays, meta, **hdr))
        frames[name] = frame
        manifest[name] = {
            "file": f"{name}.bin",
            "kind": int(kind),
            "kind_name": kind.name,
            **hdr,
            "meta": meta if meta is None or isinstance(meta, str) else json.dumps(meta, separators=(",", ":")),
            "length": len(frame),
            "arrays": [
                {"name": k, "dtype": str(np.asarray(v).dtype), "shape": list(np.asarray(v).shape), "values": np.asarray(v).reshape(-1).tolist()}
                for k, v in arrays.items()
            ],
        }
    return manifest, frames


def main() -> int:
    manifest, frames = build()
    text = json.dumps(manifest, indent=1) + "\n"
    if "--check" in sys.argv:
        ok = (OUT / "manifest.json").read_text() == text and all((OUT / f"{n}.bin").read_bytes() == b for n, b in frames.items())
        print("golden files up to date" if ok else "golden files differ from zrl.wire's output")
        return 0 if ok else 1
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "manifest.json").write_text(text)
    for n, b in frames.items():
        (OUT / f"{n}.bin").write_bytes(b)
    print(f"wrote {len(frames)} frames to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
