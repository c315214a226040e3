"""The V2 HTTP load generator the gateway benches use, the same code whichever server it drives.

Two shapes of load, each for one slice of time:

- closed loop (:func:`closed_slice`): ``C`` lanes, each sends a request and waits for its answer before
  sending the next; what a fixed pool of callers sees;
- open loop (:func:`poisson_slice`): requests arrive as a Poisson process at ``rate`` per second whatever
  the server is doing, and each latency counts from when its request was due, not from when it went out,
  so a server that falls behind is charged for the queue it builds (no coordinated omission).

Every request is a V2 body with its headers as a client would send them (``requests`` taken in turn),
from :func:`request_body`; an answer other than 200 counts as an error, not a latency.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Literal

import numpy as np

from flowserve.client.http import AsyncHttpClient
from flowserve.wire.tensors import as_bytes_array, datatype_of
from flowserve.wire.v2 import build_request
from flowserve_bench.paired import Slice

_JSON = {"Content-Type": "application/json"}
#: how a request's tensors go on the wire: V2 JSON; the binary tensor extension (Triton's, which
#: flowserve's gateway takes); V2 JSON with each BYTES element base64 text under ``content_type: base64``
#: (MLServer's codec; MLServer's REST API has no binary extension)
Encoding = Literal["json", "binary", "base64"]
#: a request's body and its HTTP headers (the binary extension's header length differs per body)
Request = tuple[bytes, dict[str, str]]
#: open loop: requests in flight beyond this are not sent but counted as errors, so a server that stops
#: answering cannot make the generator open connections without bound
MAX_OPEN = 2048


def has_bytes(tensors: Mapping[str, np.ndarray]) -> bool:
    """Whether any of ``tensors`` is BYTES (which plain V2 JSON carries only as text)."""
    return any(datatype_of(np.asarray(a)) == "BYTES" for a in tensors.values())


def request_body(tensors: Mapping[str, np.ndarray], encoding: Encoding) -> Request:
    """A V2 inference request's body and headers in ``encoding``.

    Plain V2 JSON carries a BYTES element as text, so binary elements (a PNG file) do not survive it:
    they go as the binary extension or as base64, whichever the server takes.
    """
    if encoding != "base64":
        return build_request(tensors, binary=encoding == "binary")
    inputs = []
    for name, array in tensors.items():
        array = np.asarray(array)
        if datatype_of(array) != "BYTES":
            inputs.append(json.loads(build_request({name: array})[0])["inputs"][0])
            continue
        data = [base64.b64encode(v).decode("ascii") for v in as_bytes_array(array).reshape(-1)]
        inputs.append({"name": name, "shape": list(array.shape), "datatype": "BYTES",
                       "parameters": {"content_type": "base64"}, "data": data})
    return json.dumps({"inputs": inputs}, separators=(",", ":")).encode(), dict(_JSON)


class Target:
    """One V2 server to drive: its base URL and the model to call, over a pool of keep-alive connections."""

    def __init__(self, url: str, model: str) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.path = f"/v2/models/{model}/infer"
        self.http = AsyncHttpClient(self.url, timeout_s=30.0)

    async def call(self, request: Request) -> bool:
        try:
            reply = await self.http.request("POST", self.path, *request)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            return False
        return reply.status == 200

    async def ready(self, request: Request, timeout_s: float = 120.0) -> None:
        """Wait until the server says the model is ready (V2 ``GET /v2/models/{model}/ready``) and then
        answers ``request`` with 200. Either alone is not enough: a server still loading can answer one
        request that was queued before it refused the rest, or say ready before its first call works."""
        deadline = time.perf_counter() + timeout_s
        for check in (self._says_ready, lambda: self.call(request)):
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


async def closed_slice(target: Target, requests: Sequence[Request], concurrency: int,
                       seconds: float) -> tuple[Slice, int]:
    """:func:`closed_lanes` sending ``requests`` in turn to ``target``."""
    return await closed_lanes(lambda i: target.call(requests[i]), len(requests), concurrency, seconds)


async def poisson_slice(target: Target, requests: Sequence[Request], rate: float, seconds: float,
                        rng: np.random.Generator) -> tuple[Slice, int]:
    """Poisson arrivals at ``rate``/s for ``seconds``, then wait for the stragglers; latency from each
    request's due time."""
    latencies: list[float] = []
    errors = 0
    inflight: set[asyncio.Task[None]] = set()

    async def one(request: Request, due: float) -> None:
        nonlocal errors
        if await target.call(request):
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
        task = asyncio.create_task(one(requests[sent % len(requests)], due))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
        sent += 1
    if inflight:
        await asyncio.wait(inflight)
    return Slice(len(latencies), time.perf_counter() - t0, latencies), errors
