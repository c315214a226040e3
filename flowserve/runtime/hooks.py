"""The stage-hook seam: how features observe a worker's batches and add records of their own.

A worker knows its features only through :class:`StageHooks`: capture (lineage, tracing, captured ports,
side reports), parity (encoders, decoders, first-wins inputs), the prediction cache, learning (versions,
held offsets) and selection each implement it. Whoever builds
workers (the command line, a host, a bench) passes a :data:`HookFactory`; the worker asks it once for
the hooks of its node and pays nothing when there are none.

Per step the worker calls, in order:

1. :meth:`StageHooks.admit` on the fetched records, before they are decoded: a hook may drop some (a
   parity-protected node's readers keep a request's first output);
2. :meth:`StageHooks.answer` before a batch's ``process``: a hook may answer requests itself (the
   prediction cache), so ``process`` runs on the others only; an answer may come in parts
   (:class:`AnsweredInParts`, the many-model scheduler): each part's results leave as it is ready;
3. :meth:`StageHooks.begin` before a batch's ``process`` (it may rewrite the requests' headers, e.g. a
   traceparent, before they are copied to the outputs);
4. :meth:`StageHooks.end` after the batch's outputs are queued, with what ``process`` returned;
5. :meth:`StageHooks.after_step` once per step, batch or not. Under load its answer gates the commit:
   False says the hook still holds back records it owes for the batches so far (lineage being gathered
   into one record, say), so their offsets wait for a later step. With ``force`` (idle, shutdown,
   rebalance, the commit interval due) the hook must queue everything it holds: the worker commits
   after that step whatever the answer.

Before each commit the worker bounds every partition's offset by :meth:`StageHooks.held_offsets` (a
component's state still needs those records); :meth:`StageHooks.forget` says a partition's records will be
read again (a rebalance moved it, or the worker re-reads after a failed produce).

A hook writes records with :meth:`StageContext.emit`, into the worker's outbox: they are acknowledged
with the batch's outputs, before its offsets commit (at-least-once for side records too).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from flowserve.component import Component
from flowserve.errors import Failure
from flowserve.topology.graph import Node, Topology

if TYPE_CHECKING:
    from flowserve.runtime.emit import Item
    from flowserve.runtime.join import Ready

TP = tuple[str, int]
#: outputs, masks and errors of a batch, as ``component.read_result`` gives them
Outcome = tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[int, str]]
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


class Answered(Protocol):
    """What :meth:`StageHooks.answer` gives back: the requests it answered and how to merge the rest."""

    @property
    def skip(self) -> Sequence[bool]:
        """Per request of the batch, in order: True when the hook answered it (``process`` skips it)."""
        ...

    @property
    def failures(self) -> Mapping[int, Failure]:
        """The requests (indexes as in :attr:`skip`, each skipped too) the hook answered with an error, and
        why. The worker writes their error results and counts them as it counts its own: kinds ``refused``
        and ``deadline`` (it cannot make its deadline) as refusals, any other (invalid input, a component's
        failure) as a dead letter; never as ``requests_ok``."""
        ...

    def complete(self, sizes: Sequence[int], outputs: dict[str, np.ndarray], mask: dict[str, np.ndarray],
                 errors: dict[int, str]) -> Outcome:
        """The whole batch's outcome in its order (``sizes``: rows per request), from the answers and what
        ``process`` returned for the requests not skipped (over those only, in order)."""
        ...


@dataclass(frozen=True, slots=True)
class Part:
    """Some requests of an answer given in parts, ready now: their indexes in the answered batch (in order)
    and their answer, an :class:`Answered` over those requests only (each skipped)."""

    requests: Sequence[int]
    answer: Answered


@runtime_checkable
class AnsweredInParts(Answered, Protocol):
    """An answer whose requests become ready at different times (the many-model scheduler answers each when
    its own model's batch ends). :attr:`skip` is known at once; :attr:`failures` and :meth:`complete` hold
    for the whole batch once :meth:`parts` is exhausted.

    When it answers the whole batch (every request skipped, no hook before it answered any) the worker
    writes each part's results as it comes and sends them at once (their acknowledgements still gate the
    batch's commit); otherwise it waits for every part and merges the whole as for any :class:`Answered`."""

    def parts(self) -> AsyncGenerator[Part, None]:
        """The answered requests in parts as they are ready; every skipped request in exactly one. Closed
        early (the worker failed meanwhile), it still finishes the work it started, unreported."""
        ...


class StageHooks:
    """Base class of stage hooks: every method is a no-op until a subclass overrides it."""

    #: This hook bounds commits (:meth:`held_offsets`): a component's state spans batches. Its worker does
    #: not rewind after a failed produce (re-reading would feed that state twice): it stops instead.
    holds_offsets: ClassVar[bool] = False

    def start(self, stage: StageContext) -> None:
        """Once, when the worker starts (after the component's ``setup``)."""

    def admit(self, records: list[Any]) -> list[Any]:
        """The fetched records (consumer records: topic, partition, offset, key, ...) to use, in order."""
        return records

    def forget(self, partitions: Any) -> None:
        """The records of these partitions (``TopicPartition``s) will be read again: forget what was read."""

    def answer(self, items: Sequence[Item], sizes: Sequence[int]) -> Answered | None:
        """Before a batch's ``process``: requests this hook answers itself (None: it answers none), whole or
        in parts (:class:`AnsweredInParts`).

        Hooks are asked in order, each about the requests the ones before it left; a batch that fails as
        a whole is retried request by request, each asked again."""
        return None

    def held_offsets(self) -> Mapping[TP, int]:
        """Per partition, the lowest offset whose record this hook's feature still needs (commit no
        further). Asked before each commit when :attr:`holds_offsets` is set."""
        return {}

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
