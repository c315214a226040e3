"""Rewinding after a failed produce: the worker re-reads what the broker never acknowledged, and carries on.

A produce can fail for a while with nothing wrong in the worker: a partition's leader is frozen or being
replaced, and aiokafka gives up handing a batch over after ``request_timeout_ms`` (``KafkaTimeoutError``
from ``send_batch`` while an earlier batch of that partition is stuck), or the worker stops waiting for a
batch's acknowledgements after as long (aiokafka would retry an idempotent batch without end, and the
worker's step, and so its group membership, would wait with it). On librdkafka
(:mod:`flowserve.kafka.librdkafka`) a record not delivered within ``message.timeout.ms`` (set to the same
``request_timeout_ms``) is reported failed and arrives here as ``KafkaTimeoutError`` too. Raising would end
the worker (and, under ``InlineHost``, its node). Instead the worker drops whatever is not yet acknowledged,
seeks each partition back to the first record whose outputs the broker has not acknowledged, waits a little
longer each time it fails again, and reads on from there. Outputs that were in fact written meanwhile are
written again: at-least-once, and readers deduplicate by request id.

A worker with a hook that holds offsets back (``StageHooks.holds_offsets``: a component's state, see
:mod:`flowserve.learning.held`) is not rewound: re-reading would feed that state the same requests twice.
It raises as before, and its supervisor restarts it, which rebuilds the state from the offsets held back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError, KafkaTimeoutError

#: first wait after a failed produce; it doubles with each failure in a row, up to ``MAX_DELAY_S``
FIRST_DELAY_S = 0.1
MAX_DELAY_S = 5.0


def transient(exc: BaseException) -> bool:
    """A broker failure that time may heal: a timeout, or an error Kafka marks retriable (a leader moving,
    a broker restarting, too few in-sync replicas for a while)."""
    return isinstance(exc, KafkaTimeoutError) or (isinstance(exc, KafkaError) and exc.retriable)


class ResumePoints:
    """Per partition, the first input offset whose outputs the broker has not acknowledged yet."""

    __slots__ = ("_at",)

    def __init__(self) -> None:
        self._at: dict[TopicPartition, int] = {}

    def fetched(self, fetched: Mapping[TopicPartition, list[Any]]) -> None:
        """A partition read for the first time since it was assigned resumes at its first record."""
        for tp, records in fetched.items():
            if records and tp not in self._at:
                self._at[tp] = records[0].offset

    def acknowledged(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Every output of the records before these offsets is acknowledged (the offsets a commit may use)."""
        self._at.update(offsets)

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Partitions that moved to another consumer."""
        for tp in partitions:
            self._at.pop(tp, None)

    def targets(self, assigned: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Where to seek each assigned partition that has been read since its assignment."""
        return {tp: self._at[tp] for tp in assigned if tp in self._at}


class Backoff:
    """The wait before re-reading: doubles with each failure in a row, back to the first after a success."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = FIRST_DELAY_S

    def next(self) -> float:
        delay, self._next = self._next, min(MAX_DELAY_S, self._next * 2)
        return delay

    def reset(self) -> None:
        self._next = FIRST_DELAY_S


def abandon(futures: Iterable[asyncio.Future[Any]]) -> None:
    """Stop waiting for delivery futures: what they end with is read (so asyncio does not report an
    exception nobody retrieved) and ignored, the rewind having made them moot."""
    for fut in futures:
        fut.add_done_callback(_read)


def _read(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
