"""Request-reply over Kafka: produce to a topology's inputs, wait on the gateway's own reply topic.

Each gateway instance has one reply topic per topology (``<prefix>.<topology>.replies.<instance>``) and
puts it in every request's ``fs-reply-to`` header; the worker that writes the topology's outputs sends
the reply there, on the partition the request came in on. Replies are matched to waiting callers by
request id; a reply nobody waits for (already answered, or its caller's deadline passed) is counted
and dropped. Requests arriving in the same event-loop tick go out as one produce batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, TopicPartition

from flowserve.errors import BrokerError, DeadlineExceeded, ErrorKind, Failure, WireError
from flowserve.kafka.admin import delete_topics, ensure_topics
from flowserve.kafka.clients import make_producer
from flowserve.kafka.outbox import Outbox
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.topology.graph import Topology
from flowserve.wire.envelope import H_NODE, Headers, failure_of
from flowserve.wire.tensors import decode_tensors

log = logging.getLogger("flowserve.gateway")


@dataclass(slots=True)
class Outcome:
    """What came back for a request: its output tensors, or the error result's failure and node."""

    tensors: dict[str, np.ndarray]
    error: Failure | None = None
    node: str | None = None


@dataclass
class BridgeCounters:
    sent: int = 0
    replies: int = 0
    errors: int = 0
    timeouts: int = 0
    #: replies for requests already answered (at-least-once delivery)
    duplicates: int = 0
    #: replies for requests whose deadline had passed
    late: int = 0
    #: replies with an id this gateway never sent (or forgot)
    unknown: int = 0
    flushes: int = 0
    produce_failures: int = 0
    undecodable: int = 0

    def snapshot(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[Outcome]
    timer: asyncio.TimerHandle


@dataclass
class KafkaBridge:
    """One producer and one reply consumer for every topology a gateway serves."""

    topologies: Sequence[Topology]
    kafka: KafkaSettings
    instance: str
    counters: BridgeCounters = field(default_factory=BridgeCounters)

    def __post_init__(self) -> None:
        largest = max(t.spec.max_message_bytes for t in self.topologies)
        self._producer = make_producer(self.kafka, WorkerSettings(), max_message_bytes=largest,
                                       client_id=f"fs-gateway-{self.instance}")
        self._outbox = Outbox(self._producer)
        self._pending: list[str] = []  # request ids in the outbox, in order
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._waiters: dict[str, _Waiter] = {}
        #: recently finished request ids -> "answered" | "expired", to tell duplicates from late replies.
        self._finished: OrderedDict[str, str] = OrderedDict()
        self._partition: dict[str, int] = {t.name: 0 for t in self.topologies}
        self._acks: set[asyncio.Task[None]] = set()

    def reply_topic(self, topology: Topology) -> str:
        return topology.reply_topic(self.instance)

    async def start(self) -> None:
        for t in self.topologies:
            # The reply topic has the topology's partition count: a reply lands on the request's partition.
            await ensure_topics(self.kafka, [*t.topics(), self.reply_topic(t)], t.spec.partitions,
                                max_message_bytes=t.spec.max_message_bytes)
        try:
            await self._producer.start()
        except Exception as exc:
            raise BrokerError(f"cannot reach Kafka at {self.kafka.bootstrap}: {exc!r}") from None
        self._consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False,
                                          fetch_max_wait_ms=self.kafka.fetch_max_wait_ms,
                                          client_id=f"fs-gateway-{self.instance}", **self.kafka.client_kwargs())
        await self._consumer.start()
        tps = [TopicPartition(self.reply_topic(t), p) for t in self.topologies for p in range(t.spec.partitions)]
        self._consumer.assign(tps)
        await self._consumer.seek_to_end(*tps)
        for tp in tps:  # resolve positions now so that no reply to a request sent next is skipped
            await self._consumer.position(tp)
        self._reader = asyncio.create_task(self._read(), name=f"gateway-replies-{self.instance}")
        self._flusher = asyncio.create_task(self._flush_loop(), name=f"gateway-flush-{self.instance}")

    async def stop(self, *, delete_topics: bool = True) -> None:
        for task in (self._flusher, self._reader, *self._acks):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for rid, waiter in list(self._waiters.items()):
            waiter.timer.cancel()
            if not waiter.future.done():
                waiter.future.set_exception(BrokerError("the gateway is shutting down"))
            self._waiters.pop(rid, None)
        if self._consumer is not None:
            await self._consumer.stop()
        await self._producer.stop()
        if delete_topics:
            await self._delete_reply_topics()

    async def _delete_reply_topics(self) -> None:
        try:
            await delete_topics(self.kafka, [self.reply_topic(t) for t in self.topologies], timeout_s=5)
        except BrokerError as exc:  # best effort: a leftover reply topic only costs disk
            log.warning("gateway %s: %s", self.instance, exc)

    # -- requests ----------------------------------------------------------------------------------

    def in_flight(self) -> int:
        return len(self._waiters)

    def has(self, request_id: str) -> bool:
        return request_id in self._waiters

    def submit(self, topology: Topology, request_id: str, value: bytes, headers: Headers,
               timeout_s: float) -> asyncio.Future[Outcome]:
        """Queue one request; the future resolves with its reply, or fails at ``timeout_s``."""
        self._outbox.add(topology.inputs_topic, self._partition[topology.name], request_id.encode(), value,
                         headers)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Outcome] = loop.create_future()
        timer = loop.call_later(timeout_s, self._expire, request_id)
        self._waiters[request_id] = _Waiter(fut, timer)
        self._pending.append(request_id)
        self._wake.set()
        return fut

    def _expire(self, request_id: str) -> None:
        waiter = self._waiters.pop(request_id, None)
        if waiter is None:
            return
        self.counters.timeouts += 1
        self._remember(request_id, "expired")
        if not waiter.future.done():
            waiter.future.set_exception(DeadlineExceeded(f"request '{request_id}' got no reply within its deadline"))

    def _remember(self, request_id: str, how: str) -> None:
        self._finished[request_id] = how
        if len(self._finished) > 100_000:
            self._finished.popitem(last=False)

    async def _flush_loop(self) -> None:
        """Send what the last tick queued as one batch per partition, then rotate the partition."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._outbox.count:
                continue
            # A fresh outbox takes the requests that arrive while this one is being sent.
            ids, self._pending = self._pending, []
            outbox, self._outbox = self._outbox, Outbox(self._producer)
            for name in self._partition:
                t = next(t for t in self.topologies if t.name == name)
                self._partition[name] = (self._partition[name] + 1) % t.spec.partitions
            try:
                sent, futures = await outbox.send()
            except Exception as exc:  # noqa: BLE001 - fail these requests, keep serving
                self._fail(ids, exc)
                continue
            self.counters.sent += sent
            self.counters.flushes += 1
            task = asyncio.create_task(self._watch(ids, futures))
            self._acks.add(task)
            task.add_done_callback(self._acks.discard)

    async def _watch(self, ids: list[str], futures: list[Any]) -> None:
        try:
            await asyncio.gather(*futures)
        except Exception as exc:  # noqa: BLE001
            self._fail(ids, exc)

    def _fail(self, ids: list[str], exc: BaseException) -> None:
        self.counters.produce_failures += len(ids)
        log.warning("produce of %d request(s) failed: %r", len(ids), exc)
        for rid in ids:
            waiter = self._waiters.pop(rid, None)
            if waiter is not None:
                waiter.timer.cancel()
                if not waiter.future.done():
                    waiter.future.set_exception(BrokerError(f"Kafka did not accept the request: {exc!r}"))

    # -- replies -----------------------------------------------------------------------------------

    async def _read(self) -> None:
        assert self._consumer is not None
        while True:
            fetched = await self._consumer.getmany(timeout_ms=200, max_records=10_000)
            for records in fetched.values():
                for rec in records:
                    self._deliver(rec)

    def _deliver(self, rec: Any) -> None:
        rid = rec.key.decode("utf-8", "replace") if rec.key else ""
        waiter = self._waiters.pop(rid, None)
        if waiter is None:
            how = self._finished.get(rid)
            if how == "answered":
                self.counters.duplicates += 1
            elif how == "expired":
                self.counters.late += 1
            else:
                self.counters.unknown += 1
            return
        waiter.timer.cancel()
        self._remember(rid, "answered")
        self.counters.replies += 1
        headers = dict(rec.headers or ())
        failure = failure_of(headers)
        if failure is not None:
            self.counters.errors += 1
            node = headers.get(H_NODE)
            outcome = Outcome({}, failure, node.decode("utf-8", "replace") if node else None)
        else:
            try:
                outcome = Outcome(decode_tensors(rec.value or b""))
            except WireError as exc:
                self.counters.undecodable += 1
                outcome = Outcome({}, Failure(ErrorKind.UNKNOWN, f"the reply could not be decoded: {exc}"), None)
        if not waiter.future.done():
            waiter.future.set_result(outcome)
