"""Where a batch runs: on the event loop, in a thread, or in a thread under its GPU's lock; timed there.

A worker's event loop fetches, produces and commits. A model that runs for milliseconds would stop all
of that while it runs, so an offloading component (``offload = True``) runs in a thread, unless its
batches are so short that the thread handoff (two wake-ups, the GIL passed back and forth) costs more
than it saves.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from flowserve.component import Batch, Component, Result

_DEVICE_LOCKS: dict[str, threading.Lock] = {}


def device_lock(device: str) -> threading.Lock | None:
    """One batch in flight per GPU (per process): the lock of ``device``, None on the CPU."""
    if not device.startswith("cuda"):
        return None
    return _DEVICE_LOCKS.setdefault(device, threading.Lock())


class Executor:
    """Runs ``component.process`` on batches; a component that offloads runs inline once its smoothed
    execution time is under ``inline_below_s``."""

    def __init__(self, component: Component, inline_below_s: float) -> None:
        self.component = component
        self.inline_below_s = inline_below_s
        #: smoothed seconds per batch; None until the first batch ran (in a thread)
        self.ewma: float | None = None

    async def run(self, batch: Batch) -> tuple[Mapping[str, np.ndarray] | Result, float]:
        """The component's result and its execution time (measured where it ran, not the handoff)."""
        process = self.component.process
        lock = device_lock(self.component.device)
        if lock is not None:  # one batch in flight per GPU
            return await asyncio.to_thread(_timed, lock, process, batch)
        if self.component.offload and (self.ewma is None or self.ewma >= self.inline_below_s):
            return await asyncio.to_thread(_timed, None, process, batch)
        return _timed(None, process, batch)

    def observe(self, seconds: float) -> None:
        # One slow batch (a larger one, a cold cache) sends the next ones back to the thread until the
        # average settles.
        ewma = self.ewma
        self.ewma = seconds if ewma is None or seconds > 4 * ewma else 0.8 * ewma + 0.2 * seconds


def _timed(lock: Any, fn: Any, batch: Batch) -> tuple[Any, float]:
    with lock if lock is not None else contextlib.nullcontext():
        t0 = time.perf_counter()
        result = fn(batch)
        return result, time.perf_counter() - t0
