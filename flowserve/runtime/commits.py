"""Offsets a worker may commit: those of batches whose outputs the broker has acknowledged.

Under load a commit goes out at most every ``commit_interval_ms`` (one broker round trip each), not after
every batch; idle, rebalance and shutdown commit at once. A crash replays at most that much
(at-least-once; consumers deduplicate by request id).
"""

from __future__ import annotations

import logging
import time

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError

from flowserve.runtime.emit import Counters

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
