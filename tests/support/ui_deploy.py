"""For the ui tests: a running digits deployment with a drift detector, under steady traffic, for the page's tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from flowserve.capture import capture_hooks
from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.energy import EnergySettings, energy_hooks
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.learning import held_hooks
from flowserve.runtime.hooks import chain
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology_text
from flowserve.topology.graph import Topology

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Deployment:
    topology: Topology
    kafka: KafkaSettings
    request_ids: list[str] = field(default_factory=list)


def digits_drift(name: str) -> Topology:
    """topologies/digits-drift.yaml under ``name``, every request's lineage captured."""
    doc = yaml.safe_load((REPO / "topologies" / "digits-drift.yaml").read_text())
    doc["name"] = name
    doc["capture"] = {"sample": 1.0, "lineage": True, "tracing": False}
    doc["nodes"]["input_drift"]["params"]["window"] = 50
    return load_topology_text(yaml.safe_dump(doc))


@contextlib.asynccontextmanager
async def running_digits(kafka: KafkaSettings, name: str) -> AsyncIterator[Deployment]:
    """The deployment, with four lanes of requests going until the block ends."""
    topology = digits_drift(name)
    for node in topology.nodes.values():
        node.component.prepare()
    inputs, _ = topology.sampler()(200)
    deployment = Deployment(topology, kafka)
    stop = asyncio.Event()
    # the detector's open window holds its offsets back; energy metered as `flowserve run --energy` does
    hooks = chain(capture_hooks, held_hooks, energy_hooks(EnergySettings(enabled=True)))
    async with InlineHost(topology, kafka, WorkerSettings(metrics_interval_s=0.5), hooks=hooks), \
            TopologyClient(topology, kafka) as client:
        await wait_ready(client, inputs[0], timeout_s=120)

        async def lane(k: int) -> None:
            i = k
            while not stop.is_set():
                reply = await client.call(inputs[i % len(inputs)], timeout_ms=30_000)
                if reply.error is None:
                    deployment.request_ids.append(reply.request_id)
                i += 4

        lanes = [asyncio.create_task(lane(k)) for k in range(4)]
        try:
            yield deployment
        finally:
            stop.set()
            await asyncio.gather(*lanes, return_exceptions=True)


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 60.0, what: str = "condition") -> None:
    """Re-check ``check`` until it holds (the figures arrive with the workers' next snapshots)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)
