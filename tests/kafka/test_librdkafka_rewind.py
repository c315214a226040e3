"""On librdkafka, outputs the broker does not acknowledge in time are re-read, not fatal: a broker frozen for
longer than the worker's acknowledgement wait makes the worker rewind (flowserve.runtime.rewind), and every
request is still answered, once to its caller, on every broker kind."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from fs_once import assert_answered_once

from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.kafka.librdkafka import RdConsumer
from flowserve.kafka.settings import WorkerSettings
from flowserve.runtime.batching import FixedPolicy
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology

pytestmark = pytest.mark.slow

TOPOLOGY = """
name: NAME
partitions: 1
deadline_ms: 120000
nodes:
  add: {component: fs_testkit:SlowAddOne, inputs: {x: input.x}}
outputs: {y: add.x}
"""
REQUESTS = 60
#: the broker stays frozen this long: past the worker's 1-s wait for a batch's acknowledgements even after
#: the worker has worked off every request it had already fetched (60 x 20 ms), so the wait must time out
FREEZE_S = 5


@pytest.mark.every_broker
async def test_librdkafka_unacknowledged_outputs_are_re_read(broker: Any, write_topology: Any) -> None:
    kafka = broker.settings()
    topology = load_topology(write_topology(TOPOLOGY))
    host = InlineHost(topology, kafka, WorkerSettings(client="librdkafka", request_timeout_ms=1000),
                      policies={"add": FixedPolicy(size=1, fetch=64)})
    async with host, TopologyClient(topology, kafka) as client:
        await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=60)
        worker = host.workers[0]
        assert isinstance(worker.consumer, RdConsumer)
        before = worker.counters.records_in
        futures = {f"r{i}": client.expect(f"r{i}") for i in range(REQUESTS)}
        for i in range(REQUESTS):
            await client.queue({"x": np.full((1, 4), i, np.float32)}, request_id=f"r{i}")
        await client.flush()
        # Freeze once ten inputs are in: the last of them has been read but its output not yet produced (a
        # worker counts inputs before it processes them), whether the broker hands them over one per fetch
        # (Tansu, at first) or all at once.
        async with asyncio.timeout(30):
            while worker.counters.records_in < before + 10:
                await asyncio.sleep(0.002)  # polling a condition, not waiting out a time
        broker.pause()
        try:
            await asyncio.sleep(FREEZE_S)
        finally:
            broker.resume()
        done, pending = await asyncio.wait(futures.values(), timeout=120)
        if not pending:
            await assert_answered_once(client, kafka, futures)
    assert not pending, f"{len(pending)} unanswered; worker counters {worker.counters.snapshot()}"
    for rid, fut in futures.items():
        np.testing.assert_array_equal(fut.result().tensors["y"], np.full((1, 4), int(rid[1:]) + 1, np.float32))
    assert worker.counters.rewinds >= 1, worker.counters.snapshot()
