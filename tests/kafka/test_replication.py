"""Topics get copies on a cluster (RF min(3, brokers), two in sync), idempotent producers survive a
leader's loss, and asking for more copies than brokers is refused with a message that says what to do."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from flowserve.cli import main
from flowserve.errors import BrokerError
from flowserve.kafka.admin import ensure_topics, replication
from flowserve.kafka.brokers import ApacheKafka
from flowserve.kafka.clients import make_producer
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.topology import load_topology

DIGITS = Path(__file__).parents[2] / "topologies" / "digits.yaml"


def test_replication_defaults_follow_the_cluster_size() -> None:
    assert replication(1) == (1, 1)
    assert replication(2) == (2, 1)
    assert replication(3) == (3, 2)
    assert replication(5) == (3, 2)
    assert replication(3, 3, 3) == (3, 3)


def test_more_copies_than_brokers_is_refused_with_the_fix() -> None:
    with pytest.raises(BrokerError, match=r"replication factor 3 asks for more brokers than the cluster has \(1\) "
                       r"\(a single-node broker, such as the embedded one.*use --replication-factor 1"):
        replication(1, 3)
    with pytest.raises(BrokerError, match="min.insync.replicas 3 must lie between 1 and the replication factor 2"):
        replication(3, 2, 3)


async def _describe(kafka: KafkaSettings, topics: list[str], *,
                    configs: bool = True) -> dict[str, tuple[list[int], str | None]]:
    """Replica count of each partition and ``min.insync.replicas`` (``configs``: the embedded broker has no
    DescribeConfigs), per topic."""
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    await admin.start()
    try:
        out: dict[str, tuple[list[int], str | None]] = {}
        for meta in await admin.describe_topics(topics):
            replicas = sorted(len(p["replicas"]) for p in meta["partitions"])
            if not configs:
                out[meta["topic"]] = (replicas, None)
                continue
            [response] = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, meta["topic"], {"min.insync.replicas": None})])
            [(_, _, _, _, entries)] = response.resources
            isr = next(e[1] for e in entries if e[0] == "min.insync.replicas")
            out[meta["topic"]] = (replicas, isr)
        return out
    finally:
        await admin.close()


async def test_a_single_node_keeps_one_copy_and_refuses_three(kafka: KafkaSettings, unique_name: str) -> None:
    assert await ensure_topics(kafka, [unique_name], 2) == [unique_name]
    assert await _describe(kafka, [unique_name], configs=False) == {unique_name: ([1, 1], None)}
    with pytest.raises(BrokerError, match=r"more brokers than the cluster has \(1\)"):
        await ensure_topics(kafka.model_copy(update={"replication_factor": 3}), [unique_name + "-3"], 2)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ApacheKafka]:
    if shutil.which("java") is None:
        pytest.skip("Apache Kafka needs java on PATH")
    with ApacheKafka.start(nodes=3) as started:
        yield started


@pytest.mark.slow
async def test_topology_topics_on_three_brokers_have_three_copies_two_in_sync(cluster: ApacheKafka) -> None:
    kafka = cluster.settings()
    assert kafka.idempotence
    # through the command line, as an operator creates them
    assert await asyncio.to_thread(main, ["topics", str(DIGITS), "--create", "--broker", cluster.bootstrap]) == 0
    topics = load_topology(DIGITS).topics()
    described = await _describe(kafka, topics)
    assert len(described) == len(topics)
    assert all(replicas == [3] * len(replicas) and isr == "2" for replicas, isr in described.values())
    # more than the cluster has: refused, nothing created
    assert await asyncio.to_thread(main, ["topics", str(DIGITS), "--create", "--partitions", "2",
                                          "--replication-factor", "4", "--broker", cluster.bootstrap]) == 2
    with pytest.raises(BrokerError, match=r"more brokers than the cluster has \(3\)"):
        await ensure_topics(kafka.model_copy(update={"replication_factor": 4}), ["never-made"], 1)
    assert "never-made" not in await _describe_all(kafka)


async def _describe_all(kafka: KafkaSettings) -> list[str]:
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    await admin.start()
    try:
        return list(await admin.list_topics())
    finally:
        await admin.close()


@pytest.mark.slow
async def test_idempotent_writes_survive_the_leader_being_killed(cluster: ApacheKafka) -> None:
    kafka = cluster.settings()
    topic = "idempotent-failover"
    await ensure_topics(kafka, [topic], 1)
    producer = make_producer(kafka, WorkerSettings(), max_message_bytes=1024)
    await producer.start()
    try:
        sent = [str(i).encode() for i in range(200)]
        await asyncio.gather(*[await producer.send(topic, v) for v in sent[:100]])
        admin = AIOKafkaAdminClient(**kafka.client_kwargs())
        await admin.start()
        try:
            [meta] = await admin.describe_topics([topic])
            leader = meta["partitions"][0]["leader"]
        finally:
            await admin.close()
        node = leader  # node i has node.id i
        cluster.kill_node(node)  # kill -9: min ISR 2 of 3 copies still takes acks=all writes
        await asyncio.gather(*[await producer.send(topic, v) for v in sent[100:]])
    finally:
        await producer.stop()
    cluster.restart_node(node)
    consumer = AIOKafkaConsumer(topic, group_id=None, auto_offset_reset="earliest", **kafka.client_kwargs())
    await consumer.start()
    try:
        got: list[bytes] = []
        async with asyncio.timeout(60):
            while len(got) < len(sent):
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend(r.value for r in records if r.value is not None)
    finally:
        await consumer.stop()
    assert got == sent  # each exactly once, in order
