"""Client compatibility fixtures: a served topology (workers in this process and a gateway) per broker
kind and module, driven by clients nobody here wrote."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from fs_clients import Served

from flowserve.gateway import Gateway, GatewaySettings
from flowserve.kafka.admin import ensure_topics
from flowserve.runtime.host import InlineHost
from flowserve.topology import names
from flowserve.topology.graph import load_topology_text

# AddOne: y = x + 1 on FP32 rows of 4 (tests/support/fs_testkit.py).
TOPOLOGY = """
name: NAME
partitions: 2
deadline_ms: 120000
nodes:
  a: {component: fs_testkit:AddOne, inputs: {x: input.x}}
outputs: {y: a.x}
"""


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(broker: Any) -> AsyncIterator[Served]:
    kafka = broker.settings()
    topology = load_topology_text(TOPOLOGY.replace("NAME", "c" + uuid.uuid4().hex[:10]))
    host = InlineHost(topology, kafka)
    gateway = Gateway([topology], kafka, GatewaySettings(port=0))
    await host.start()
    try:
        await ensure_topics(kafka, [names.feedback_topic(topology.base)], topology.spec.partitions)
        async with gateway:
            await _ready(gateway)
            yield Served(topology, kafka, broker.name, gateway.url)
    finally:
        await host.stop()


async def _ready(gateway: Gateway, timeout_s: float = 90.0) -> None:
    from flowserve.client.http import AsyncHttpClient

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with AsyncHttpClient(gateway.url) as client:
        while loop.time() < deadline:
            if (await client.get("/v2/health/ready")).status == 200:
                return
            await asyncio.sleep(0.1)  # paces the readiness polling
    raise AssertionError(f"gateway not ready within {timeout_s} s")
