"""A request's deadline budget at one node: its share of the time left, and what is set aside after it.

**Deadline budget.** A request's remaining time is split between this node and the stages after it:
first ``hop_ms`` per Kafka hop still ahead (the hops to each downstream stage and to the outputs topic)
is set aside, then the node gets the share ``p1(node) / (p1(node) + p1(critical downstream path))`` of
the rest, where ``p1`` is a node's profiled p99 at batch 1 and the critical path is the downstream chain
with the largest sum of ``p1``. A node without a profile weighs as much as this one (the implicit
``outputs`` join weighs nothing once others are profiled); without any profile every stage weighs the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from flowserve.runtime.profiles import ExecProfile

if TYPE_CHECKING:
    from flowserve.topology.graph import Topology


@dataclass(frozen=True)
class Budget:
    """How much of a request's remaining time this node may spend (see the module docstring).

    ``share``: fraction of the remaining time (after the hop allowance) that is this node's.
    ``reserve_s``: time set aside for the Kafka hops still ahead.
    ``downstream_s``: the fastest the stages after this node can be (p1 along the critical path).
    """

    share: float = 1.0
    reserve_s: float = 0.002
    downstream_s: float = 0.0

    def node_deadline(self, deadline_ms: float, now_ms: float) -> float:
        """The time (ms) by which this node should have finished a request due at ``deadline_ms``."""
        left = deadline_ms - now_ms - self.reserve_s * 1000
        return now_ms + self.share * left

    def latest_finish(self, deadline_ms: float) -> float:
        """After this time (ms) the request cannot make its deadline even with downstream at its fastest."""
        return deadline_ms - (self.reserve_s + self.downstream_s) * 1000


def budget_for(topology: Topology, node_id: str, profiles: dict[str, ExecProfile | None],
               hop_ms: float = 2.0) -> Budget:
    """The :class:`Budget` of ``node_id``: its p1 against the critical downstream path's."""
    children: dict[str, set[str]] = {n: set() for n in topology.nodes}
    for n, node in topology.nodes.items():
        for src in node.sources:
            if src.node is not None and src.node in children:
                children[src.node].add(n)

    from flowserve.topology.graph import Collect

    def p1(n: str) -> float | None:
        prof = profiles.get(n)
        if prof is None and isinstance(topology.nodes[n].component, Collect) and profiles:
            return 0.0  # the implicit outputs join costs next to nothing once other stages are profiled
        return prof.p99(1) if prof is not None else None

    own = p1(node_id)
    known = [v for v in (p1(n) for n in topology.nodes) if v is not None]
    default = own if own is not None else (sum(known) / len(known) if known else 1.0)

    def longest(n: str, seen: frozenset[str]) -> tuple[float, int, float]:
        """(sum of p1 weights, hops, sum of known p1 seconds) along the heaviest path after ``n``."""
        best = (0.0, 0, 0.0)
        for m in children[n]:
            if m in seen:
                continue
            w, hops, secs = longest(m, seen | {m})
            v = p1(m)
            cand = (w + (v if v is not None else default), hops + 1, secs + (v or 0.0))
            if cand > best:
                best = cand
        return best

    weight, hops, downstream = longest(node_id, frozenset({node_id}))
    mine = own if own is not None else default
    share = mine / (mine + weight) if mine + weight > 0 else 1.0
    return Budget(share=share, reserve_s=(hops + 1) * hop_ms / 1000, downstream_s=downstream)
