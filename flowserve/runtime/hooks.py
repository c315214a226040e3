"""The stage-hook seam: how features observe a worker's batches and add records of their own.

A worker knows its hooks only through :class:`StageHooks`. Capture (lineage, tracing, captured ports,
side reports) implements it today; parity and the tuner's metrics plug in the same way. Whoever builds
workers (the command line, a host, a bench) passes a :data:`HookFactory`; the worker asks it once for
the hooks of its node and pays nothing when there are none.

Per step the worker calls, in order:

1. :meth:`StageHooks.begin` before a batch's ``process`` (it may rewrite the requests' headers, e.g. a
   traceparent, before they are copied to the outputs);
2. :meth:`StageHooks.end` after the batch's outputs are queued, with what ``process`` returned;
3. :meth:`StageHooks.after_step` once per step, batch or not. Under load its answer gates the commit:
   False says the hook still holds back records it owes for the batches so far (lineage being gathered
   into one record, say), so their offsets wait for a later step. With ``force`` (idle, shutdown,
   rebalance, the commit interval due) the hook must queue everything it holds: the worker commits
   after that step whatever the answer.

A hook writes records with :meth:`StageContext.emit`, into the worker's outbox: they are acknowledged
with the batch's outputs, before its offsets commit (at-least-once for side records too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from flowserve.component import Component
from flowserve.topology.graph import Node, Topology

if TYPE_CHECKING:
    from flowserve.runtime.emit import Item
    from flowserve.runtime.join import Ready

#: ``emit(topic, partition, key, value, headers)``: queue a record in the worker's outbox.
Emit = Callable[[str, int, bytes | None, bytes, Sequence[tuple[str, bytes]]], None]


@dataclass(frozen=True, slots=True)
class StageContext:
    """What a hook may use of the worker it is attached to."""

    topology: Topology
    node: Node
    component: Component
    #: queue a record in the worker's outbox (acknowledged before the batch's offsets commit)
    emit: Emit
    #: the topic a request's outputs went to: its caller's reply topic or the topology's outputs
    reply_topic: Callable[[Ready], str]


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What ``process`` returned for a batch, as the worker read it (see ``component.read_result``).

    ``sizes``: rows per request; ``outputs``: arrays by port, one row per input row; ``mask``: per port, the
    rows emitted there (absent: all); ``errors``: row -> reason (the request holding the row failed).
    """

    sizes: Sequence[int]
    outputs: Mapping[str, np.ndarray]
    mask: Mapping[str, np.ndarray]
    errors: Mapping[int, str]

    def requests(self) -> Iterator[tuple[slice, bool]]:
        """Per request, in batch order: its rows of ``outputs`` and whether it failed."""
        start = 0
        for n in self.sizes:
            rows = slice(start, start + n)
            start += n
            yield rows, bool(self.errors) and any(i in self.errors for i in range(rows.start, rows.stop))


class StageHooks:
    """Base class of stage hooks: every method is a no-op until a subclass overrides it."""

    def start(self, stage: StageContext) -> None:
        """Once, when the worker starts (after the component's ``setup``)."""

    def begin(self, items: Sequence[Item]) -> Any:
        """Before ``process`` runs on ``items``; the return value comes back to :meth:`end`.

        A batch that fails as a whole is retried request by request: then ``begin`` is called again
        for each without an ``end`` for the failed one.
        """
        return None

    def end(self, token: Any, outcome: BatchOutcome) -> None:
        """After the batch's outputs are queued in the outbox."""

    def after_step(self, *, force: bool) -> bool:
        """Once per step. ``force``: a commit follows this step (idle, shutdown, rebalance, or the commit
        interval is due), so queue everything held back now. Returns False while records owed for the
        batches so far are still held back (their offsets must not commit yet)."""
        return True

    def counters(self) -> Mapping[str, int]:
        """Counts this hook keeps, merged into the worker's counters (metrics snapshots, ``flowserve stats``)."""
        return {}

    def close(self) -> None:
        """Once, when the worker stops."""


#: builds the hooks of one node's worker (an empty list: none); called once per worker.
HookFactory = Callable[[Topology, Node, Component], list[StageHooks]]


def no_hooks(topology: Topology, node: Node, component: Component) -> list[StageHooks]:
    """The :data:`HookFactory` of a worker with no features attached."""
    return []


def chain(*factories: HookFactory) -> HookFactory:
    """One :data:`HookFactory` attaching every feature's hooks, in the order given."""

    def factory(topology: Topology, node: Node, component: Component) -> list[StageHooks]:
        return [hook for f in factories for hook in f(topology, node, component)]

    return factory
