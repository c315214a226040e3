"""A topology on three Apache Kafka brokers (RF 3, min ISR 2) under load loses nothing when a broker
fails: the leader of the input partitions killed (-9) and restarted, or frozen for a while. Every
request is answered exactly once to its caller, and the stage's consumer group ends with no lag."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.kafka.brokers import ApacheKafka
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPOLOGY = """
name: NAME
partitions: 4
deadline_ms: 120000
nodes:
  add: {component: fs_testkit:AddOne, inputs: {x: input.x}, replicas: 2}
outputs: {y: add.x}
"""
PER_PHASE = 150


@pytest.fixture(scope="module")
def cluster() -> Iterator[ApacheKafka]:
    if shutil.which("java") is None:
        pytest.skip("Apache Kafka needs java on PATH")
    with ApacheKafka.start(nodes=3) as started:
        yield started


async def _leader(kafka: KafkaSettings, topic: str) -> int:
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    await admin.start()
    try:
        [meta] = await admin.describe_topics([topic])
        return int(next(p["leader"] for p in meta["partitions"] if p["partition"] == 0))
    finally:
        await admin.close()


async def _lag(kafka: KafkaSettings, group: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(**kafka.client_kwargs())
    await consumer.start()
    try:
        parts = [tp for tp in committed if tp.topic == topic]
        ends = await consumer.end_offsets(parts)
    finally:
        await consumer.stop()
    return sum(ends[tp] - committed[tp].offset for tp in parts)


def _kill_restart(cluster: ApacheKafka, node: int) -> tuple[Callable[[], None], Callable[[], None]]:
    return (lambda: cluster.kill_node(node)), (lambda: cluster.restart_node(node))


def _freeze(cluster: ApacheKafka, node: int) -> tuple[Callable[[], None], Callable[[], None]]:
    return (lambda: cluster.pause_node(node)), (lambda: cluster.resume_node(node))


FROZEN = pytest.mark.xfail(strict=False, reason=(
    "known defect (issue 18), two causes found on 2026-12-01: (1) after the rebalance a consumer resolving a "
    "partition's position asked the frozen, stale leader forever (aiokafka 0.14 does not refresh metadata on a "
    "failed ListOffsets; bounded now by METADATA_MAX_AGE_MS); (2) a produce that times out while the leader "
    "is frozen raises KafkaTimeoutError out of the worker's step and the worker dies (InlineHost does not "
    "restart it; `flowserve run` does) - 1 run in 6 after the first fix"))


@pytest.mark.parametrize("fault", [_kill_restart, pytest.param(_freeze, marks=FROZEN)],
                         ids=["kill-leader", "freeze-leader"])
async def test_requests_are_answered_once_through_a_broker_fault(cluster: ApacheKafka, write_topology,
                                                                 fault) -> None:
    kafka = cluster.settings()
    topology = load_topology(write_topology(TOPOLOGY))
    async with InlineHost(topology, kafka) as host, TopologyClient(topology, kafka) as client:
        await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=120)
        futures: dict[str, asyncio.Future] = {}

        async def send(start: int) -> None:
            for i in range(start, start + PER_PHASE):
                futures[f"r{i}"] = client.expect(f"r{i}")
                await client.queue({"x": np.full((1, 4), i, np.float32)}, request_id=f"r{i}")
            await client.flush()

        await send(0)
        input_topic = next(iter(topology.nodes["add"].input_topics))
        leader = await _leader(kafka, input_topic)
        break_it, heal = fault(cluster, leader)
        break_it()
        try:
            await send(PER_PHASE)  # written while the leader is gone: the other replicas take over
        finally:
            await asyncio.to_thread(heal)  # a restart waits for the node: the workers share this loop
        await send(2 * PER_PHASE)
        done, pending = await asyncio.wait(futures.values(), timeout=180)
        missing = sorted(rid for rid, f in futures.items() if not f.done())
        assert not pending, (f"{len(missing)} unanswered, e.g. {missing[:10]}; workers: "
                             f"{[(w.node.id, w.counters.snapshot()) for w in host.workers]}")
        for rid, fut in futures.items():
            assert fut.result().error is None, rid
            np.testing.assert_array_equal(fut.result().tensors["y"], np.full((1, 4), int(rid[1:]) + 1, np.float32))
        assert len(futures) == 3 * PER_PHASE
        async with asyncio.timeout(60):  # commits trail the replies by up to a commit interval
            while await _lag(kafka, topology.group_id("add"), input_topic):
                await asyncio.sleep(0.2)
