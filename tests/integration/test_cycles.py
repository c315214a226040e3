"""A cycle allowed with a revisit limit: each visit is its own join generation, and the loop ends."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology
from flowserve.wire.envelope import H_ERROR, H_ERROR_KIND
from flowserve.wire.tensors import decode_tensors

pytestmark = pytest.mark.integration

LOOP = """
name: NAME
partitions: 2
allow_cycles: true
max_revisits: 3
nodes:
  step: {component: fs_testkit:AddOne, inputs: {x: [input.x, again.x]}, join: {type: any}}
  again: {component: fs_testkit:AddOne, inputs: {x: step.x}}
outputs: {y: step.x}
"""


async def test_cycle_runs_to_its_revisit_limit_then_stops(kafka, write_topology) -> None:
    topology = load_topology(write_topology(LOOP))
    async with InlineHost(topology, kafka) as host, TopologyClient(topology, kafka) as client:
        await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=120)
        reply = await client.call({"x": np.zeros((1, 4), np.float32)}, request_id="loop-1", timeout_ms=60_000)
        assert reply.error is None
        np.testing.assert_array_equal(reply.tensors["y"], np.ones((1, 4), np.float32))  # first pass wins

        # Every pass writes an outputs record: x+1, x+3, x+5, then the revisit error ends the loop.
        consumer = AIOKafkaConsumer(topology.outputs_topic, group_id=None, auto_offset_reset="earliest",
                                    fetch_max_wait_ms=5, **kafka.client_kwargs())
        await consumer.start()
        seen: list[object] = []
        try:
            async with asyncio.timeout(60):
                while not any(isinstance(s, str) for s in seen):
                    for records in (await consumer.getmany(timeout_ms=200)).values():
                        for rec in records:
                            if rec.key != b"loop-1":
                                continue
                            headers = dict(rec.headers)
                            if H_ERROR in headers:
                                seen.append(f"{headers[H_ERROR_KIND].decode()}: {headers[H_ERROR].decode()}")
                            else:
                                seen.append(float(decode_tensors(rec.value)["y"][0, 0]))
        finally:
            await consumer.stop()
        assert seen[:3] == [1.0, 3.0, 5.0]
        assert str(seen[3]).startswith("revisit_limit: ") and "revisited more than 3 times" in str(seen[3])
        assert {w.node.id for w in host.workers if not w.counters.dead_lettered} == {"step", "again"}
