"""Reading a topic back in a test: every record from the start of each partition up to its end as it is now."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from flowserve.kafka.settings import KafkaSettings


async def read_to_end(kafka: KafkaSettings, topic: str, partitions: int, *, timeout_s: float = 120.0) -> list[Any]:
    """The records of ``topic`` (partitions ``0 .. partitions-1``) from the beginning to the end offsets read
    when it starts, with no consumer group; bounded by ``timeout_s`` (a hung broker fails the test)."""
    consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, fetch_max_wait_ms=5,
                                **kafka.client_kwargs())
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[Any] = []
        async with asyncio.timeout(timeout_s):
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                for records in (await consumer.getmany(timeout_ms=200, max_records=10_000)).values():
                    out.extend(records)
        return out
    finally:
        await consumer.stop()
