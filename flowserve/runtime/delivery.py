"""The commit side of a stage worker: outputs acknowledged first, then their inputs' offsets committed.

A step's outputs are sent, and their acknowledgements awaited after the next fetch (two-stage pipeline: the
broker's round trip overlaps useful work); a batch's offsets become committable only once its outputs are
acknowledged, bounded by what joins and hooks still hold (:meth:`~flowserve.runtime.hooks.StageHooks.held_offsets`).
A produce the broker does not take rewinds each partition to its first unacknowledged record
(:mod:`flowserve.runtime.rewind`).

Under load a commit goes out at most every ``commit_interval_ms`` (one broker round trip each), not after
every batch; idle, rebalance and shutdown commit at once. A crash replays at most that much
(at-least-once; consumers deduplicate by request id).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError, KafkaTimeoutError

from flowserve.kafka.settings import WorkerSettings
from flowserve.runtime.emit import Counters, Emitter
from flowserve.runtime.hooks import StageHooks
from flowserve.runtime.join import TP, JoinBuffer
from flowserve.runtime.rewind import Backoff, ResumePoints, abandon, transient

log = logging.getLogger("flowserve.worker")


class Commits:
    """Acknowledged offsets not yet committed, and when the next commit is due."""

    def __init__(self, consumer: AIOKafkaConsumer, interval_ms: int, node_id: str, counters: Counters) -> None:
        self.consumer = consumer
        self.interval_s = interval_ms / 1000
        self.node_id = node_id
        self.counters = counters
        self.pending: dict[TopicPartition, int] = {}
        self._last = 0.0

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.interval_s

    def add(self, offsets: dict[TopicPartition, int]) -> None:
        """Offsets (next to read, per partition) whose records' outputs are acknowledged."""
        self.pending.update(offsets)

    async def commit(self) -> None:
        """Commit everything pending now."""
        offsets, self.pending = self.pending, {}
        self._last = time.monotonic()
        try:
            await self.consumer.commit(offsets)
            self.counters.commits += 1
        except (CommitFailedError, IllegalStateError) as exc:
            # The group rebalanced under us: the new owner re-reads these records (at-least-once).
            log.warning("node %s commit skipped after rebalance: %s", self.node_id, exc)


class Delivery(Emitter):
    """Mixin of :class:`~flowserve.runtime.worker.StageWorker`: acknowledgements, commits, rewinds."""

    settings: WorkerSettings
    consumer: Any  # aiokafka's or librdkafka's (flowserve.kafka.clients.make_data_plane)
    commits: Commits
    hooks: tuple[StageHooks, ...]
    join: JoinBuffer | None
    #: the hooks that bound commits (flowserve.runtime.hooks.StageHooks.holds_offsets)
    _holding: tuple[StageHooks, ...]
    _early: list[Any]
    #: the batch awaiting its acknowledgements: futures, offsets, and whether it may commit (see _settle)
    _inflight: tuple[list[Any], dict[TopicPartition, int], bool] | None
    #: next offset to read per partition, as far as this worker has read
    _seen: dict[TP, int]
    _resume: ResumePoints
    _backoff: Backoff

    async def _deliver(self, fetched: bool, handled: dict[TP, int]) -> None:
        """Send the step's outputs; settle the previous step's batch; queue this one's offsets."""
        clean = self._after_step(force=not fetched or self.commits.due())  # False: a hook holds records back
        sent, futures = await self.outbox.send() if self.outbox.count else (0, [])
        self.counters.records_out += sent
        if self._early:
            futures, self._early = [*self._early, *futures], []
        # Two-stage pipeline: this batch's acknowledgements are awaited after the next fetch, so the
        # broker's ack round trip overlaps useful work. Commits still follow their own batch's acks.
        previous, self._inflight = self._inflight, None
        if previous is not None:
            try:
                await self._settle(*previous)
            except BaseException:
                abandon(futures)
                raise
        if handled or futures:
            offsets = self._offsets(handled)
            if fetched:
                self._inflight = (futures, offsets, clean)
            else:
                await self._settle(futures, offsets, clean, force=True)
        elif not fetched and self.commits.pending:
            await self.commits.commit()  # idle: do not leave acknowledged work uncommitted

    async def drain(self) -> None:
        """Wait for the batch in flight to be acknowledged and commit everything acknowledged.

        Outputs the broker does not take in time are given up, their offsets not committed: whoever owns
        the partitions next (this worker after a rebalance, or another) reads those inputs again. A
        rebalance must not wait on a broker fault: until this returns, the worker cannot rejoin its group.
        """
        previous, self._inflight = self._inflight, None
        flushed: list[Any] = []
        self._after_step(force=True)
        try:
            if self.outbox.count:
                flushed = (await self.outbox.send())[1]
            if previous is not None:
                futures, offsets, _ = previous
                await self._settle([*futures, *flushed], offsets, force=True)
            elif flushed:
                await self._acknowledged(flushed)
        except KafkaError as exc:
            if not transient(exc):
                raise
            self.outbox.discard()
            log.warning("node %s: outputs not acknowledged by the broker (%r); their inputs are not committed and "
                        "will be read again", self.node.id, exc)
        if self.commits.pending:
            await self.commits.commit()

    async def _acknowledged(self, futures: list[Any]) -> None:
        """Wait for delivery futures, at most ``request_timeout_ms``: a produce stuck on a frozen leader
        (aiokafka retries an idempotent batch without end) must not hold the step, and with it the
        worker's group membership, longer than that. Raises ``KafkaTimeoutError`` past it."""
        try:
            await asyncio.wait_for(asyncio.gather(*futures), self.settings.request_timeout_ms / 1000)
        except BaseException as exc:
            abandon(futures)
            if isinstance(exc, TimeoutError):
                raise KafkaTimeoutError(f"{len(futures)} batch(es) not acknowledged within "
                                        f"{self.settings.request_timeout_ms} ms") from None
            raise

    async def _settle(self, futures: list[Any], offsets: dict[TopicPartition, int], clean: bool = True, *,
                      force: bool = False) -> None:
        """Wait for a batch's acknowledgements; its offsets become committable only then.

        Under load, commits wait for ``Commits.due``; ``force`` (idle, rebalance, shutdown) commits at once.
        Not ``clean``: a hook still holds records of this batch back (e.g. lineage being gathered), so
        nothing commits until a later batch carries them.
        """
        if futures:
            await self._acknowledged(futures)
        self.commits.add(offsets)
        self._resume.acknowledged(offsets)
        if self.commits.pending and (force or (clean and self.commits.due())):
            await self.commits.commit()

    def _after_step(self, *, force: bool) -> bool:
        """Every hook's end of step (each is called); True when none holds records of past batches back."""
        clean = True
        for hook in self.hooks:
            clean = hook.after_step(force=force) and clean
        return clean

    def _offsets(self, handled: dict[TP, int]) -> dict[TopicPartition, int]:
        oldest = dict(self.join.oldest_offsets()) if self.join is not None else {}
        if self._holding:
            for hook in self._holding:
                for tp, off in hook.held_offsets().items():
                    oldest[tp] = min(off, oldest.get(tp, off))
            # A partition held back earlier may be free now though this fetch had none of its records.
            assigned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
            handled = {**{tp: off for tp, off in self._seen.items() if tp in assigned}, **handled}
        return {TopicPartition(t, p): min(off, oldest.get((t, p), off)) for (t, p), off in handled.items()}

    async def _rewind(self, exc: KafkaError) -> None:
        """The broker did not take some outputs: drop what is unacknowledged and re-read each partition from
        its first record whose outputs were not acknowledged (see :mod:`flowserve.runtime.rewind`)."""
        if self._inflight is not None:
            abandon(self._inflight[0])
        abandon(self._early)
        self._inflight, self._early = None, []
        self.outbox.discard()
        assigned = self.consumer.assignment()
        targets = self._resume.targets(assigned)
        for tp, offset in targets.items():
            self.consumer.seek(tp, offset)
            self._seen[(tp.topic, tp.partition)] = offset
        self._forget_read(assigned)  # what joins and hooks (first-wins inputs) remember would drop re-read records
        self.counters.rewinds += 1
        delay = self._backoff.next()
        log.warning("node %s: outputs not acknowledged by the broker (%r); re-reading %s in %.1f s", self.node.id,
                    exc, ", ".join(f"{tp.topic}[{tp.partition}]@{off}" for tp, off in sorted(targets.items())) or
                    "nothing", delay)
        await asyncio.sleep(delay)

    def _forget_read(self, partitions: Any) -> None:
        """Forget what joins and hooks hold of these partitions' records: they will be read again (here after
        a rewind, by their new owner after a rebalance)."""
        if self.join is not None:
            self.join.drop_partitions({tp.partition for tp in partitions})
        for hook in self.hooks:
            hook.forget(partitions)
