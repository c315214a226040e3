"""The V2 HTTP load generator the gateway benches use, the same code whichever server it drives.

Two shapes of load, each for one slice of time:

- closed loop (:func:`closed_slice`): ``C`` lanes, each sends a request and waits for its answer before
  sending the next; what a fixed pool of callers sees;
- open loop (:func:`poisson_slice`): requests arrive as a Poisson process at ``rate`` per second whatever
  the server is doing, and each latency counts from when its request was due, not from when it went out,
  so a server that falls behind is charged for the queue it builds (no coordinated omission).

Every request is the same V2 JSON body a client would send (``bodies`` taken in turn); an answer other
than 200 counts as an error, not a latency.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from flowserve.bench.paired import Slice
from flowserve.client.http import AsyncHttpClient

_JSON = {"Content-Type": "application/json"}
#: open loop: requests in flight beyond this are not sent but counted as errors, so a server that stops
#: answering cannot make the generator open connections without bound
MAX_OPEN = 2048


class Target:
    """One V2 server to drive: its base URL and the model to call, over a pool of keep-alive connections."""

    def __init__(self, url: str, model: str) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.path = f"/v2/models/{model}/infer"
        self.http = AsyncHttpClient(self.url, timeout_s=30.0)

    async def call(self, body: bytes) -> bool:
        try:
            reply = await self.http.request("POST", self.path, body, _JSON)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            return False
        return reply.status == 200

    async def ready(self, body: bytes, timeout_s: float = 120.0) -> None:
        """Wait until the server says the model is ready (V2 ``GET /v2/models/{model}/ready``) and then
        answers ``body`` with 200. Either alone is not enough: a server still loading can answer one
        request that was queued before it refused the rest, or say ready before its first call works."""
        deadline = time.perf_counter() + timeout_s
        for check in (self._says_ready, lambda: self.call(body)):
            while not await check():
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"{self.url}: model '{self.model}' was not ready and answering within "
                                       f"{timeout_s:g} s")
                await asyncio.sleep(0.2)  # polling a server that is starting, not synchronisation

    async def _says_ready(self) -> bool:
        try:
            reply = await self.http.request("GET", f"/v2/models/{self.model}/ready")
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            return False
        return reply.status == 200

    async def close(self) -> None:
        await self.http.close()


async def closed_lanes(call: Callable[[int], Awaitable[bool]], n: int, concurrency: int,
                       seconds: float) -> tuple[Slice, int]:
    """``concurrency`` lanes for ``seconds``, lane ``k`` calling ``call(i % n)`` for i = k, k + C, ...
    and waiting for each answer (True: answered): the slice (answered requests, their latencies in ms)
    and how many failed."""
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def lane(k: int) -> None:
        nonlocal errors
        i = k
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            if await call(i % n):
                latencies.append((time.perf_counter() - t0) * 1000)
            else:
                errors += 1
            i += concurrency

    t0 = time.perf_counter()
    await asyncio.gather(*(lane(k) for k in range(concurrency)))
    return Slice(len(latencies), time.perf_counter() - t0, latencies), errors


async def closed_slice(target: Target, bodies: Sequence[bytes], concurrency: int,
                       seconds: float) -> tuple[Slice, int]:
    """:func:`closed_lanes` sending ``bodies`` in turn to ``target``."""
    return await closed_lanes(lambda i: target.call(bodies[i]), len(bodies), concurrency, seconds)


async def poisson_slice(target: Target, bodies: Sequence[bytes], rate: float, seconds: float,
                        rng: np.random.Generator) -> tuple[Slice, int]:
    """Poisson arrivals at ``rate``/s for ``seconds``, then wait for the stragglers; latency from each
    request's due time."""
    latencies: list[float] = []
    errors = 0
    inflight: set[asyncio.Task[None]] = set()

    async def one(body: bytes, due: float) -> None:
        nonlocal errors
        if await target.call(body):
            latencies.append((time.perf_counter() - due) * 1000)
        else:
            errors += 1

    t0 = time.perf_counter()
    due = t0
    sent = 0
    while True:
        due += float(rng.exponential(1.0 / rate))
        if due - t0 >= seconds:
            break
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(inflight) >= MAX_OPEN:
            errors += 1
            continue
        # a task per request: an open loop must not wait for one answer before sending the next
        task = asyncio.create_task(one(bodies[sent % len(bodies)], due))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
        sent += 1
    if inflight:
        await asyncio.wait(inflight)
    return Slice(len(latencies), time.perf_counter() - t0, latencies), errors
