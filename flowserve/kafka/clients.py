"""Kafka consumers and producers configured for flowserve (one place for every client's settings).

The stage worker's data plane (:func:`make_data_plane`) runs on librdkafka or aiokafka
(``WorkerSettings.client``); the other clients (gateway, capture, parity, tuner, admin) are aiokafka's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import KafkaConnectionError

from flowserve.errors import BrokerError
from flowserve.kafka.outbox import Outbox
from flowserve.kafka.settings import KafkaSettings, WorkerSettings

try:
    from flowserve.kafka import librdkafka
except ImportError:  # confluent-kafka is not installed: the worker falls back to aiokafka
    librdkafka = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

# Headroom over the largest record: batch framing, headers, key.
OVERHEAD = 64 * 1024
#: Consumers and producers refresh cluster metadata at least this often (producers: to see partitions added
#: while they run, flowserve.tuning.partitions). aiokafka 0.14 does not refresh it when the
#: ListOffsets that resolves a partition's position (after a rebalance, with no committed offset) fails with
#: NOT_LEADER: it asks the same stale leader again until the metadata ages out (5 minutes by default). After
#: a broker fault this stalled a partition for minutes (the freeze-leader test); the Java client fixed the
#: same loop in KAFKA-9535. One metadata request per client every 10 s is the bound's price.
METADATA_MAX_AGE_MS = 10_000
#: librdkafka producers: requests in flight per broker connection. Sending as soon as a record was queued
#: (linger.ms 0) with no bound (its default, 1,000,000 without idempotence), a batch of records left as many
#: tiny requests: 25-45k records/s where 5 gave 200-280k (100-byte records, acks=all, Apache Kafka, one
#: producer). 5 is also the most idempotence allows.
MAX_IN_FLIGHT = 5
#: librdkafka producers: how long a record may wait for others to fill its request. The worker's producer
#: sends each batch handed over at once by flushing (flowserve.kafka.librdkafka.RdProducer), so this only
#: bounds a record queued while a flush was already ending.
LINGER_MS = 5


def make_consumer(kafka: KafkaSettings, worker: WorkerSettings, *, group_id: str | None,
                  max_message_bytes: int, **extra: object) -> AIOKafkaConsumer:
    # Range assignment gives one consumer the same partition numbers of every topic it reads,
    # which is what keeps fan-in joins co-partitioned.
    return AIOKafkaConsumer(
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset=worker.auto_offset_reset,
        fetch_max_wait_ms=kafka.fetch_max_wait_ms if worker.fetch_max_wait_ms is None else worker.fetch_max_wait_ms,
        fetch_min_bytes=worker.fetch_min_bytes,
        max_partition_fetch_bytes=max(worker.max_partition_fetch_bytes, max_message_bytes + OVERHEAD),
        session_timeout_ms=worker.session_timeout_ms,
        heartbeat_interval_ms=worker.heartbeat_interval_ms,
        max_poll_interval_ms=worker.rebalance_timeout_ms,
        rebalance_timeout_ms=worker.rebalance_timeout_ms,
        partition_assignment_strategy=(RangePartitionAssignor,),
        metadata_max_age_ms=METADATA_MAX_AGE_MS,
        **kafka.client_kwargs(),
        **extra,
    )


def make_producer(kafka: KafkaSettings, worker: WorkerSettings, *, max_message_bytes: int,
                  **extra: object) -> AIOKafkaProducer:
    # Idempotence needs acks=all; with it a send retried after a leader change is not written twice.
    idempotent = kafka.idempotence and worker.acks == "all"
    return AIOKafkaProducer(
        acks=worker.acks,
        request_timeout_ms=worker.request_timeout_ms,
        enable_idempotence=idempotent,
        linger_ms=0,
        max_batch_size=max(worker.producer_batch_bytes, max_message_bytes + OVERHEAD),
        max_request_size=max_message_bytes + OVERHEAD,
        # a producer that learns of new partitions within 10 s lets a client spread over them (flowserve tune)
        metadata_max_age_ms=METADATA_MAX_AGE_MS,
        **kafka.client_kwargs(),
        **extra,
    )


def make_data_plane(kafka: KafkaSettings, worker: WorkerSettings, *, group_id: str, max_message_bytes: int,
                    client_id: str) -> tuple[Any, Any, Any]:
    """A stage worker's consumer, producer and outbox, on the client ``worker.client`` names.

    Both kinds offer the same interface (aiokafka's, as far as the worker uses it) and raise aiokafka's
    error classes; :mod:`flowserve.kafka.librdkafka` says how librdkafka's are adapted.
    """
    if worker.client == "librdkafka" and librdkafka is None:
        log.warning("FLOWSERVE_WORKER_CLIENT=librdkafka but confluent-kafka is not installed: using aiokafka")
    if worker.client == "aiokafka" or librdkafka is None:
        consumer = make_consumer(kafka, worker, group_id=group_id, max_message_bytes=max_message_bytes,
                                 client_id=client_id)
        producer = make_producer(kafka, worker, max_message_bytes=max_message_bytes, client_id=client_id)
        return consumer, producer, Outbox(producer)
    consumer_config = librdkafka_consumer_config(kafka, worker, group_id=group_id,
                                                 max_message_bytes=max_message_bytes, client_id=client_id)
    producer_config = librdkafka_producer_config(kafka, worker, max_message_bytes=max_message_bytes,
                                                 client_id=client_id)
    producer = librdkafka.RdProducer(producer_config)
    return librdkafka.RdConsumer(consumer_config), producer, librdkafka.RdOutbox(producer)


def _librdkafka_common(kafka: KafkaSettings, client_id: str) -> dict[str, Any]:
    return {**kafka.librdkafka_config(), "client.id": client_id,
            "topic.metadata.refresh.interval.ms": METADATA_MAX_AGE_MS,
            # librdkafka leaves Nagle's algorithm on (asyncio, so aiokafka, turns it off): a small request
            # written behind an unacknowledged one would wait for the peer's delayed ACK (40 ms on Linux)
            "socket.nagle.disable": True}


def librdkafka_consumer_config(kafka: KafkaSettings, worker: WorkerSettings, *, group_id: str,
                               max_message_bytes: int, client_id: str) -> dict[str, Any]:
    """The librdkafka settings of a stage worker's consumer (also what hop-cpu's librdkafka floors run on)."""
    return {
        **_librdkafka_common(kafka, client_id),
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
        "auto.offset.reset": worker.auto_offset_reset,
        "fetch.wait.max.ms": kafka.fetch_max_wait_ms if worker.fetch_max_wait_ms is None else worker.fetch_max_wait_ms,
        "fetch.min.bytes": worker.fetch_min_bytes,
        "max.partition.fetch.bytes": max(worker.max_partition_fetch_bytes, max_message_bytes + OVERHEAD),
        "session.timeout.ms": worker.session_timeout_ms,
        "heartbeat.interval.ms": worker.heartbeat_interval_ms,
        "max.poll.interval.ms": max(worker.rebalance_timeout_ms, worker.session_timeout_ms),
        # range: one consumer gets the same partition numbers of every topic it reads (co-partitioned joins)
        "partition.assignment.strategy": "range",
        # once its prefetch queue is full (queued.max.messages.kbytes), librdkafka waits this long before
        # fetching again even when the worker has drained it meanwhile (default 1 s: a stall under backlog)
        "fetch.queue.backoff.ms": 10,
    }


def librdkafka_producer_config(kafka: KafkaSettings, worker: WorkerSettings, *, max_message_bytes: int,
                               client_id: str) -> dict[str, Any]:
    """The librdkafka settings of a stage worker's producer (also what hop-cpu's librdkafka floors run on)."""
    return {
        **_librdkafka_common(kafka, client_id),
        "acks": str(worker.acks),
        # Idempotence needs acks=all; with it a send retried after a leader change is not written twice.
        "enable.idempotence": kafka.idempotence and worker.acks == "all",
        # a batch handed over leaves at once (RdProducer's flush); the wait bounds a record queued meanwhile
        "linger.ms": LINGER_MS,
        "max.in.flight": MAX_IN_FLIGHT,
        "batch.size": max(worker.producer_batch_bytes, max_message_bytes + OVERHEAD),
        "message.max.bytes": max_message_bytes + OVERHEAD,
        # librdkafka gives a record up after this (a delivery failure the worker answers with a rewind) where
        # it would otherwise retry for 5 minutes; the worker stops waiting after request_timeout_ms anyway.
        "message.timeout.ms": worker.request_timeout_ms,
        "request.timeout.ms": worker.request_timeout_ms,
    }


async def why_unreachable(kafka: KafkaSettings, timeout_s: float = 10.0) -> str:
    """What one direct connection to the first bootstrap address says went wrong ("" if it connects).

    aiokafka's clients only log why a bootstrap failed (an authentication failure, a certificate that
    does not verify) and raise "Unable to bootstrap"; this finds the reason to put in the error.
    """
    from aiokafka.conn import create_conn

    host, _, port = kafka.bootstrap.split(",")[0].rpartition(":")
    options = kafka.client_kwargs()
    del options["bootstrap_servers"]
    try:
        conn = await asyncio.wait_for(create_conn(host, int(port), **options), timeout_s)
    except Exception as exc:  # noqa: BLE001 - any failure is the answer
        return f"{type(exc).__name__}: {exc}" if str(exc) else repr(exc)
    conn.close()
    return ""


async def unreachable(kafka: KafkaSettings, exc: BaseException | None) -> BrokerError:
    """A :class:`BrokerError` that says why ``kafka`` could not be reached, and which settings to check."""
    reason = await why_unreachable(kafka) or repr(exc or "unknown")
    hint = ""
    if "authenticat" in reason.lower():
        hint = ("; check FLOWSERVE_SASL_USERNAME, FLOWSERVE_SASL_PASSWORD and FLOWSERVE_SASL_MECHANISM "
                f"({kafka.sasl_mechanism}) for user {kafka.sasl_username!r}")
    elif "ssl" in reason.lower() or "certificate" in reason.lower():
        hint = "; check FLOWSERVE_SSL_CAFILE (the CA that signed the brokers' certificates) and the address"
    elif kafka.security_protocol != "PLAINTEXT":
        hint = f"; is {kafka.bootstrap} a {kafka.security_protocol} listener?"
    return BrokerError(f"cannot reach Kafka at {kafka.bootstrap} ({kafka.security_protocol}): {reason}{hint}")


async def start_client(client: Any, kafka: KafkaSettings) -> None:
    """``await client.start()``, a connection failure raised as :func:`unreachable` explains it."""
    try:
        await client.start()
    except KafkaConnectionError as exc:
        raise await unreachable(kafka, exc) from None
