"""The worker's librdkafka clients (flowserve.kafka.librdkafka) against real brokers of every kind: records
with aiokafka's attribute names, commits that hold, seeks that re-read, a getmany cut short that loses
nothing, a rebalance listener whose drain commits inside the revoke, and delivery failures raised as the
aiokafka errors the worker's rewind reads. Then one worker per client answering every request."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import confluent_kafka as ck
import numpy as np
import pytest
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka import errors as ae

from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.kafka.admin import ensure_topics
from flowserve.kafka.clients import make_data_plane
from flowserve.kafka.librdkafka import RdConsumer, RdOutbox, RdProducer, error_of
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.runtime.host import InlineHost
from flowserve.runtime.metrics import read_snapshots
from flowserve.runtime.rewind import transient
from flowserve.topology import load_topology

TIMEOUT_S = 60  # a bound on a hung broker, not a timing assertion


def _plane(kafka: KafkaSettings, group: str) -> tuple[RdConsumer, RdProducer, RdOutbox]:
    consumer, producer, outbox = make_data_plane(kafka, WorkerSettings(client="librdkafka"), group_id=group,
                                                 max_message_bytes=1 << 20, client_id=group)
    assert isinstance(consumer, RdConsumer) and isinstance(outbox, RdOutbox)
    return consumer, producer, outbox


async def _read(consumer: RdConsumer, count: int) -> list[Any]:
    records: list[Any] = []
    async with asyncio.timeout(TIMEOUT_S):
        while len(records) < count:
            for recs in (await consumer.getmany(timeout_ms=100, max_records=count - len(records))).values():
                records.extend(recs)
    return records


class _Listener(ConsumerRebalanceListener):
    """Commits ``pending`` when partitions are revoked, as the worker's drain does."""

    def __init__(self, consumer: RdConsumer) -> None:
        self.consumer = consumer
        self.pending: dict[TopicPartition, int] = {}
        self.revoked: list[set[TopicPartition]] = []
        self.assigned: list[set[TopicPartition]] = []

    async def on_partitions_revoked(self, revoked: Any) -> None:
        if self.pending:
            await self.consumer.commit(self.pending)
        self.revoked.append(set(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.assigned.append(set(assigned))


def test_librdkafka_errors_become_the_aiokafka_errors_the_worker_reads() -> None:
    timed_out = error_of(ck.KafkaError(ck.KafkaError._MSG_TIMED_OUT))
    assert isinstance(timed_out, ae.KafkaTimeoutError) and transient(timed_out)
    replicas = error_of(ck.KafkaError(ck.KafkaError.NOT_ENOUGH_REPLICAS))
    assert isinstance(replicas, ae.NotEnoughReplicasError) and transient(replicas)
    too_large = error_of(ck.KafkaError(ck.KafkaError.MSG_SIZE_TOO_LARGE))
    assert isinstance(too_large, ae.MessageSizeTooLargeError) and not transient(too_large)
    local = error_of(ck.KafkaError(ck.KafkaError._UNKNOWN_PARTITION))
    assert type(local) is ae.KafkaError and not transient(local)


def test_librdkafka_config_carries_tls_and_sasl_settings() -> None:
    kafka = KafkaSettings(bootstrap="a:1,b:2", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                          sasl_username="u", sasl_password="p", ssl_cafile="/ca.pem")  # type: ignore[arg-type]
    assert kafka.librdkafka_config() == {
        "bootstrap.servers": "a:1,b:2", "security.protocol": "sasl_ssl", "ssl.ca.location": "/ca.pem",
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u", "sasl.password": "p"}
    assert KafkaSettings(bootstrap="a:1", ssl_cafile="/ca.pem").librdkafka_config() == {
        "bootstrap.servers": "a:1", "security.protocol": "plaintext"}


@pytest.mark.every_broker
async def test_librdkafka_records_commits_seeks_and_a_cancelled_fetch(broker: Any) -> None:
    kafka = broker.settings()
    topic, group = f"rd-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka, [topic], 2)
    consumer, producer, outbox = _plane(kafka, group)
    await producer.start()
    await consumer.start()
    try:
        consumer.subscribe([topic], listener=_Listener(consumer))
        # A fetch cut short (the worker's step cancelled) hands its records to the next one.
        waiting = asyncio.ensure_future(consumer.getmany(timeout_ms=5_000, max_records=100))
        await asyncio.sleep(0)
        waiting.cancel()
        for i in range(10):
            outbox.add(topic, i % 2, f"k{i}".encode(), f"v{i}".encode(), [("fs-id", f"k{i}".encode())])
        assert await outbox.flush() == 10
        records = await _read(consumer, 10)
        assert sorted(r.value for r in records) == sorted(f"v{i}".encode() for i in range(10))
        first = records[0]
        assert first.headers == [("fs-id", first.key)] and first.timestamp > 0
        assert consumer.assignment() == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
        assert consumer.highwater(TopicPartition(topic, 0)) == 5
        # Seeking back re-reads from there (the rewind after a failed produce).
        consumer.seek(TopicPartition(topic, 0), 3)
        again = await _read(consumer, 2)
        assert [(r.partition, r.offset) for r in again] == [(0, 3), (0, 4)]
        await consumer.commit({TopicPartition(topic, 0): 4, TopicPartition(topic, 1): 5})
    finally:
        await consumer.stop()
    # A new member of the group starts at the committed offsets.
    successor, _, _ = _plane(kafka, group)
    await successor.start()
    try:
        successor.subscribe([topic])
        rest = await _read(successor, 1)
        assert [(r.partition, r.offset, r.value) for r in rest] == [(0, 4, b"v8")]
    finally:
        await successor.stop()
        await producer.stop()


@pytest.mark.every_broker
async def test_librdkafka_revoke_waits_for_the_listener_whose_commit_holds(broker: Any) -> None:
    kafka = broker.settings()
    topic, group = f"rd-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka, [topic], 2)
    first, producer, outbox = _plane(kafka, group)
    await producer.start()
    await first.start()
    second, _, _ = _plane(kafka, group)
    listener = _Listener(first)
    try:
        first.subscribe([topic], listener=listener)
        for i in range(6):
            outbox.add(topic, i % 2, f"k{i}".encode(), f"v{i}".encode(), [])
        await outbox.flush()
        records = await _read(first, 6)
        listener.pending = {TopicPartition(topic, p): 3 for p in (0, 1)}  # all read, acknowledged elsewhere
        await second.start()
        second.subscribe([topic])
        # The first keeps polling (as the worker's loop does) while the group rebalances around it.
        async with asyncio.timeout(TIMEOUT_S):
            while not listener.revoked or len(second.assignment()) + len(first.assignment()) < 2:
                assert not await first.getmany(timeout_ms=100)
                await second.getmany(timeout_ms=100)
        assert listener.revoked[0] == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
        # The commit made inside the revoke held: nobody re-reads the six records.
        for consumer in (first, second):
            assert not await consumer.getmany(timeout_ms=500)
        assert len(records) == 6
    finally:
        await second.stop()
        await first.stop()
        await producer.stop()


@pytest.mark.every_broker
async def test_librdkafka_a_refused_record_fails_its_batch_with_an_aiokafka_error(broker: Any) -> None:
    kafka = broker.settings()
    topic = f"rd-{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka, [topic], 1)
    _, producer, outbox = _plane(kafka, f"g-{topic}")
    await producer.start()
    try:
        outbox.add(topic, 0, b"ok", b"fine", [])
        outbox.add(topic, 0, b"big", bytes(2 << 20), [])  # over message.max.bytes
        with pytest.raises(ae.KafkaError) as caught:
            await asyncio.wait_for(outbox.flush(), TIMEOUT_S)
        assert not transient(caught.value)
    finally:
        await producer.stop()


TOPOLOGY = """
name: NAME
partitions: 2
deadline_ms: 60000
nodes:
  add: {component: fs_testkit:AddOne, inputs: {x: input.x}}
outputs: {y: add.x}
"""


@pytest.mark.parametrize("client", ["librdkafka", "aiokafka"])
async def test_librdkafka_or_aiokafka_worker_answers_every_request(kafka: KafkaSettings, write_topology: Any,
                                                                   client: str) -> None:
    topology = load_topology(write_topology(TOPOLOGY))
    host = InlineHost(topology, kafka, WorkerSettings(client=client))  # type: ignore[arg-type]
    async with host, TopologyClient(topology, kafka) as tc:
        await wait_ready(tc, {"x": np.zeros((1, 4), np.float32)}, timeout_s=TIMEOUT_S)
        assert isinstance(host.workers[0].consumer, RdConsumer) == (client == "librdkafka")
        futures = {f"r{i}": tc.expect(f"r{i}") for i in range(40)}
        for i in range(40):
            await tc.queue({"x": np.full((1, 4), i, np.float32)}, request_id=f"r{i}")
        await tc.flush()
        done, pending = await asyncio.wait(futures.values(), timeout=TIMEOUT_S)
    assert not pending
    for rid, fut in futures.items():
        np.testing.assert_array_equal(fut.result().tensors["y"], np.full((1, 4), int(rid[1:]) + 1, np.float32))
    assert host.workers[0].counters.commits >= 1
    # The last metrics snapshot went out through the same producer (send_and_wait) when the worker stopped.
    assert [s["node"] for s in await read_snapshots(topology, kafka)] == ["add"]
