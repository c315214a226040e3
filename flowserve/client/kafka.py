"""Call a topology asynchronously over Kafka: produce requests to its inputs, read its outputs.

Replies are deduplicated by request id (delivery is at-least-once), so each request resolves once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from aiokafka import AIOKafkaConsumer, TopicPartition

from flowserve.errors import WireError
from flowserve.kafka.clients import make_producer
from flowserve.kafka.outbox import Outbox
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.topology.graph import Topology
from flowserve.wire.envelope import (
    H_DEADLINE,
    H_ERROR,
    decode_record,
    make_headers,
    new_request_id,
    new_traceparent,
    now_ms,
)
from flowserve.wire.tensors import encode_tensors


@dataclass(slots=True)
class Reply:
    request_id: str
    tensors: dict[str, np.ndarray]
    error: str | None
    headers: dict[str, bytes]
    timestamp_ms: int  # when the outputs record was written
    received_ms: int = field(default_factory=now_ms)


class TopologyClient:
    """Send requests to a topology and receive its replies, matched and deduplicated by request id."""

    def __init__(self, topology: Topology, kafka: KafkaSettings, *, partitions: int | None = None) -> None:
        self.topology = topology
        self.kafka = kafka
        self.partitions = partitions or topology.spec.partitions
        self.duplicates = 0
        self._settings = WorkerSettings()
        self._producer = make_producer(kafka, self._settings, max_message_bytes=topology.spec.max_message_bytes)
        self._outbox = Outbox(self._producer)
        self._consumer: AIOKafkaConsumer | None = None
        self._waiters: dict[str, asyncio.Future[Reply]] = {}
        self._done: dict[str, None] = {}
        self._unclaimed: asyncio.Queue[Reply] = asyncio.Queue(maxsize=100_000)
        self._reader: asyncio.Task[None] | None = None
        self._partition = 0

    async def start(self) -> None:
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            group_id=None, enable_auto_commit=False, fetch_max_wait_ms=self.kafka.fetch_max_wait_ms,
            **self.kafka.client_kwargs(),
        )
        await self._consumer.start()
        tps = [TopicPartition(self.topology.outputs_topic, p) for p in range(self.partitions)]
        self._consumer.assign(tps)
        await self._consumer.seek_to_end(*tps)
        for tp in tps:  # resolve positions now so replies to requests sent next are not skipped
            await self._consumer.position(tp)
        self._reader = asyncio.create_task(self._read())

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._consumer is not None:
            await self._consumer.stop()
        await self._producer.stop()

    async def __aenter__(self) -> TopologyClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _headers(self, request_id: str, deadline_ms: int | None, extra: Mapping[str, str] | None):
        return make_headers(request_id, topology=self.topology.name, version=self.topology.version,
                            deadline_ms=deadline_ms, traceparent=new_traceparent(), extra=extra)

    async def queue(self, tensors: Mapping[str, np.ndarray], *, request_id: str | None = None,
                    timeout_ms: int | None = None, headers: Mapping[str, str] | None = None,
                    raw_value: bytes | None = None) -> str:
        """Queue one request (sent by :meth:`flush`). Returns its request id."""
        rid = request_id or new_request_id()
        deadline = now_ms() + (timeout_ms if timeout_ms is not None else self.topology.spec.deadline_ms)
        value = raw_value if raw_value is not None else encode_tensors(tensors)
        self._partition = (self._partition + 1) % self.partitions
        self._outbox.add(self.topology.inputs_topic, self._partition, rid.encode(), value,
                               self._headers(rid, deadline, headers))
        return rid

    async def flush(self) -> None:
        await self._outbox.flush()

    async def send(self, tensors: Mapping[str, np.ndarray], **kwargs: object) -> str:
        rid = await self.queue(tensors, **kwargs)  # type: ignore[arg-type]
        await self.flush()
        return rid

    def expect(self, request_id: str) -> asyncio.Future[Reply]:
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = fut
        return fut

    async def call(self, tensors: Mapping[str, np.ndarray], *, timeout_ms: int | None = None,
                   **kwargs: object) -> Reply:
        """Send one request and wait for its reply (or its deadline)."""
        rid = str(kwargs.pop("request_id", None) or new_request_id())
        fut = self.expect(rid)
        timeout = timeout_ms if timeout_ms is not None else self.topology.spec.deadline_ms
        await self.send(tensors, request_id=rid, timeout_ms=timeout, **kwargs)
        try:
            return await asyncio.wait_for(fut, timeout / 1000 + 1.0)
        finally:
            self._waiters.pop(rid, None)

    async def replies(self) -> Reply:
        """The next reply nobody is waiting for via :meth:`call` or :meth:`expect`."""
        return await self._unclaimed.get()

    async def _read(self) -> None:
        assert self._consumer is not None
        while True:
            fetched = await self._consumer.getmany(timeout_ms=100, max_records=10_000)
            for records in fetched.values():
                for rec in records:
                    self._deliver(rec)

    def _deliver(self, rec: object) -> None:
        key, value, headers = rec.key, rec.value, rec.headers  # type: ignore[attr-defined]
        try:
            if value[:1] == b"{":
                body = json.loads(value)
                env_tensors: dict[str, np.ndarray] = {}
                hdrs = dict(headers or ())
                rid = key.decode() if key else body.get("id", "")
            else:
                env = decode_record(key, value, headers)
                env_tensors, hdrs, rid = env.tensors, env.headers, env.request_id
        except (WireError, ValueError):
            return
        if rid in self._done:
            self.duplicates += 1
            return
        self._done[rid] = None
        if len(self._done) > 1_000_000:
            self._done.pop(next(iter(self._done)))
        error = hdrs.get(H_ERROR)
        reply = Reply(rid, env_tensors, error.decode("utf-8", "replace") if error else None, hdrs,
                      rec.timestamp)  # type: ignore[attr-defined]
        fut = self._waiters.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result(reply)
        else:
            with contextlib.suppress(asyncio.QueueFull):
                self._unclaimed.put_nowait(reply)


__all__ = ["H_DEADLINE", "Reply", "TopologyClient", "new_request_id"]
