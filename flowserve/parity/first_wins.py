"""First-wins inputs: a request's first record on a topic is used, a later one for the same request dropped.

A parity-protected node's output can reach its readers twice: rebuilt from its parity group, and later
computed by the slow worker (or by another worker after a rebalance). Its readers keep whichever came
first. Memory is bounded per partition (the most recent ``capacity`` request ids), which covers any
duplicate that arrives within that many records of the first. :func:`first_wins_hooks` attaches it to the
readers' workers (``Node.first_wins`` names their first-wins topics); dropped records count as
``duplicates``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Set
from typing import Any

from flowserve.component import Component
from flowserve.runtime.hooks import StageHooks
from flowserve.topology.graph import Node, Topology

#: request ids remembered per partition of a first-wins topic
CAPACITY = 65_536


class FirstWins:
    """Drops records of first-wins topics whose key (request id) was already read on that partition."""

    def __init__(self, topics: Set[str], capacity: int = CAPACITY) -> None:
        self.topics = frozenset(topics)
        self.capacity = capacity
        self._seen: dict[tuple[str, int], OrderedDict[bytes, None]] = {}

    def keep(self, records: list[Any]) -> list[Any]:
        """The records to use, in order; a record without a key is always kept (it cannot be a duplicate)."""
        if not any(r.topic in self.topics for r in records):
            return records
        kept = []
        for rec in records:
            if rec.topic in self.topics and rec.key is not None:
                seen = self._seen.setdefault((rec.topic, rec.partition), OrderedDict())
                if rec.key in seen:
                    continue
                seen[rec.key] = None
                if len(seen) > self.capacity:
                    seen.popitem(last=False)
            kept.append(rec)
        return kept

    def drop(self, partitions: Iterable[Any]) -> None:
        """Forget partitions that moved to another worker (``TopicPartition``-like: topic, partition)."""
        for tp in partitions:
            self._seen.pop((tp.topic, tp.partition), None)


class FirstWinsHooks(StageHooks):
    """The first-wins inputs of one worker: duplicates dropped before decoding, and counted."""

    def __init__(self, topics: Set[str], capacity: int = CAPACITY) -> None:
        self.first = FirstWins(topics, capacity)
        self.duplicates = 0

    def admit(self, records: list[Any]) -> list[Any]:
        kept = self.first.keep(records)
        self.duplicates += len(records) - len(kept)
        return kept

    def forget(self, partitions: Any) -> None:
        self.first.drop(partitions)

    def counters(self) -> Mapping[str, int]:
        return {"duplicates": self.duplicates}


def first_wins_hooks(topology: Topology, node: Node, component: Component) -> list[StageHooks]:
    """The :data:`~flowserve.runtime.hooks.HookFactory` of first-wins inputs: a :class:`FirstWinsHooks` for a
    node reading a parity-protected node's outputs, nothing elsewhere."""
    return [FirstWinsHooks(node.first_wins)] if node.first_wins else []
