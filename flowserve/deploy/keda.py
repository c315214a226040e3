"""KEDA's ``lagThreshold`` for a node, derived from what one consumer drains within its share of the SLO.

KEDA's Kafka scaler serves the consumer group's total lag to the HPA as an ``AverageValue`` metric whose
target is ``lagThreshold``, so the HPA keeps ``ceil(lag / lagThreshold)`` replicas: each replica is left
with at most ``lagThreshold`` records. A record at the back of that backlog waits ``lagThreshold /
throughput`` seconds, so the threshold that keeps a node within its share of the SLO is ``throughput x
share``. ``flowserve deploy render`` writes it into each ScaledObject, and ``flowserve bench tuner`` sets
its KEDA contender (``flowserve_bench.keda``, in benchmarks/) with the same two functions.

The share: the SLO split evenly over the stages of the longest path from the inputs to the outputs
through the node (a request queues once at each stage of its path).

>>> lag_threshold(throughput=40.0, share_s=0.25)
10
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from flowserve.errors import ErrorKind, FlowserveError
from flowserve.topology.graph import Topology

#: What ``render`` writes when the plan gives no throughput and SLO to derive it from: 100 records
#: (about one second of work for a consumer of 100 records/s). KEDA's own default is 10.
DEFAULT_LAG_THRESHOLD = 100


def lag_threshold(throughput: float, share_s: float) -> int:
    """The records one consumer of ``throughput`` records/s drains within ``share_s`` seconds (at least 1)."""
    if not (throughput > 0 and share_s > 0):
        raise FlowserveError(f"a lag threshold needs a positive throughput and SLO share, not {throughput} "
                             f"records/s and {share_s} s", kind=ErrorKind.INVALID_INPUT)
    return max(1, math.floor(throughput * share_s + 1e-9))  # a share like 0.6 / 3 is 0.1999...


def path_stages(topology: Topology) -> dict[str, int]:
    """Per node: how many stages the longest input-to-output path through it has (the node included).

    A revisit loop's back edge (to a node not yet seen in topological order) is not followed."""
    order = list(topology.nodes)
    feeds = {n: [s.node for s in node.sources if s.node in topology.nodes] for n, node in topology.nodes.items()}
    upto: dict[str, int] = {}
    for n in order:
        upto[n] = 1 + max((upto[s] for s in feeds[n] if s in upto), default=0)
    fed_by: dict[str, list[str]] = {n: [] for n in order}
    for n, sources in feeds.items():
        for s in sources:
            fed_by[s].append(n)
    after: dict[str, int] = {}
    for n in reversed(order):
        after[n] = 1 + max((after[d] for d in fed_by[n] if d in after), default=0)
    return {n: upto[n] + after[n] - 1 for n in order}


def slo_shares(topology: Topology, slo_s: float) -> dict[str, float]:
    """Per node: its share of the end-to-end SLO, in seconds (see the module docstring)."""
    return {n: slo_s / stages for n, stages in path_stages(topology).items()}


def lag_thresholds(topology: Topology, slo_s: float | None, throughput: Mapping[str, float | None]
                   ) -> dict[str, int]:
    """Per node: the lagThreshold for its ScaledObject; :data:`DEFAULT_LAG_THRESHOLD` where its throughput
    (records/s one consumer handles) is not known."""
    known = {n: rate for n, rate in throughput.items() if rate}
    if slo_s is None:
        if known:
            raise FlowserveError(f"nodes {sorted(known)} give a throughput but there is no SLO to take their "
                                 f"share of: set the plan's slo_ms", kind=ErrorKind.INVALID_INPUT)
        return dict.fromkeys(topology.nodes, DEFAULT_LAG_THRESHOLD)
    shares = slo_shares(topology, slo_s)
    return {n: lag_threshold(known[n], shares[n]) if n in known else DEFAULT_LAG_THRESHOLD for n in topology.nodes}
