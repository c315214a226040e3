"""The one request-reply engine over Kafka: produce requests, read replies, match them by request id.

A :class:`ReplyRouter` owns a producer (with an :class:`~flowserve.kafka.outbox.Outbox`) for requests and
a consumer assigned to the reply topic-partitions, positioned at their end before the first request goes
out. Its read loop hands each reply to the caller waiting for that request id. Delivery is at-least-once,
so replies are deduplicated by request id: a reply for a request already answered (``duplicates``), one
that arrives after its caller's deadline (``late``) and one for an id nobody waits for (``unknown``) are
counted and dropped; an owner that wants replies nobody waits for gets them from a bounded queue instead
(:meth:`ReplyRouter.unclaimed`). The set of recently finished ids is bounded.

The gateway (:class:`flowserve.gateway.bridge.KafkaBridge`) and the Kafka client
(:class:`flowserve.client.TopologyClient`) are thin users of it. Requests queued in the same event-loop
tick go out as one batch per partition; no coroutine runs per request or per reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, TopicPartition

from flowserve.errors import BrokerError, DeadlineExceeded, ErrorKind, Failure, FlowserveError, WireError
from flowserve.kafka.clients import METADATA_MAX_AGE_MS, OVERHEAD, make_producer
from flowserve.kafka.outbox import Outbox
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.kafka.shutdown import stop_client
from flowserve.wire.envelope import H_ID, H_NODE, Headers, failure_of, now_ms
from flowserve.wire.tensors import decode_tensors
from flowserve.wire.v2 import decode_response

log = logging.getLogger("flowserve.kafka.replies")

#: how often a user of the engine (the Kafka client, the gateway) looks whether a topology's inputs topic
#: gained partitions (:meth:`ReplyRouter.partitions_of`, :meth:`ReplyRouter.follow`)
GROWTH_CHECK_S = 1.0


@dataclass(slots=True)
class Reply:
    """A topology's answer to one request: its output tensors, or why it failed."""

    request_id: str
    tensors: dict[str, np.ndarray]
    #: why the request failed, for people (the ``fs-error`` reason); None when it succeeded
    error: str | None
    headers: dict[str, bytes]
    timestamp_ms: int  # when the reply record was written
    received_ms: int = field(default_factory=now_ms)
    #: what kind of failure, for programs (the ``fs-error-kind`` header); None when it succeeded
    error_kind: ErrorKind | None = None

    @property
    def failure(self) -> Failure | None:
        """The error as a :class:`~flowserve.errors.Failure`, or None."""
        if self.error is None:
            return None
        return Failure(self.error_kind or ErrorKind.UNKNOWN, self.error)

    @property
    def node(self) -> str | None:
        """The node that wrote an error result (``fs-node``), when known."""
        raw = self.headers.get(H_NODE)
        return raw.decode("utf-8", "replace") if raw else None


@dataclass
class ReplyCounters:
    """What a :class:`ReplyRouter` did so far (a gateway's stats endpoint shows these)."""

    #: requests handed to the producer
    sent: int = 0
    #: replies delivered to a waiting caller
    replies: int = 0
    #: error results (``fs-error``) among the delivered replies, waited for or unclaimed
    errors: int = 0
    #: callers whose deadline passed before their reply arrived
    timeouts: int = 0
    #: replies for requests already answered (at-least-once delivery)
    duplicates: int = 0
    #: replies for requests whose deadline had passed (or whose produce failed)
    late: int = 0
    #: replies with an id nobody waits for, dropped (no unclaimed queue, or an id this router forgot)
    unknown: int = 0
    #: produce batches sent
    flushes: int = 0
    #: requests whose produce failed
    produce_failures: int = 0
    #: replies whose value did not decode (delivered as an error result of kind ``unknown``)
    undecodable: int = 0
    #: replies nobody waited for, put on the unclaimed queue
    unclaimed: int = 0
    #: replies nobody waited for, dropped because the unclaimed queue was full
    dropped: int = 0

    def snapshot(self) -> dict[str, int]:
        return dict(self.__dict__)


_ANSWERED, _EXPIRED = True, False


class ReplyRouter:
    """Sends requests and routes their replies to the callers waiting for them, by request id.

    ``replies`` are the (topic, partition) pairs replies arrive on. ``unclaimed`` > 0 keeps up to that many
    replies nobody waits for, for :meth:`unclaimed`; ``remember`` bounds the set of recently finished ids
    used to tell duplicates and late replies from unknown ones. ``label`` names the owner in messages.

    Two ways to send: :meth:`submit` (queue, wait, and flush with whatever else this event-loop tick
    queued) or :meth:`queue` + :meth:`flush` (the caller decides when the batch goes).
    """

    def __init__(self, kafka: KafkaSettings, replies: Iterable[tuple[str, int]], *, max_message_bytes: int,
                 client_id: str | None = None, unclaimed: int = 0, remember: int = 100_000,
                 label: str = "the request-reply engine") -> None:
        self.kafka = kafka
        self.label = label
        self.counters = ReplyCounters()
        #: the number of the batch being filled: rises by one each time queued requests are taken to send
        self.batch = 0
        self._tps = [TopicPartition(topic, partition) for topic, partition in replies]
        self._max_message_bytes = max_message_bytes
        self._client = {"client_id": client_id} if client_id else {}
        self._producer = make_producer(kafka, WorkerSettings(), max_message_bytes=max_message_bytes,
                                       **self._client)
        self._outbox = Outbox(self._producer)
        self._queued: list[str] = []  # request ids in the outbox, in order
        self._waiters: dict[str, tuple[asyncio.Future[Reply], asyncio.TimerHandle | None]] = {}
        self._finished: OrderedDict[str, bool] = OrderedDict()  # request id -> answered (else expired)
        self._remember_max = remember
        self._unclaimed: asyncio.Queue[Reply] | None = asyncio.Queue(unclaimed) if unclaimed > 0 else None
        self._consumer: AIOKafkaConsumer | None = None
        #: consumers of reply partitions added while running (:meth:`follow`), with their read tasks
        self._followers: list[tuple[AIOKafkaConsumer, asyncio.Task[None]]] = []
        self._reader: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._acks: set[asyncio.Task[None]] = set()

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the producer, and the consumer at the current end of every reply partition."""
        try:
            await self._producer.start()
        except Exception as exc:
            with contextlib.suppress(Exception):
                await self._producer.stop()
            raise BrokerError(f"cannot reach Kafka at {self.kafka.bootstrap}: {exc!r}") from None
        try:
            self._consumer = await self._reply_consumer(self._tps, at_end=True)
        except BrokerError:
            with contextlib.suppress(Exception):
                await self._producer.stop()
            raise
        self._reader = asyncio.create_task(self._read(self._consumer), name=f"replies: {self.label}")
        self._flusher = asyncio.create_task(self._flush_loop(), name=f"requests: {self.label}")

    async def _reply_consumer(self, tps: list[TopicPartition], *, at_end: bool) -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False,
                                    fetch_max_wait_ms=self.kafka.fetch_max_wait_ms,
                                    max_partition_fetch_bytes=max(1 << 20, self._max_message_bytes + OVERHEAD),
                                    metadata_max_age_ms=METADATA_MAX_AGE_MS,
                                    **self._client, **self.kafka.client_kwargs())
        try:
            await consumer.start()
            consumer.assign(tps)
            await (consumer.seek_to_end(*tps) if at_end else consumer.seek_to_beginning(*tps))
            for tp in tps:  # resolve positions now so that no reply to a request sent next is skipped
                await consumer.position(tp)
        except Exception as exc:
            with contextlib.suppress(Exception):
                await consumer.stop()
            raise BrokerError(f"{self.label} cannot read its replies from {self.kafka.bootstrap}: {exc!r}") from None
        return consumer

    def partitions_of(self, topic: str) -> int:
        """How many partitions ``topic`` has as this router's producer last heard (0: not known yet)."""
        return len(self._producer.client.cluster.partitions_for_topic(topic) or ())

    async def follow(self, replies: Iterable[tuple[str, int]]) -> None:
        """Also read these reply partitions, from their start: they are new (a topic that gained partitions
        while this router ran), so every reply in them is newer than the call. Call before sending the
        requests whose replies come there. One more consumer per call; topics grow rarely."""
        tps = [tp for tp in (TopicPartition(t, p) for t, p in replies) if tp not in self._tps]
        if not tps:
            return
        consumer = await self._reply_consumer(tps, at_end=False)
        self._tps.extend(tps)
        self._followers.append((consumer, asyncio.create_task(self._read(consumer),
                                                              name=f"replies: {self.label} (grown)")))

    async def stop(self) -> None:
        """Stop reading and sending; callers still waiting get a :class:`BrokerError`."""
        followers, self._followers = self._followers, []
        tasks = [t for t in (self._flusher, self._reader, *self._acks, *(f[1] for f in followers)) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._flusher = self._reader = None
        waiters, self._waiters = self._waiters, {}
        for rid, (future, timer) in waiters.items():
            if timer is not None:
                timer.cancel()
            if not future.done():
                future.set_exception(BrokerError(f"{self.label} is shutting down; request '{rid}' got no reply"))
        if self._consumer is not None:
            await stop_client(self._consumer, f"{self.label}: reply consumer stop")
            self._consumer = None
        for consumer, _ in followers:
            await stop_client(consumer, f"{self.label}: reply consumer stop")
        await stop_client(self._producer, f"{self.label}: request producer stop")

    # -- requests --------------------------------------------------------------------------------------

    def in_flight(self) -> int:
        """How many callers wait for a reply."""
        return len(self._waiters)

    def has(self, request_id: str) -> bool:
        """Whether a caller waits for this request id."""
        return request_id in self._waiters

    def expect(self, request_id: str, timeout_s: float | None = None) -> asyncio.Future[Reply]:
        """A future for the reply to ``request_id``; it fails with :class:`DeadlineExceeded` at ``timeout_s``."""
        if request_id in self._waiters:
            raise WireError(f"request id '{request_id}' is already awaited; ids must be unique")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        timer = loop.call_later(timeout_s, self._expire, request_id) if timeout_s is not None else None
        self._waiters[request_id] = (future, timer)
        return future

    def discard(self, request_id: str) -> None:
        """Stop waiting for ``request_id`` (a reply that still comes counts as late)."""
        waiter = self._waiters.pop(request_id, None)
        if waiter is not None:
            if waiter[1] is not None:
                waiter[1].cancel()
            self._remember(request_id, _EXPIRED)

    async def send(self, topic: str, key: bytes, value: bytes, headers: Headers, timeout_s: float = 30.0) -> None:
        """Write one record that expects no reply (feedback, say) and wait until the broker acknowledged it.

        Raises :class:`BrokerError` when it was not acknowledged within ``timeout_s``.
        """
        try:
            await asyncio.wait_for(self._producer.send_and_wait(topic, value, key=key, headers=list(headers)),
                                   timeout_s)
        except Exception as exc:  # noqa: BLE001 - every produce failure reaches the caller as one kind
            raise BrokerError(f"{self.label}: the write to {topic} was not acknowledged: {exc!r}") from None

    def queue(self, topic: str, partition: int, request_id: str, value: bytes, headers: Headers) -> None:
        """Queue one request record (keyed by its id) for the next batch. Synchronous: no coroutine per record."""
        self._outbox.add(topic, partition, request_id.encode(), value, headers)
        self._queued.append(request_id)

    def submit(self, topic: str, partition: int, request_id: str, value: bytes, headers: Headers,
               timeout_s: float) -> asyncio.Future[Reply]:
        """Queue one request and wait for its reply; it goes out with everything else queued this tick."""
        if request_id in self._waiters:
            raise WireError(f"request id '{request_id}' is already awaited; ids must be unique")
        self.queue(topic, partition, request_id, value, headers)
        future = self.expect(request_id, timeout_s)
        self._wake.set()
        return future

    async def flush(self) -> int:
        """Send everything queued and wait until the broker acknowledged it. Returns the request count.

        Raises :class:`BrokerError` when the produce failed; the callers of those requests get it too.
        """
        ids, self._queued = self._queued, []
        self.batch += 1
        try:
            sent, futures = await self._outbox.send()  # takes the queued records before its first await
            self.counters.sent += sent
            if futures:
                self.counters.flushes += 1
                await asyncio.gather(*futures)
        except Exception as exc:
            self._fail(ids, exc)
            raise BrokerError(f"Kafka did not accept {len(ids)} request(s): {exc!r}") from exc
        return sent

    async def _flush_loop(self) -> None:
        """Send what the last tick queued via :meth:`submit` as one batch per partition."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._outbox.count:
                continue
            ids, self._queued = self._queued, []
            self.batch += 1
            try:
                sent, futures = await self._outbox.send()
            except Exception as exc:  # noqa: BLE001 - fail these requests, keep serving
                self._fail(ids, exc)
                continue
            self.counters.sent += sent
            self.counters.flushes += 1
            task = asyncio.create_task(self._watch(ids, futures))
            self._acks.add(task)
            task.add_done_callback(self._acks.discard)

    async def _watch(self, ids: list[str], futures: Sequence[asyncio.Future[Any]]) -> None:
        try:
            await asyncio.gather(*futures)
        except Exception as exc:  # noqa: BLE001
            self._fail(ids, exc)

    def _fail(self, ids: list[str], exc: BaseException) -> None:
        self.counters.produce_failures += len(ids)
        log.warning("%s: produce of %d request(s) failed: %r", self.label, len(ids), exc)
        for rid in ids:
            waiter = self._waiters.pop(rid, None)
            if waiter is None:
                continue
            future, timer = waiter
            if timer is not None:
                timer.cancel()
            self._remember(rid, _EXPIRED)
            if not future.done():
                future.set_exception(BrokerError(f"Kafka did not accept the request: {exc!r}"))

    def _expire(self, request_id: str) -> None:
        waiter = self._waiters.pop(request_id, None)
        if waiter is None:
            return
        self.counters.timeouts += 1
        self._remember(request_id, _EXPIRED)
        if not waiter[0].done():
            waiter[0].set_exception(DeadlineExceeded(f"request '{request_id}' got no reply within its deadline"))

    def _remember(self, request_id: str, how: bool) -> None:
        finished = self._finished
        finished[request_id] = how
        if len(finished) > self._remember_max:
            finished.popitem(last=False)

    # -- replies ---------------------------------------------------------------------------------------

    async def unclaimed(self) -> Reply:
        """The next reply nobody waited for (only with ``unclaimed`` > 0)."""
        if self._unclaimed is None:
            raise FlowserveError(f"{self.label} keeps no unclaimed replies (it was made with unclaimed=0)")
        return await self._unclaimed.get()

    async def _read(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            try:
                fetched = await consumer.getmany(timeout_ms=200, max_records=10_000)
            except Exception:  # noqa: BLE001 - keep reading: waiters time out on their own
                log.exception("%s: reading replies failed; retrying", self.label)
                await asyncio.sleep(1.0)
                continue
            for records in fetched.values():
                self.route(records)

    def route(self, records: Iterable[Any]) -> None:
        """Deliver consumed reply records (``key``, ``value``, ``headers``, ``timestamp``) to their callers."""
        waiters, finished, counters = self._waiters, self._finished, self.counters
        received = now_ms()
        for rec in records:
            key = rec.key
            if key:
                rid = key.decode("utf-8", "replace")
            else:
                raw = dict(rec.headers or ()).get(H_ID)
                rid = raw.decode("utf-8", "replace") if raw else ""
            waiter = waiters.pop(rid, None)
            if waiter is None:
                how = finished.get(rid)
                if how is _ANSWERED:
                    counters.duplicates += 1
                elif how is _EXPIRED:
                    counters.late += 1
                elif self._unclaimed is None:
                    counters.unknown += 1
                else:
                    self._remember(rid, _ANSWERED)
                    counters.unclaimed += 1
                    try:
                        self._unclaimed.put_nowait(self._decode(rid, rec, received))
                    except asyncio.QueueFull:
                        counters.dropped += 1
                continue
            future, timer = waiter
            if timer is not None:
                timer.cancel()
            self._remember(rid, _ANSWERED)
            counters.replies += 1
            if not future.done():
                future.set_result(self._decode(rid, rec, received))

    def _decode(self, rid: str, rec: Any, received: int) -> Reply:
        """A reply record as a :class:`Reply`: an error result, a tensor frame or a V2 JSON response."""
        headers = dict(rec.headers or ())
        failure = failure_of(headers)
        if failure is not None:
            self.counters.errors += 1
            return Reply(rid, {}, failure.reason, headers, rec.timestamp, received, failure.kind)
        value = rec.value or b""
        try:
            tensors = decode_response(value) if value[:1] == b"{" else decode_tensors(value)
        except WireError as exc:
            self.counters.undecodable += 1
            return Reply(rid, {}, f"the reply could not be decoded: {exc}", headers, rec.timestamp, received,
                         ErrorKind.UNKNOWN)
        return Reply(rid, tensors, None, headers, rec.timestamp, received)


__all__ = ["Reply", "ReplyCounters", "ReplyRouter"]
