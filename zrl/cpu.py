"""What this CPU does natively, from the kernel's view of it (Linux's /proc/cpuinfo)."""
from __future__ import annotations

import functools

__all__ = ["cpu_flags"]


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The feature flags of the first CPU (avx512_bf16, avx512_vnni, amx_int8, ...); empty where
    /proc/cpuinfo cannot be read (not Linux). Read once per process."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return frozenset()
