"""The worker's data plane on librdkafka (confluent-kafka): a consumer, a producer and an outbox for asyncio.

They offer what the stage worker uses of aiokafka's clients (``getmany``, ``commit``, ``seek``, ``pause``, a
rebalance listener, ``send_and_wait``, :class:`~flowserve.kafka.outbox.Outbox`'s methods), raise aiokafka's
error classes (so :mod:`flowserve.runtime.rewind` and :mod:`flowserve.runtime.delivery` read one kind of
error whichever client runs), and hand records over as :class:`Record` tuples with aiokafka's attribute
names. librdkafka speaks the protocol in C threads; what stays in Python is a call per record produced, per
delivery report, and a tuple per record read (``WorkerSettings.client`` says what that costs).

Every blocking consumer call (``consume``, ``commit``, ``close``) runs on the consumer's one thread
(:class:`~flowserve.kafka.owner_thread.OwnerThread`), so no two overlap. librdkafka calls the rebalance
callbacks there, inside ``consume``; they run the worker's async listener on the event loop and wait for it,
making the calls it asks for meanwhile (a drain's commit) on the same thread, as aiokafka waits for its
listener. A thread of the producer's serves its delivery reports; each batch :meth:`RdOutbox.send` hands
over resolves one future on the event loop once every record of it is reported delivered (or at the first
failure).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, NamedTuple

import confluent_kafka as ck
from aiokafka import TopicPartition
from aiokafka import errors as ae

from flowserve.kafka.owner_thread import OwnerThread

log = logging.getLogger("flowserve.librdkafka")

#: librdkafka's own timeouts: a message not delivered within message.timeout.ms, a request not answered
_TIMEOUTS = frozenset({ck.KafkaError._MSG_TIMED_OUT, ck.KafkaError._TIMED_OUT, ck.KafkaError.REQUEST_TIMED_OUT})
#: a commit refused because the group moved on: the partitions' new owner reads the records again
_REBALANCED = frozenset({ck.KafkaError.ILLEGAL_GENERATION, ck.KafkaError.UNKNOWN_MEMBER_ID,
                         ck.KafkaError.REBALANCE_IN_PROGRESS, ck.KafkaError.FENCED_INSTANCE_ID,
                         ck.KafkaError._STATE, ck.KafkaError._ASSIGNMENT_LOST})
#: how long a rebalance callback waits for the worker's listener (a drain is bounded by request timeouts)
LISTENER_TIMEOUT_S = 60.0
#: how long start() waits for the cluster's metadata before calling the brokers unreachable
CONNECT_TIMEOUT_S = 10.0
#: how long the producer's report thread waits in one ``flush`` or for work: a report or a batch handed over
#: ends the wait at once, so this only bounds how long stopping takes
POLL_WAIT_S = 0.2


class Record(NamedTuple):
    """A consumed record, with aiokafka's ``ConsumerRecord`` attribute names."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None
    timestamp: int


def error_of(err: ck.KafkaError) -> ae.KafkaError:
    """librdkafka's error as aiokafka's class for the same Kafka error code (retriable where Kafka says so);
    librdkafka's own timeouts as ``KafkaTimeoutError``, which the worker answers with a rewind."""
    code = err.code()
    if code in _TIMEOUTS:
        return ae.KafkaTimeoutError(err.str())
    if code > 0:
        return ae.for_code(code)(err.str())
    exc = ae.KafkaError(err.str())
    exc.retriable = bool(err.retriable())
    return exc


class RdConsumer:
    """A group consumer on librdkafka with the part of ``AIOKafkaConsumer``'s interface the worker uses."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config
        self._c: ck.Consumer | None = None
        self._owner = OwnerThread(f"rdkafka-consumer-{config.get('client.id', '')}")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: Any = None
        self._assigned: set[TopicPartition] = set()
        self._paused: set[TopicPartition] = set()
        self._fetching: asyncio.Future[Any] | None = None

    @property
    def _consumer(self) -> ck.Consumer:
        if self._c is None:
            raise ae.IllegalStateError("consumer not started")
        return self._c

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._c = ck.Consumer({**self._config, "logger": log})
        self._owner.start()
        try:
            await self._owner.call(self._c.list_topics, timeout=CONNECT_TIMEOUT_S)
        except ck.KafkaException as exc:
            await self.stop()
            raise ae.KafkaConnectionError(f"no metadata within {CONNECT_TIMEOUT_S:.0f} s: {exc}") from None

    def subscribe(self, topics: Sequence[str], listener: Any = None) -> None:
        self._listener = listener
        self._consumer.subscribe(list(topics), on_assign=self._on_assign, on_revoke=self._on_revoke)

    # -- rebalance callbacks (the owner thread, inside consume) -------------------------------------

    def _on_assign(self, consumer: ck.Consumer, partitions: list[ck.TopicPartition]) -> None:
        consumer.assign(partitions)  # before the listener, which may pause them
        self._assigned = {TopicPartition(p.topic, p.partition) for p in partitions}
        if self._listener is not None:
            self._wait_for(self._listener.on_partitions_assigned(set(self._assigned)))

    def _on_revoke(self, consumer: ck.Consumer, partitions: list[ck.TopicPartition]) -> None:
        revoked = {TopicPartition(p.topic, p.partition) for p in partitions}
        if self._listener is not None:
            self._wait_for(self._listener.on_partitions_revoked(revoked))
        self._assigned -= revoked
        self._paused -= revoked
        consumer.unassign()

    def _wait_for(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` on the event loop and wait for it here, making the consumer calls it asks for."""
        assert self._loop is not None
        try:
            future = asyncio.run_coroutine_threadsafe(work, self._loop)
        except RuntimeError:  # the loop is closed: nobody is left to drain
            work.close()
            return
        timer = threading.Timer(LISTENER_TIMEOUT_S, future.cancel)
        timer.start()
        try:
            self._owner.serve(future)
        finally:
            timer.cancel()
        if not future.cancelled() and (exc := future.exception()) is not None:
            log.warning("rebalance listener failed: %r", exc)

    # -- fetching ----------------------------------------------------------------------------------

    def _consume(self, max_records: int, timeout_s: float) -> dict[TopicPartition, list[Record]]:
        consumer = self._consumer
        # consume(n, timeout) waits until n records are here or the timeout ends, so wait for the first
        # with poll and take whatever else is queued without waiting.
        # typed Any: librdkafka's Message says every field may be None, which holds only for error events
        messages: list[Any] = consumer.consume(max_records, 0)
        if not messages and timeout_s > 0:
            first = consumer.poll(timeout_s)
            if first is None:
                return {}
            messages = [first, *consumer.consume(max_records - 1, 0)] if max_records > 1 else [first]
        if not messages:
            return {}
        out: dict[tuple[str, int], list[Record]] = {}
        for m in messages:
            err = m.error()
            if err is not None:
                if err.fatal():
                    raise error_of(err)
                log.warning("consumer %s: %s", self._config.get("client.id"), err.str())
                continue
            topic, partition = m.topic(), m.partition()
            records = out.get((topic, partition))
            if records is None:
                records = out[(topic, partition)] = []
            records.append(Record(topic, partition, m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1]))
        return {TopicPartition(t, p): records for (t, p), records in out.items()}

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[Record]]:
        """Records per partition, at most ``max_records``, waiting up to ``timeout_ms`` for the first."""
        if self._c is None:
            raise ae.IllegalStateError("consumer not started")
        if self._fetching is None:
            self._fetching = self._owner.call(self._consume, max_records or 10_000, timeout_ms / 1000)
        # Shielded: what a cancelled caller fetched goes to the next call (the position is past it already)
        try:
            fetched: dict[TopicPartition, list[Record]] = await asyncio.shield(self._fetching)
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._fetching = None
            raise
        self._fetching = None
        return fetched

    # -- positions ---------------------------------------------------------------------------------

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def highwater(self, tp: TopicPartition) -> int | None:
        """The partition's end offset as of its last fetch (None before one)."""
        try:
            _low, high = self._consumer.get_watermark_offsets(ck.TopicPartition(tp.topic, tp.partition), cached=True)
        except ck.KafkaException:
            return None
        return high if high >= 0 else None

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` next; what was prefetched past it is dropped by librdkafka."""
        try:
            self._consumer.seek(ck.TopicPartition(tp.topic, tp.partition, offset))
        except ck.KafkaException as exc:
            # Not fetching yet (assigned a moment ago). Range assignment is eager, so the assignment changes
            # only as a whole: this partition at the offset, the others at their committed offsets (at most
            # re-reading acknowledged records: at-least-once), the paused ones paused again.
            log.info("seek %s[%d]@%d refused (%s): assigning again", tp.topic, tp.partition, offset, exc)
            self._consumer.assign([ck.TopicPartition(t.topic, t.partition, offset if t == tp else ck.OFFSET_STORED)
                                   for t in self._assigned])
            if self._paused:
                self._consumer.pause([ck.TopicPartition(t.topic, t.partition) for t in self._paused])

    def pause(self, *partitions: TopicPartition) -> None:
        self._paused.update(partitions)
        self._consumer.pause([ck.TopicPartition(tp.topic, tp.partition) for tp in partitions])

    def resume(self, *partitions: TopicPartition) -> None:
        self._paused.difference_update(partitions)
        self._consumer.resume([ck.TopicPartition(tp.topic, tp.partition) for tp in partitions])

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit these offsets (the next record to read, per partition) and wait for the coordinator.

        Raises ``CommitFailedError`` when the group rebalanced under us (the new owner re-reads)."""
        wanted = [ck.TopicPartition(tp.topic, tp.partition, off) for tp, off in offsets.items()]
        try:
            result = await self._owner.call(self._consumer.commit, offsets=wanted, asynchronous=False)
        except ck.KafkaException as exc:
            raise _commit_error(exc.args[0]) from None
        failed = [p.error for p in result or () if p.error is not None]
        if failed:
            raise _commit_error(failed[0])

    async def stop(self) -> None:
        """Leave the group and close. The worker drained before this; a revoke during close calls nobody."""
        self._listener = None
        if self._fetching is not None:
            await asyncio.gather(self._fetching, return_exceptions=True)
            self._fetching = None
        if self._c is not None and self._owner.is_alive():
            try:
                await self._owner.call(self._c.close)
            finally:
                self._c = None
        if self._owner.is_alive():
            self._owner.finish()
            await asyncio.to_thread(self._owner.join)


def _commit_error(err: ck.KafkaError) -> ae.KafkaError:
    if err.code() in _REBALANCED:
        return ae.CommitFailedError(err.str())
    return error_of(err)


class _Ack:
    """One future for many records, resolved once each is reported (failed at the first failure). ``report``
    runs once per record, on the loop or on ``flush``'s thread: a count and a list, each step atomic."""

    __slots__ = ("_errors", "future", "report")

    def __init__(self, loop: asyncio.AbstractEventLoop, total: int) -> None:
        self.future: asyncio.Future[None] = loop.create_future()
        errors: list[ck.KafkaError | Exception] = []
        self._errors = errors
        counted = itertools.count(1).__next__
        resolve = self._resolve

        def report(err: ck.KafkaError | Exception | None, _msg: Any) -> None:
            if err is not None:
                errors.append(err)
            if counted() == total:
                loop.call_soon_threadsafe(resolve)

        self.report = report

    def _resolve(self) -> None:
        if not self.future.done():
            if self._errors:
                err = self._errors[0]
                self.future.set_exception(error_of(err) if isinstance(err, ck.KafkaError) else err)
            else:
                self.future.set_result(None)


class RdProducer:
    """A librdkafka producer whose delivery reports a thread of its own serves (the GIL released while it
    waits); :class:`_Ack` resolves a batch's future on the loop. (The loop's ``poll(0)`` every 0.5 ms while
    records were outstanding was a fifth of a worker's CPU at c8.)

    The thread sends too: each batch handed over wakes it into ``flush``, which sends what is queued at once,
    whatever ``linger.ms`` says, and serves reports until every record is acknowledged. So a batch leaves as
    one request per partition, where at ``linger.ms`` 0 librdkafka sent one as soon as the first record was
    queued and the rest trickled after it: a bare confluent-kafka relay's CPU per record per hop fell from
    107 to 61 µs at c128 and from 86 to 81 at c32 (3 relays, 300-byte records keyed over 4 partitions, a
    ``/tmp`` script, 2026-12-04). A batch waits only for the thread's wake-up."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config
        self._p: ck.Producer | None = None
        self._reports: threading.Thread | None = None
        self._stopping = threading.Event()
        self._work = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def producer(self) -> ck.Producer:
        if self._p is None:
            raise ae.IllegalStateError("producer not started")
        return self._p

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._p = ck.Producer({**self._config, "logger": log})
        try:
            await asyncio.to_thread(self._p.list_topics, timeout=CONNECT_TIMEOUT_S)
        except ck.KafkaException as exc:
            self._p = None
            raise ae.KafkaConnectionError(f"no metadata within {CONNECT_TIMEOUT_S:.0f} s: {exc}") from None
        self._stopping.clear()
        self._reports = threading.Thread(target=self._serve, args=(self._p,), name="flowserve-delivery-reports",
                                         daemon=True)
        self._reports.start()

    def _serve(self, producer: ck.Producer) -> None:
        """Send what is handed over and run its delivery reports, until :meth:`stop`."""
        while not self._stopping.is_set():
            if len(producer) or self._work.wait(POLL_WAIT_S):
                self._work.clear()  # before flush: a batch handed over during it wakes another round
                producer.flush(POLL_WAIT_S)
            else:
                producer.poll(0)  # errors and logs librdkafka queued while nothing was outstanding

    async def hand_over(self, records: Sequence[tuple[str, int, bytes | None, bytes, Any]]) -> asyncio.Future[None]:
        """Queue ``records`` (topic, partition, key, value, headers) with librdkafka; the future resolves when
        every one is acknowledged, or fails with the first failure. A record librdkafka refuses outright
        (too large, an unknown topic) fails it too."""
        assert self.loop is not None
        # Yield once, as aiokafka's send_batch does: a worker working off a long queue hands each batch's
        # results over here, and the other coroutines of its loop (another node's worker under InlineHost,
        # the metrics publisher) get their turn between batches.
        await asyncio.sleep(0)
        producer = self.producer
        ack = _Ack(self.loop, len(records))
        report = ack.report
        refreshed: set[str] = set()
        for topic, partition, key, value, headers in records:
            while True:
                try:
                    producer.produce(topic, value, key, partition, on_delivery=report, headers=headers)
                    break
                except BufferError:  # librdkafka's queue is full: wait for reports to drain it
                    producer.poll(0)
                    await asyncio.sleep(0.001)
                except ck.KafkaException as exc:
                    if exc.args[0].code() == ck.KafkaError._UNKNOWN_PARTITION and topic not in refreshed:
                        # The topic gained partitions (flowserve tune) since this producer's metadata was
                        # fetched: look again once, rather than fail the record.
                        refreshed.add(topic)
                        await asyncio.to_thread(producer.list_topics, topic, CONNECT_TIMEOUT_S)
                        continue
                    report(exc.args[0], None)
                    break
                except (TypeError, ValueError) as exc:  # a record of the wrong shape fails its batch, not the loop
                    report(exc, None)
                    break
        self._work.set()
        return ack.future

    async def send_and_wait(self, topic: str, value: bytes, key: bytes | None = None,
                            partition: int | None = None, headers: Sequence[tuple[str, bytes]] | None = None) -> None:
        await (await self.hand_over([(topic, -1 if partition is None else partition, key, value, headers)]))

    async def stop(self) -> None:
        """Hand over what is queued (bounded by message.timeout.ms), then stop serving reports."""
        if self._p is None:
            return
        self._stopping.set()
        self._work.set()
        if self._reports is not None:
            await asyncio.to_thread(self._reports.join)
            self._reports = None
        # flush runs the last reports on its thread: their futures resolve through call_soon_threadsafe
        await asyncio.to_thread(self._p.flush, self._config.get("message.timeout.ms", 10_000) / 1000)
        self._p = None


class RdOutbox:
    """:class:`~flowserve.kafka.outbox.Outbox` on librdkafka: records collect here, :meth:`send` hands them
    all over at once and returns one delivery future for them."""

    __slots__ = ("_producer", "_records", "count")

    def __init__(self, producer: RdProducer) -> None:
        self._producer = producer
        self._records: list[tuple[str, int, bytes | None, bytes, Sequence[tuple[str, bytes]]]] = []
        self.count = 0

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes,
            headers: Sequence[tuple[str, bytes]]) -> None:
        """Queue a record. Synchronous on purpose: no coroutine per record on the hot path."""
        if type(headers) is not list:  # librdkafka takes a list or a dict, aiokafka any sequence
            headers = list(headers or ())
        self._records.append((topic, partition, key, value, headers))
        self.count += 1

    async def send(self) -> tuple[int, list[asyncio.Future[None]]]:
        """Hand every queued record to librdkafka; returns the record count and the batch's delivery future."""
        records, self._records = self._records, []
        sent, self.count = self.count, 0
        if not sent:
            return 0, []
        return sent, [await self._producer.hand_over(records)]

    def discard(self) -> None:
        """Drop every queued record (the worker re-reads their inputs after a failed produce)."""
        self._records, self.count = [], 0

    async def flush(self) -> int:
        """Send what is queued and wait for every acknowledgement. Raises if any send failed."""
        sent, futures = await self.send()
        if futures:
            await asyncio.gather(*futures)
        return sent
