"""Gateway fixtures: a topology's workers (in this process) plus gateways, per broker kind, per module."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from flowserve.client.http import AsyncHttpClient
from flowserve.gateway import Gateway, GatewaySettings
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import InlineHost
from flowserve.topology.graph import Topology, load_topology_text

ROOT = Path(__file__).resolve().parents[2]


def unique(text: str) -> Topology:
    """Compile a topology YAML with ``NAME`` replaced by a fresh name (own topics, own groups)."""
    return load_topology_text(text.replace("NAME", "g" + uuid.uuid4().hex[:10]))


def echo_yaml() -> str:
    return (ROOT / "topologies" / "echo.yaml").read_text().replace("name: echo", "name: NAME", 1)


async def wait_ready(client: AsyncHttpClient, path: str = "/v2/health/ready", timeout_s: float = 90.0) -> None:
    """Wait (polling the readiness endpoint, bounded) until every stage has a live worker."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last = None
    while loop.time() < deadline:
        last = await client.get(path)
        if last.status == 200:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not ready within {timeout_s} s: {last.error if last else None}")


@contextlib.asynccontextmanager
async def running(topology: Topology, kafka: KafkaSettings, *, workers: bool = True, token: str | None = None,
                  **settings: Any) -> AsyncIterator[tuple[Gateway, AsyncHttpClient]]:
    """Workers for ``topology`` (unless ``workers=False``) and a gateway on a free port, with a client."""
    host = InlineHost(topology, kafka) if workers else None
    gateway = Gateway([topology], kafka, GatewaySettings(port=0, **settings))
    if host is not None:
        await host.start()
    try:
        async with gateway, AsyncHttpClient(gateway.url, token=token) as client:
            yield gateway, client
    finally:
        if host is not None:
            await host.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def echo(broker: Any) -> AsyncIterator[tuple[Gateway, AsyncHttpClient]]:
    """The echo topology (one port per V2 datatype), its worker and a gateway, ready."""
    kafka = broker.settings()
    async with running(unique(echo_yaml()), kafka, max_body_bytes=64 * 1024) as (gateway, client):
        await wait_ready(client)
        yield gateway, client
