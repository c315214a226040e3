"""Two consumers of one stage share its partitions: each gets some, none twice, and every request is
answered exactly once. More consumers than partitions: the extra one idles, and says so."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.runtime.host import InlineHost, warn_idle_replicas
from flowserve.topology import load_topology

pytestmark = pytest.mark.integration

TOPOLOGY = """
name: NAME
partitions: 4
deadline_ms: 60000
nodes:
  add: {component: fs_testkit:AddOne, inputs: {x: input.x}, replicas: REPLICAS}
outputs: {y: add.x}
"""


async def _assignments(host: InlineHost, consumers: int) -> list[set[int]]:
    """Each ``add`` worker's partitions once the group has settled on ``consumers`` members (bounded)."""
    workers = [w for w in host.workers if w.node.id == "add"]
    async with asyncio.timeout(60):
        while True:
            parts = [{tp.partition for tp in w.consumer.assignment()} for w in workers]
            if sum(bool(p) for p in parts) == consumers and sum(map(len, parts)) == 4:
                return parts
            await asyncio.sleep(0.05)  # polling a condition, not waiting out a time


async def test_two_consumers_share_the_partitions_and_answer_each_request_once(kafka, write_topology) -> None:
    topology = load_topology(write_topology(TOPOLOGY.replace("REPLICAS", "2")))
    async with InlineHost(topology, kafka) as host, TopologyClient(topology, kafka) as client:
        await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=120)
        a, b = await _assignments(host, consumers=2)
        assert a and b and not a & b and a | b == {0, 1, 2, 3}
        futures = {}
        for i in range(64):  # request ids spread over all four partitions
            rid = f"r{i}"
            futures[rid] = client.expect(rid)
            await client.queue({"x": np.full((1, 4), i, np.float32)}, request_id=rid)
        await client.flush()
        await asyncio.wait_for(asyncio.gather(*futures.values()), 60)
        for i, fut in enumerate(futures.values()):
            assert fut.result().error is None
            np.testing.assert_array_equal(fut.result().tensors["y"], np.full((1, 4), i + 1, np.float32))
        assert client.duplicates == 0
        # both consumers did work (the warm-up request went to one of them)
        assert all(w.counters.records_in > 0 for w in host.workers)


async def test_consumers_beyond_the_partitions_idle_and_warn(kafka, write_topology,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    topology = load_topology(write_topology(TOPOLOGY.replace("REPLICAS", "5")))
    caplog.set_level(logging.WARNING)
    async with InlineHost(topology, kafka) as host:
        parts = await _assignments(host, consumers=4)
        assert sorted(len(p) for p in parts) == [0, 1, 1, 1, 1]
        # the idle member learns of its empty assignment in its own rebalance callback, maybe a moment later
        async with asyncio.timeout(60):
            while "this consumer got no partitions" not in caplog.text:
                await asyncio.sleep(0.05)  # polling a condition, not waiting out a time
    assert "add: 5 consumers for 4 partitions: 1 of them will idle" in caplog.text
    assert not warn_idle_replicas(topology, "add", 4)
