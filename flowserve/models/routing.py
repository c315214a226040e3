"""Where a model's requests enter a many-model node: the partition of its placement, chosen per request.

Kafka gives each partition of the node's input topic to one worker of its consumer group (the range
assignor, :meth:`~flowserve.models.placement.Placement.owner`), and a request keeps its partition through
the pipeline. So the producer decides which worker serves a request by the partition it writes it to: a
model's requests all go to its home partition (:func:`~flowserve.models.placement.partition_of`), and
those of a hot model, which :class:`~flowserve.models.placement.Placement` gives several workers, to one
partition of each of its workers in turn. Each worker then holds the models of its partitions, instead of
every worker loading every model.

:class:`ModelRouter` is that choice, for one many-model node: :meth:`~ModelRouter.partition` on the hot
path (a dict look-up and a counter: a model's partitions are hashed once and cached), and
:meth:`~ModelRouter.replace`, now and then, places again from the requests it has routed (each model's
share, decayed), and returns what changed. A worker that dies loses its partitions to the others at the
group's next rebalance; they load its models on demand, so nothing waits on the router to notice.

>>> router = ModelRouter(partitions=8, workers=2)
>>> router.partition("m-1") == partition_of("m-1", 8)
True
>>> for _ in range(90):
...     _ = router.partition("hot")
>>> [c.model for c in router.replace()]  # 90 of 91 requests: a copy on each worker
['hot']
>>> sorted({router.owner(router.partition("hot")) for _ in range(4)})
[0, 1]
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from flowserve.models.placement import Placement, partition_of

#: each re-placement keeps this part of the earlier counts: shares follow popularity over a few rounds
DECAY = 0.5

#: a model whose decayed count falls below this is forgotten (it goes back to its home alone)
FORGET = 0.5


@dataclass(frozen=True, slots=True)
class PlacementChange:
    """Model ``model`` is now served by ``workers`` (their ranks in the range assignor's order) through
    ``partitions`` (one each, in the order requests go to them), instead of ``before``; ``share``: its
    part of the requests routed lately."""

    model: str
    workers: tuple[int, ...]
    partitions: tuple[int, ...]
    before: tuple[int, ...]
    share: float

    @property
    def reason(self) -> str:
        if len(self.workers) > len(self.before):
            return f"hot: {self.share:.1%} of requests needs {len(self.workers)} worker(s)"
        if len(self.workers) < len(self.before):
            return f"cooled: {self.share:.1%} of requests needs {len(self.workers)} worker(s)"
        return "workers changed"

    def as_action(self) -> dict[str, object]:
        """The body of its record on the actions topic (``action``, as ``flowserve ui`` lists them)."""
        return {"model": self.model, "workers": list(self.workers), "partitions": list(self.partitions),
                "before": list(self.before), "share": round(self.share, 4), "reason": self.reason}


class ModelRouter:
    """The partitions of one many-model node's models, over ``workers`` workers (see the module's doc)."""

    def __init__(self, partitions: int, workers: int = 1, *, hot_share: float = 0.2) -> None:
        self.hot_share = hot_share
        self.placement = Placement(max(1, min(workers, partitions)), partitions=partitions, hot_share=hot_share)
        self.counts: Counter[str] = Counter()  # requests routed since the last replace
        self.weights: dict[str, float] = {}  # decayed counts of earlier rounds
        self._routes: dict[str, Iterator[int]] = {}  # model -> its partitions in turn (cached)

    @property
    def partitions(self) -> int:
        return self.placement.partitions

    @property
    def workers(self) -> int:
        return self.placement.workers

    def owner(self, partition: int) -> int:
        return self.placement.owner(partition)

    def partition(self, model: str) -> int:
        """The partition of the next request for ``model`` (counted towards its share)."""
        self.counts[model] += 1
        route = self._routes.get(model)
        if route is None:
            route = self._routes[model] = itertools.cycle(self.partitions_of(model))
        return next(route)

    def partitions_of(self, model: str) -> tuple[int, ...]:
        """One partition per worker of ``model``, its home first: along the ring from its home partition,
        the first one each of its workers owns (:meth:`Placement.ring`, the walk placing them)."""
        workers = self.placement.workers_of(model)
        if len(workers) == 1:
            return (partition_of(model, self.partitions),)
        first = dict(self.placement.ring(model))
        return tuple(first[w] for w in workers)

    def shares(self) -> dict[str, float]:
        """Each recently routed model's part of the requests (decayed over rounds)."""
        total = sum(self.weights.values())
        return {m: w / total for m, w in self.weights.items()} if total else {}

    def replace(self, workers: int | None = None, partitions: int | None = None) -> list[PlacementChange]:
        """Place again from the requests routed since the last call (added to the decayed earlier ones),
        over ``workers`` workers and ``partitions`` partitions where they changed; the models whose
        workers changed. A change of either moves every home (the ranges move), and is not reported."""
        for m, n in self.counts.items():
            self.weights[m] = self.weights.get(m, 0.0) + n
        self.counts.clear()
        workers = max(1, min(workers or self.workers, partitions or self.partitions))
        before = dict(self.placement.holders)
        if workers != self.workers or (partitions or self.partitions) != self.partitions:
            self.placement = Placement(workers, partitions=partitions or self.partitions, hot_share=self.hot_share)
            before = {}
        shares = self.shares()
        # models placed on several workers before are placed again even when forgotten: they cool to one
        placed = self.placement.place({**dict.fromkeys(before, 0.0), **shares})
        moved = [(model, holders, was) for model, holders in placed.items()
                 if holders != (was := before.get(model, (self.placement.home(model),)))]
        # keep only what decides a placement: the replicated models, and the counts still worth decaying
        self.placement.holders = {m: h for m, h in placed.items() if len(h) > 1}
        self.weights = {m: w * DECAY for m, w in self.weights.items() if w * DECAY >= FORGET}
        self._routes.clear()
        # partitions as the new holders give them
        return [PlacementChange(m, h, self.partitions_of(m), was, shares.get(m, 0.0)) for m, h, was in moved]

    def placed(self) -> dict[str, dict[str, object]]:
        """The models on more than one worker: their workers, partitions and share (``flowserve stats``)."""
        shares = self.shares()
        return {m: {"workers": list(h), "partitions": list(self.partitions_of(m)),
                    "share": round(shares.get(m, 0.0), 4)} for m, h in sorted(self.placement.holders.items())}
