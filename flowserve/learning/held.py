"""Input offsets a stateful component still needs, so that the worker does not commit past them.

A component with ``keeps_state`` (a drift detector's open window) names the oldest request its state
still needs (:class:`HoldsState`). This keeps the input position of every request processed since, in
processing order, and bounds each partition's commit by the oldest of them. A worker that dies re-reads
exactly those requests and the component rebuilds its state from them: the input topic is the state's
changelog, as it is for joins. :func:`held_hooks` attaches it to the workers of such components.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from flowserve.component import Component, require
from flowserve.runtime.emit import Item
from flowserve.runtime.hooks import BatchOutcome, StageHooks
from flowserve.topology.graph import Node, Topology

TP = tuple[str, int]


@runtime_checkable
class HoldsState(Protocol):
    """A component whose state spans batches (``Component.keeps_state``)."""

    def oldest_held(self) -> str | None:
        """The request id of the oldest request whose rows the state still needs (None: it needs none).

        Rows whose side reports are written are no longer needed once those reports have been drained."""
        ...


class HeldOffsets:
    """Positions of the requests processed since the oldest one a component's state still needs."""

    def __init__(self, component: HoldsState) -> None:
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


class HeldHooks(StageHooks):
    """Records each processed request's position; bounds the worker's commits by what the state needs."""

    holds_offsets = True

    def __init__(self, component: HoldsState) -> None:
        self.held = HeldOffsets(component)

    def begin(self, items: Sequence[Item]) -> Any:
        return items

    def end(self, token: Any, outcome: BatchOutcome) -> None:
        self.held.processed((it.ready.request_id, it.source) for it in token if it.source)

    def held_offsets(self) -> Mapping[TP, int]:
        return self.held.oldest()


def held_hooks(topology: Topology, node: Node, component: Component) -> list[StageHooks]:
    """The :data:`~flowserve.runtime.hooks.HookFactory` of state held across batches: a :class:`HeldHooks`
    for a component that declares ``keeps_state`` (it must implement :class:`HoldsState`), none elsewhere."""
    if not component.keeps_state:
        return []
    return [HeldHooks(require(component, HoldsState, "keep state across batches (keeps_state)"))]
