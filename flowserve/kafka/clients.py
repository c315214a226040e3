"""aiokafka consumers and producers configured for flowserve (one place for every client's settings)."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.coordinator.assignors.range import RangePartitionAssignor

from flowserve.kafka.settings import KafkaSettings, WorkerSettings

# Headroom over the largest record: batch framing, headers, key.
OVERHEAD = 64 * 1024


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
        **kafka.client_kwargs(),
        **extra,
    )


def make_producer(kafka: KafkaSettings, worker: WorkerSettings, *, max_message_bytes: int,
                  **extra: object) -> AIOKafkaProducer:
    # Idempotence needs acks=all; with it a send retried after a leader change is not written twice.
    idempotent = kafka.idempotence and worker.acks == "all"
    return AIOKafkaProducer(
        acks=worker.acks,
        enable_idempotence=idempotent,
        linger_ms=0,
        max_batch_size=max(worker.producer_batch_bytes, max_message_bytes + OVERHEAD),
        max_request_size=max_message_bytes + OVERHEAD,
        **kafka.client_kwargs(),
        **extra,
    )
