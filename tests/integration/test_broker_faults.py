"""A topology on three Apache Kafka brokers (RF 3, min ISR 2) under load loses nothing when a broker
fails: the leader of the input partitions killed (-9) and restarted, the active controller killed and
restarted, or that leader frozen for 10 s. Callers send through the gateway (HTTP) and with the Kafka
client throughout. Every request is answered exactly once to its caller, and the stage's consumer group
ends with no lag."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from fs_once import assert_answered_once

from flowserve.client import TopologyClient
from flowserve.client.http import AsyncHttpClient, V2Response
from flowserve.client.traffic import wait_ready
from flowserve.gateway import Gateway, GatewaySettings
from flowserve.kafka.brokers import ApacheKafka
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology

pytestmark = pytest.mark.slow

TOPOLOGY = """
name: NAME
partitions: 4
deadline_ms: 120000
nodes:
  add: {component: fs_testkit:AddOne, inputs: {x: input.x}, replicas: 2}
outputs: {y: add.x}
"""
PER_PHASE = 150
HTTP_PER_PHASE = 30
HTTP_BASE = 10_000  # HTTP callers' values, apart from the asynchronous callers'


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


def _kill_controller(cluster: ApacheKafka, _leader: int) -> tuple[Callable[[], None], Callable[[], None]]:
    controller = cluster.active_controller()
    return (lambda: cluster.kill_node(controller)), (lambda: cluster.restart_node(controller))


FREEZE_S = 10.0


def _freeze(cluster: ApacheKafka, node: int) -> tuple[Callable[[], None], Callable[[], None]]:
    frozen_at = [0.0]

    def freeze() -> None:
        frozen_at[0] = time.monotonic()
        cluster.pause_node(node)

    def thaw() -> None:  # runs in a thread (see the test): sleeping here holds nothing else up
        time.sleep(max(0.0, frozen_at[0] + FREEZE_S - time.monotonic()))
        cluster.resume_node(node)

    return freeze, thaw


@pytest.mark.parametrize("fault", [_kill_restart, _kill_controller, _freeze],
                         ids=["kill-leader", "kill-controller", "freeze-leader"])
async def test_requests_are_answered_once_through_a_broker_fault(cluster: ApacheKafka, write_topology,
                                                                 fault) -> None:
    kafka = cluster.settings()
    topology = load_topology(write_topology(TOPOLOGY))
    gateway = Gateway([topology], kafka, GatewaySettings(port=0))
    async with (InlineHost(topology, kafka) as host, TopologyClient(topology, kafka) as client, gateway,
                AsyncHttpClient(gateway.url, timeout_s=300) as http):
        await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=120)
        async with asyncio.timeout(60):  # the gateway's readiness has seen the stage's worker too
            while (await http.get(f"/v2/models/{topology.name}/ready")).status != 200:
                await asyncio.sleep(0.1)
        futures: dict[str, asyncio.Future] = {}
        calls: dict[int, asyncio.Task[V2Response]] = {}

        def call(start: int) -> None:
            """HTTP callers through the gateway, alongside the asynchronous ones; awaited at the end."""
            for i in range(start, start + HTTP_PER_PHASE):
                x = np.full((1, 4), HTTP_BASE + i, np.float32)
                calls[i] = asyncio.create_task(http.infer(topology.name, {"x": x}))

        async def send(start: int) -> None:
            for i in range(start, start + PER_PHASE):
                futures[f"r{i}"] = client.expect(f"r{i}")
                await client.queue({"x": np.full((1, 4), i, np.float32)}, request_id=f"r{i}")
            await client.flush()

        call(0)
        await send(0)
        input_topic = next(iter(topology.nodes["add"].input_topics))
        leader = await _leader(kafka, input_topic)
        break_it, heal = await asyncio.to_thread(fault, cluster, leader)
        break_it()
        try:
            call(HTTP_PER_PHASE)
            await send(PER_PHASE)  # written while the leader is gone: the other replicas take over
        finally:
            await asyncio.to_thread(heal)  # a restart waits for the node: the workers share this loop
        call(2 * HTTP_PER_PHASE)
        await send(2 * PER_PHASE)
        done, pending = await asyncio.wait(futures.values(), timeout=180)
        replies = dict(zip(calls, await asyncio.gather(*calls.values()), strict=True))
        missing = sorted(rid for rid, f in futures.items() if not f.done())
        assert not pending, (f"{len(missing)} unanswered, e.g. {missing[:10]}; workers: "
                             f"{[(w.node.id, w.counters.snapshot()) for w in host.workers]}")
        for rid, fut in futures.items():
            assert fut.result().error is None, rid
            np.testing.assert_array_equal(fut.result().tensors["y"], np.full((1, 4), int(rid[1:]) + 1, np.float32))
        assert len(futures) == 3 * PER_PHASE
        await assert_answered_once(client, kafka, futures)
        failed = {i: (r.status, r.error) for i, r in replies.items() if r.status != 200}
        assert not failed, f"{len(failed)} HTTP calls failed, e.g. {list(failed.items())[:5]}"
        for i, reply in replies.items():
            np.testing.assert_array_equal(reply.outputs()["y"], np.full((1, 4), HTTP_BASE + i + 1, np.float32))
        async with asyncio.timeout(60):  # commits trail the replies by up to a commit interval
            while await _lag(kafka, topology.group_id("add"), input_topic):
                await asyncio.sleep(0.2)
