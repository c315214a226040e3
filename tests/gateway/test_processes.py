"""``flowserve gateway --processes 2``: two gateway processes answer on one port, each with its own reply
topics, so every reply reaches the process whose caller waits for it."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import numpy as np
import pytest

from flowserve.client.http import AsyncHttpClient
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology

ECHO = """\
name: NAME
nodes:
  echo:
    component: flowserve.builtin:Identity
    params: {ports: {x: {datatype: FP32, shape: [-1, 4]}}}
    inputs: {x: input.x}
outputs: {x: echo.x}
"""
REQUESTS = 60


async def _fresh(url: str, method: str, path: str, body: bytes = b"") -> Any:
    """One request on a new connection: the kernel picks the process that accepts it."""
    async with AsyncHttpClient(url) as client:
        return await client.request(method, path, body, {"Content-Type": "application/json"})


@pytest.mark.asyncio(loop_scope="session")
async def test_two_processes_one_port(broker: Any, write_topology: Any) -> None:
    kafka = broker.settings()
    path = write_topology(ECHO)
    topology = load_topology(path)
    env = {**os.environ, "FLOWSERVE_FETCH_MAX_WAIT_MS": str(kafka.fetch_max_wait_ms),
           "FLOWSERVE_IDEMPOTENCE": "1" if kafka.idempotence else "0"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flowserve", "gateway", str(path), "--broker", kafka.bootstrap, "--port", "0",
        "--processes", "2", env=env, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        url = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().strip()
        assert url.startswith("http://"), url
        async with InlineHost(topology, kafka):
            infer = f"/v2/models/{topology.name}/infer"
            first = await _answered(url, infer, 0)  # 503 until the workers have joined their group
            assert first.status == 200, first
            replies = await asyncio.gather(*(_answered(url, infer, i) for i in range(1, REQUESTS)))
            for i, reply in enumerate(replies, start=1):
                assert reply.status == 200, reply.error
                np.testing.assert_array_equal(reply.outputs()["x"], _x(i))
            stats: dict[str, dict[str, int]] = {}
            for _ in range(200):  # fresh connections land on either process; both show up long before 200
                doc = (await _fresh(url, "GET", "/v2/gateway/stats")).json()
                stats[doc["instance"]] = doc
                if len(stats) == 2:
                    break
        assert len(stats) == 2, stats
        # every reply reached the process that sent its request: none unknown, late or lost anywhere
        for doc in stats.values():
            assert doc["unknown"] == doc["late"] == doc["timeouts"] == 0, doc
        assert sum(doc["replies"] for doc in stats.values()) == sum(doc["sent"] for doc in stats.values())
        assert sum(doc["replies"] for doc in stats.values()) >= REQUESTS
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 60) == 0


async def _answered(url: str, infer: str, i: int) -> Any:
    """Request ``i``, again while a 503 says retry: each process follows the stage's consumer group on its
    own, so the process that did not take the first request may not have seen the workers join yet."""
    for _ in range(600):
        reply = await _fresh(url, "POST", infer, _body(i))
        if reply.status != 503:
            return reply
        await asyncio.sleep(float(reply.headers.get("retry-after", "1")) / 10)
    return reply


def _x(i: int) -> np.ndarray:
    return np.full((1, 4), i, np.float32)


def _body(i: int) -> bytes:
    from flowserve.wire.v2 import build_request

    return build_request({"x": _x(i)})[0]
