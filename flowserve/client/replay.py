"""Open-loop replay of an arrival trace against a topology (``flowserve trace replay``, the tuner bench).

Each request goes out at its arrival time whether or not earlier ones have been answered, and its
latency counts from that intended time, not from when it actually left: a stalled pipeline shows up as
latency instead of as fewer requests sent (no coordinated omission). One loop sends everything due at
each tick as one produce batch; replies are matched by their futures' callbacks (no coroutine per request).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from flowserve.client.kafka import Reply, TopologyClient, new_request_id


@dataclass
class ReplayReport:
    """Per request, in trace order: when it was due (s from the start) and its latency (NaN: no reply)."""

    due_s: np.ndarray
    latency_s: np.ndarray
    errors: int = 0
    timeouts: int = 0
    request_ids: list[str] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return int(self.due_s.size)

    @property
    def ok(self) -> int:
        return int(np.isfinite(self.latency_s).sum())

    def percentile(self, q: float) -> float:
        """Latency percentile over every request; a request with no answer counts as infinitely late."""
        if not self.sent:
            return float("nan")
        # "higher": no interpolation, which would turn inf - inf into NaN
        return float(np.percentile(np.nan_to_num(self.latency_s, nan=np.inf), q, method="higher"))

    def attainment(self, slo_s: float) -> float:
        """Share of requests answered without error within ``slo_s``."""
        if not self.sent:
            return float("nan")
        return float(np.mean(np.nan_to_num(self.latency_s, nan=np.inf) <= slo_s))


async def replay(client: TopologyClient, arrivals: Sequence[float] | np.ndarray,
                 request: Callable[[int], Mapping[str, np.ndarray]], *, timeout_ms: int | None = None,
                 tick_s: float = 0.002) -> ReplayReport:
    """Send request ``i`` (``request(i)``) at ``arrivals[i]`` seconds from now; wait for every answer."""
    due = np.asarray(arrivals, dtype=float)
    n = due.size
    latency = np.full(n, np.nan)
    report = ReplayReport(due, latency)
    loop = asyncio.get_running_loop()
    timeout = timeout_ms if timeout_ms is not None else client.topology.spec.deadline_ms
    start = loop.time()
    futures: list[asyncio.Future[Reply]] = []

    def done(i: int, future: asyncio.Future[Reply]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            report.timeouts += 1
            return
        reply = future.result()
        if reply.error is not None:
            report.errors += 1
            return
        latency[i] = loop.time() - start - due[i]

    i = 0
    while i < n:
        now = loop.time() - start
        if due[i] > now:
            await asyncio.sleep(max(0.0, min(due[i] - now, 0.05)))
            continue
        end = int(np.searchsorted(due, now + tick_s, side="right"))
        for j in range(i, end):
            rid = new_request_id()
            report.request_ids.append(rid)
            future = client.expect(rid, timeout / 1000 + 1.0)
            future.add_done_callback(functools.partial(done, j))
            futures.append(future)
            await client.queue(request(j), request_id=rid, timeout_ms=timeout)
        await client.flush()
        i = end
    if futures:
        await asyncio.wait(futures, timeout=timeout / 1000 + 2.0)
    for f in futures:
        if not f.done():
            f.cancel()
            report.timeouts += 1
    return report
