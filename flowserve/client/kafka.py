"""Call a topology asynchronously over Kafka: produce requests to its inputs, read its outputs.

Replies are deduplicated by request id (delivery is at-least-once), so each request resolves once. The
matching, deduplication and batching are the request-reply engine's
(:class:`flowserve.kafka.replies.ReplyRouter`); this client adds the topology's topics and headers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import numpy as np

from flowserve.errors import DeadlineExceeded
from flowserve.kafka.replies import GROWTH_CHECK_S, Reply, ReplyCounters, ReplyRouter
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology.graph import Topology
from flowserve.wire.envelope import (
    H_DEADLINE,
    Headers,
    make_headers,
    new_request_id,
    new_traceparent,
    now_ms,
)
from flowserve.wire.tensors import encode_tensors


class TopologyClient:
    """Send requests to a topology and receive its replies, matched and deduplicated by request id."""

    def __init__(self, topology: Topology, kafka: KafkaSettings, *, partitions: int | None = None) -> None:
        self.topology = topology
        self.kafka = kafka
        self.partitions = partitions or topology.spec.partitions
        self._router = ReplyRouter(kafka, [(topology.outputs_topic, p) for p in range(self.partitions)],
                                   max_message_bytes=topology.spec.max_message_bytes, unclaimed=100_000,
                                   remember=1_000_000, label=f"the client of topology '{topology.name}'")
        self._partition = 0
        self._next_growth_check = 0.0

    @property
    def counters(self) -> ReplyCounters:
        return self._router.counters

    @property
    def duplicates(self) -> int:
        """Replies dropped because their request was already answered."""
        return self._router.counters.duplicates

    async def start(self) -> None:
        await self._router.start()

    async def stop(self) -> None:
        await self._router.stop()

    async def __aenter__(self) -> TopologyClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _headers(self, request_id: str, deadline_ms: int | None, extra: Mapping[str, str] | None) -> Headers:
        return make_headers(request_id, topology=self.topology.name, version=self.topology.version,
                            deadline_ms=deadline_ms, traceparent=new_traceparent(), extra=extra)

    async def queue(self, tensors: Mapping[str, np.ndarray], *, request_id: str | None = None,
                    timeout_ms: int | None = None, headers: Mapping[str, str] | None = None,
                    raw_value: bytes | None = None, partition: int | None = None) -> str:
        """Queue one request (sent by :meth:`flush`). Returns its request id. ``partition``: where it goes
        (for a many-model node, ``flowserve.models.ModelRouter.partition(model)``); default: in turn."""
        rid = request_id or new_request_id()
        deadline = now_ms() + (timeout_ms if timeout_ms is not None else self.topology.spec.deadline_ms)
        value = raw_value if raw_value is not None else encode_tensors(tensors)
        self._partition = (self._partition + 1) % self.partitions if partition is None else partition % self.partitions
        self._router.queue(self.topology.inputs_topic, self._partition, rid, value,
                           self._headers(rid, deadline, headers))
        return rid

    async def flush(self) -> None:
        """Send what is queued and wait for the broker's acknowledgement (:class:`BrokerError` if it fails)."""
        await self._router.flush()
        if time.monotonic() >= self._next_growth_check:
            await self._follow_growth()

    async def _follow_growth(self) -> None:
        """Spread requests over partitions the topology gained while this client ran (``flowserve tune``
        grows every topic together, the inputs topic last), after starting to read their replies. Checked
        at most every ``GROWTH_CHECK_S`` against the producer's metadata (at most 10 s old)."""
        self._next_growth_check = time.monotonic() + GROWTH_CHECK_S
        grown = self._router.partitions_of(self.topology.inputs_topic)
        if grown > self.partitions:
            await self._router.follow((self.topology.outputs_topic, p) for p in range(self.partitions, grown))
            self.partitions = grown

    async def send(self, tensors: Mapping[str, np.ndarray], **kwargs: object) -> str:
        rid = await self.queue(tensors, **kwargs)  # type: ignore[arg-type]
        await self.flush()
        return rid

    def expect(self, request_id: str, timeout_s: float | None = None) -> asyncio.Future[Reply]:
        """A future for the reply to ``request_id``: call before the request is sent. With ``timeout_s`` it
        fails with :class:`~flowserve.errors.DeadlineExceeded` when no reply came by then."""
        return self._router.expect(request_id, timeout_s)

    async def call(self, tensors: Mapping[str, np.ndarray], *, timeout_ms: int | None = None,
                   **kwargs: object) -> Reply:
        """Send one request and wait for its reply; :class:`TimeoutError` a second after its deadline."""
        rid = str(kwargs.pop("request_id", None) or new_request_id())
        timeout = timeout_ms if timeout_ms is not None else self.topology.spec.deadline_ms
        future = self._router.expect(rid, timeout / 1000 + 1.0)
        try:
            await self.send(tensors, request_id=rid, timeout_ms=timeout, **kwargs)
            return await future
        except DeadlineExceeded as exc:
            raise TimeoutError(str(exc)) from None
        finally:
            self._router.discard(rid)  # a no-op unless the send failed or the caller was cancelled
            if future.done() and not future.cancelled():
                future.exception()  # failed along with the send: the caller sees the send's error
            future.cancel()

    async def replies(self) -> Reply:
        """The next reply nobody is waiting for via :meth:`call` or :meth:`expect`."""
        return await self._router.unclaimed()


__all__ = ["H_DEADLINE", "Reply", "TopologyClient", "new_request_id"]
