"""A produce the broker does not take in time does not end the worker: it re-reads from its last
acknowledged offsets and answers every request once the broker is back (flowserve.runtime.rewind)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from fs_once import assert_answered_once

from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.kafka.settings import WorkerSettings
from flowserve.runtime.batching import FixedPolicy
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology

pytestmark = pytest.mark.integration

TOPOLOGY = """
name: NAME
partitions: 1
deadline_ms: 120000
nodes:
  add: {component: fs_testkit:SlowAddOne, inputs: {x: input.x}}
outputs: {y: add.x}
"""
REQUESTS = 120


async def test_a_produce_that_times_out_is_re_read_not_fatal(broker, write_topology) -> None:
    kafka = broker.settings()
    topology = load_topology(write_topology(TOPOLOGY))
    # One request per batch, up to 64 per fetch: one step sends batch after batch to the same output
    # partition, so with the broker frozen the third send waits behind the stuck ones and times out.
    host = InlineHost(topology, kafka, WorkerSettings(request_timeout_ms=1000),
                      policies={"add": FixedPolicy(size=1, fetch=64)})
    async with host, TopologyClient(topology, kafka) as client:
        await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=60)
        worker = host.workers[0]
        before = worker.counters.records_in
        futures = {f"r{i}": client.expect(f"r{i}") for i in range(REQUESTS)}
        for i in range(REQUESTS):
            await client.queue({"x": np.full((1, 4), i, np.float32)}, request_id=f"r{i}")
        await client.flush()
        async with asyncio.timeout(30):
            while worker.counters.records_in == before:
                await asyncio.sleep(0.002)
        broker.pause()
        try:
            await asyncio.sleep(3)  # three request timeouts
        finally:
            broker.resume()
        done, pending = await asyncio.wait(futures.values(), timeout=120)
        if not pending:
            await assert_answered_once(client, kafka, futures)

    assert not pending, f"{len(pending)} unanswered; worker counters {worker.counters.snapshot()}"
    for rid, fut in futures.items():
        assert fut.result().error is None, rid
        np.testing.assert_array_equal(fut.result().tensors["y"], np.full((1, 4), int(rid[1:]) + 1, np.float32))
    if broker.name == "embedded":
        # Tansu times the frozen produce out every time. On Apache Kafka the 3-s freeze catches a produce in
        # flight only some of the time (aiokafka re-sends the stuck batch, idempotent, when it does not): there
        # the test holds the "not fatal, every request answered once" half, and the rewind is not asserted.
        assert worker.counters.rewinds >= 1, worker.counters.snapshot()
