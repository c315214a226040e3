"""Input offsets a stateful component still needs, so that the worker does not commit past them.

A component with ``keeps_state`` (a drift detector's open window) names the oldest request its state
still needs (:meth:`~flowserve.component.Component.oldest_held`). This keeps the input position of every
request processed since, in processing order, and bounds each partition's commit by the oldest of them.
A worker that dies re-reads exactly those requests and the component rebuilds its state from them: the
input topic is the state's changelog, as it is for joins.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from flowserve.component import Component

TP = tuple[str, int]


class HeldOffsets:
    """Positions of the requests processed since the oldest one a component's state still needs."""

    def __init__(self, component: Component) -> None:
        self.component = component
        # request id -> (topic, partition, offset), oldest first; bounded by the component's state
        self._positions: OrderedDict[str, tuple[str, int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._positions)

    def processed(self, sources: Iterable[tuple[str, str]]) -> None:
        """``(request_id, "topic:partition:offset")`` of requests just processed, in order."""
        for rid, source in sources:
            topic, partition, offset = source.rsplit(":", 2)
            self._positions[rid] = (topic, int(partition), int(offset))
            self._positions.move_to_end(rid)

    def oldest(self) -> dict[TP, int]:
        """Per partition, the offset of the oldest request still needed (commit no further than it)."""
        keep = self.component.oldest_held()
        if keep is None or keep not in self._positions:
            # None: nothing is needed. Unknown: the state holds a request this worker did not read (it
            # cannot be replayed from here), so nothing is held back for it.
            self._positions.clear()
            return {}
        while next(iter(self._positions)) != keep:
            self._positions.popitem(last=False)
        bound: dict[TP, int] = {}
        for topic, partition, offset in self._positions.values():
            tp = (topic, partition)
            if offset < bound.get(tp, offset + 1):
                bound[tp] = offset
        return bound
