"""Batch-native producing: records are grouped per topic-partition into aiokafka batches.

One ``send_batch`` per partition instead of one ``send`` per record is what keeps the hot path
near the raw batch API's rate (see ``flowserve bench passthrough``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer


class Outbox:
    """Collects records for one batch, then sends them and waits until the broker acknowledged all."""

    __slots__ = ("_builders", "_full", "_producer", "count")

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._producer = producer
        self._builders: dict[tuple[str, int], Any] = {}
        self._full: list[tuple[str, int, Any]] = []
        self.count = 0

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes,
            headers: Sequence[tuple[str, bytes]]) -> None:
        """Queue a record. Synchronous on purpose: no coroutine per record on the hot path."""
        tp = (topic, partition)
        builder = self._builders.get(tp)
        if builder is None:
            builder = self._builders[tp] = self._producer.create_batch()
        if builder.append(key=key, value=value, timestamp=None, headers=headers) is None:
            # Batch full: park it and start another for the same partition.
            self._full.append((topic, partition, builder))
            builder = self._builders[tp] = self._producer.create_batch()
            if builder.append(key=key, value=value, timestamp=None, headers=headers) is None:
                raise ValueError(f"record of {len(value)} bytes does not fit in an empty batch for {topic}")
        self.count += 1

    async def send(self) -> tuple[int, list[asyncio.Future]]:
        """Hand every queued batch to the producer; returns the record count and delivery futures."""
        # Take everything queued so far before the first await: other coroutines may keep adding
        # records meanwhile, and those go out with the next send.
        full, self._full = self._full, []
        builders, self._builders = self._builders, {}
        sent, self.count = self.count, 0
        futures: list[asyncio.Future] = []
        for topic, partition, builder in full:
            futures.append(await self._send_batch(builder, topic, partition))
        for (topic, partition), builder in builders.items():
            if builder.record_count():
                futures.append(await self._send_batch(builder, topic, partition))
        return sent, futures

    async def _send_batch(self, builder: Any, topic: str, partition: int) -> asyncio.Future:
        known = self._producer.client.cluster.partitions_for_topic(topic)
        if known is not None and partition not in known:
            # The topic gained partitions (flowserve tune) since this producer's metadata was fetched, and an
            # input from one of them is being answered: refresh now rather than fail on "Unrecognized
            # partition". A set lookup per batch, not per record.
            await self._producer.client.force_metadata_update()
        return await self._producer.send_batch(builder, topic, partition=partition)

    def discard(self) -> None:
        """Drop every queued record (the worker re-reads their inputs after a failed produce)."""
        self._builders, self._full, self.count = {}, [], 0

    async def flush(self) -> int:
        """Send what is queued and wait for every acknowledgement. Raises if any send failed."""
        sent, futures = await self.send()
        if futures:
            await asyncio.gather(*futures)
        return sent
