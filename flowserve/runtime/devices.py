"""One batch in flight per GPU: a process-wide lock per CUDA device."""

from __future__ import annotations

import threading

_DEVICE_LOCKS: dict[str, threading.Lock] = {}


def device_lock(device: str) -> threading.Lock | None:
    """One batch in flight per GPU (per process): the lock of ``device``, None on the CPU."""
    if not device.startswith("cuda"):
        return None
    return _DEVICE_LOCKS.setdefault(device, threading.Lock())
