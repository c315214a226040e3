"""Bounded shutdown: stopping a Kafka client (or a worker) may wait on the broker, but never forever.

aiokafka's ``stop()`` leaves the consumer group, finishes the coordinator's work (a rebalance callback
included) and flushes what the producer holds; a commit retries while the group coordinator is unknown.
Each is bounded by a request timeout in the usual case, but a stop that hangs on an unusual one holds the
whole process's shutdown (a test's teardown, a pod's termination grace). So every stop here is given a
time; past it the stop is cancelled and a warning says *where* it waited (the chain of awaits), which is
what one needs to find the cause. Giving up is safe for at-least-once: what was not committed is read
again, and a consumer that did not leave its group is dropped by the session timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

#: How long one client's stop may take: a LeaveGroup and a producer flush, each bounded by a request
#: timeout (10 s by default) when the broker answers at all.
STOP_TIMEOUT_S = 15.0


def waiting_at(task: asyncio.Task[Any]) -> str:
    """Where ``task`` waits: its chain of awaits, outermost first, into the tasks it awaits."""
    frames: list[str] = []
    for _ in range(16):  # the bound guards against tasks that await each other in a cycle
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is None:
                break
            frames.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno})")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        # The future the task is blocked on: asyncio keeps it in a private attribute of Task (both the C
        # and the Python implementation), the one place that says which task another one awaits.
        blocker = getattr(task, "_fut_waiter", None)
        if not isinstance(blocker, asyncio.Task):
            if blocker is not None:
                frames.append(repr(blocker)[:160])
            break
        frames.append(f"[task {blocker.get_name()}]")
        task = blocker
    return " > ".join(frames) or "nothing (finished)"


async def bounded(work: Awaitable[Any], what: str, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """Await ``work`` at most ``timeout_s``; past it log where it waited, cancel it and return False.

    Exceptions from ``work`` are logged, not raised: a shutdown goes on with its other steps.
    """
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        log.warning("%s did not finish within %.0f s; cancelled. It waited at: %s", what, timeout_s,
                    waiting_at(task))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return False
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("%s failed: %r", what, exc)
        return False
    return True


async def stop_client(client: Any, what: str, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """``client.stop()`` (an aiokafka consumer or producer) within ``timeout_s``."""
    stop: Coroutine[Any, Any, Any] = client.stop()
    return await bounded(stop, what, timeout_s)
