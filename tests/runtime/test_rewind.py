"""Where a worker re-reads from after a failed produce, and how long it waits (flowserve.runtime.rewind)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError, NotLeaderForPartitionError, RecordTooLargeError

from flowserve.runtime.rewind import FIRST_DELAY_S, MAX_DELAY_S, Backoff, ResumePoints, abandon, transient

A, B = TopicPartition("in", 0), TopicPartition("in", 1)


def _records(*offsets: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(offset=o) for o in offsets]


def test_a_partition_resumes_at_its_first_record_then_at_what_was_acknowledged() -> None:
    points = ResumePoints()
    points.fetched({A: _records(5, 6, 7), B: []})
    points.fetched({A: _records(8)})  # later fetches do not move it: nothing acknowledged yet
    assert points.targets([A, B]) == {A: 5}
    points.acknowledged({A: 7})
    assert points.targets([A]) == {A: 7}
    points.forget([A])
    assert points.targets([A, B]) == {}


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    backoff = Backoff()
    delays = [backoff.next() for _ in range(10)]
    assert delays[0] == FIRST_DELAY_S and delays[1] == 2 * FIRST_DELAY_S and delays[-1] == MAX_DELAY_S
    backoff.reset()
    assert backoff.next() == FIRST_DELAY_S


def test_timeouts_and_retriable_errors_are_transient_others_not() -> None:
    assert transient(KafkaTimeoutError())
    assert transient(NotLeaderForPartitionError())
    assert not transient(RecordTooLargeError())
    assert not transient(ValueError())


async def test_abandoned_futures_do_not_report_unretrieved_exceptions() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    fut: asyncio.Future[None] = loop.create_future()
    abandon([fut])
    fut.set_exception(KafkaTimeoutError())
    del fut
    await asyncio.sleep(0)
    assert not reported
