"""Fusion chosen by the planner: which chains of adjacent stages ``flowserve plan`` runs as one stage.

A fused chain (:mod:`flowserve.topology.fuse`) runs its members one after the other in one worker, so
its consumers are co-located: one stage whose service time for a batch of ``n`` is the sum of its members'
batch times at ``n`` (:func:`flowserve.tuning.plan.sum_tables`), on a hardware kind every member runs on,
that pays one Kafka hop and one per-batch overhead where the members apart pay one each. Whether that is
cheaper depends on the trace: the members scale together, so a chain of a cheap stage and a busy one
gives the cheap one the busy one's consumers. So the simulator decides, as it does everything else:

1. **links**: a stage and the one after it may fuse when the second reads only the first, nothing else
   reads the first, they share a hardware kind, neither says ``fuse: never``, capture names neither (its
   edges stay on Kafka as written), neither files side reports, learns or is parity-protected, and both
   or neither are cached. The links form disjoint paths; every other pair is refused with its reason;
2. **greedy merging**: from every stage apart, plan (:func:`flowserve.tuning.plan.search`) each way of
   merging two neighbouring segments of a path, take the best, and repeat while the best beats the
   current plan: cheaper, or as cheap with a lower p99;
3. **why**: each chain of the result is planned once more apart (the other chains kept), and the plan
   file records both figures, the candidates weighed and the refused links.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from flowserve.errors import FlowserveError
from flowserve.topology.graph import Topology
from flowserve.topology.spec import ID_PATTERN
from flowserve.tuning.plan import Plan, build_plan, default_prices, priced_options, sum_tables
from flowserve.tuning.search import search
from flowserve.tuning.simulate import SimResult
from flowserve.tuning.stages import StageConfig, StageOptions, cost

Chains = dict[str, list[str]]
#: (cost per hour, p99 seconds, configuration, result), or None where no configuration meets the SLO
Outcome = tuple[float, float, dict[str, StageConfig], SimResult] | None


def fusable_links(topology: Topology, options: Sequence[StageOptions]) -> tuple[list[tuple[str, str]],
                                                                                 list[dict[str, str]]]:
    """The pairs ``(a, b)`` of adjacent stages that may fuse (``b`` reads only ``a``, nothing else reads
    ``a``), and every other pair of a stage and one reading it, with why it may not."""
    spec = topology.spec
    tables = {o.id: o.tables for o in options}
    readers: dict[str, set[str]] = {n: set() for n in topology.nodes}
    for node in topology.nodes.values():
        for src in [*node.sources, *node.triggers]:
            if src.node is not None:
                readers[src.node].add(node.id)
    feeds_outputs = {src.node for src in topology.outputs.values()}
    cap = spec.capture
    named = set() if cap is None else ({*cap.nodes, *(t.partition(".")[0] for t in [*cap.ports, *cap.redact])})
    links: list[tuple[str, str]] = []
    refused: list[dict[str, str]] = []
    for a, ups in readers.items():
        for b in sorted(ups):
            why = _refusal(topology, a, b, ups, a in feeds_outputs, named, tables)
            if why is None:
                links.append((a, b))
            else:
                refused.append({"link": f"{a} -> {b}", "why": why})
    return links, refused


def _refusal(topology: Topology, a: str, b: str, readers_of_a: set[str], a_feeds_outputs: bool, named: set[str],
             tables: dict[str, dict[str, dict[int, float]]]) -> str | None:
    spec = topology.spec
    for n in (a, b):
        if n in spec.fuse:
            return f"'{n}' is a chain fused by hand (fuse:)"
        if n not in spec.nodes:
            return f"'{n}' is the implicit node that gathers the outputs"
    node_b = topology.nodes[b]
    if node_b.triggers or any(len(srcs) != 1 or srcs[0].node != a for srcs in node_b.bindings.values()):
        return f"'{b}' reads more than '{a}'"
    if len(readers_of_a) > 1 or a_feeds_outputs:
        return f"'{a}' feeds more than '{b}'"
    for n in (a, b):
        if spec.nodes[n].fuse == "never":
            return f"'{n}' says fuse: never"
        if spec.nodes[n].models is not None:
            return f"'{n}' serves many models"
        if n in named:
            return f"capture names '{n}', so its edges stay on Kafka"
        component = topology.nodes[n].component
        if component.side_output or component.learns or spec.nodes[n].parity is not None:
            return f"'{n}' files side reports, learns or is parity-protected, which a chain does not carry"
    if spec.nodes[a].join.type == "deadline":
        return f"'{a}' is behind a deadline join"
    if (spec.nodes[a].cache is None) != (spec.nodes[b].cache is None):
        return "one of them is cached and the other is not (a chain is cached as a whole)"
    if not set(tables[a]) & set(tables[b]):
        return (f"no hardware kind in common ('{a}': {', '.join(sorted(tables[a]))}; "
                f"'{b}': {', '.join(sorted(tables[b]))})")
    return None


def paths(links: Sequence[tuple[str, str]]) -> list[list[str]]:
    """The maximal paths the links form (each stage has at most one link in and one out)."""
    after = dict(links)
    heads = [a for a, _ in links if a not in set(after.values())]
    out = []
    for head in heads:
        path = [head]
        while path[-1] in after:
            path.append(after[path[-1]])
        out.append(path)
    return out


def chain_name(members: Sequence[str], taken: set[str]) -> str:
    """The fused stage's id: its members joined by '-', made unique among ``taken``."""
    name = "-".join(members)
    if not re.match(ID_PATTERN, name):  # pragma: no cover - node ids match it, and so does their join
        name = "chain"
    unique, k = name, 2
    while unique in taken:
        unique, k = f"{name}-{k}", k + 1
    return unique


def fused_options(options: Sequence[StageOptions], chains: Chains) -> list[StageOptions]:
    """The planner's stages with each chain as one: the sums of its members' tables on the kinds they all
    run on, its first member's inputs and join, its last member's routing and output; references to the
    last member read the chain."""
    by_id = {o.id: o for o in options}
    head = {members[0]: name for name, members in chains.items()}
    inner = {m for members in chains.values() for m in members[1:]}
    rename = {members[-1]: name for name, members in chains.items()}
    out = []
    for o in options:
        if o.id in inner:
            continue
        inputs = [(rename.get(src, src) if src is not None else None, port) for src, port in o.inputs]
        if o.id not in head:
            out.append(StageOptions(o.id, o.tables, inputs, o.join, o.fractions, o.output))
            continue
        parts = [by_id[m] for m in chains[head[o.id]]]
        kinds = sorted(set.intersection(*(set(p.tables) for p in parts)))
        if not kinds:
            raise FlowserveError(f"chain '{head[o.id]}' ({', '.join(p.id for p in parts)}) shares no hardware kind")
        tables = {k: sum_tables([p.tables[k] for p in parts]) for k in kinds}
        out.append(StageOptions(head[o.id], tables, inputs, o.join, parts[-1].fractions, parts[-1].output))
    return out


def _better(new: Outcome, old: Outcome) -> bool:
    """Cheaper, or as cheap (to a thousandth of a cent an hour) with a lower p99; feasible beats infeasible."""
    if new is None:
        return False
    if old is None:
        return True
    return new[0] < old[0] - 1e-5 or (abs(new[0] - old[0]) <= 1e-5 and new[1] < old[1])


def _figures(outcome: Outcome) -> dict[str, Any]:
    if outcome is None:
        return {"feasible": False}
    return {"cost_per_hour": round(outcome[0], 6), "p99_ms": round(outcome[1] * 1000, 3)}


def choose_fusion(topology: Topology, options: Sequence[StageOptions], arrivals: np.ndarray, slo_s: float, *,
                  prices: dict[str, float], percentile: float = 99.0, log: Callable[[str], None] | None = None,
                  **search_args: Any) -> tuple[Chains, list[StageOptions], dict[str, StageConfig], SimResult,
                                               dict[str, Any]]:
    """The chains to fuse (see the module docstring), the stages and configuration planned with them, the
    simulated result and the record of why. ``search_args`` go to :func:`flowserve.tuning.plan.search`."""
    links, refused = fusable_links(topology, options)
    taken = set(topology.nodes)
    memo: dict[tuple[tuple[str, ...], ...], Outcome] = {}
    errors: list[FlowserveError] = []

    def segments_to_chains(segments: list[list[list[str]]]) -> Chains:
        chains = {}
        for path in segments:
            for seg in path:
                if len(seg) > 1:
                    chains[chain_name(seg, taken)] = seg
        return chains

    def evaluate(chains: Chains) -> Outcome:
        key = tuple(sorted(tuple(m) for m in chains.values()))
        if key not in memo:
            try:
                config, result = search(fused_options(options, chains), arrivals, slo_s, prices=prices,
                                        percentile=percentile, **search_args)
            except FlowserveError as exc:  # no configuration meets the SLO this way
                errors.append(exc)
                memo[key] = None
            else:
                memo[key] = (cost(config, prices), result.percentile(percentile), config, result)
        return memo[key]

    segments = [[[m] for m in path] for path in paths(links)]
    apart = current = evaluate({})
    considered: dict[tuple[str, ...], dict[str, Any]] = {}  # a later round weighs some merges again
    while True:
        best: tuple[Outcome, list[list[list[str]]], list[str]] | None = None
        for p, path in enumerate(segments):
            for i in range(len(path) - 1):
                merged = [*path[:i], path[i] + path[i + 1], *path[i + 2:]]
                trial = [*segments[:p], merged, *segments[p + 1:]]
                outcome = evaluate(segments_to_chains(trial))
                considered[tuple(path[i] + path[i + 1])] = {"members": path[i] + path[i + 1], **_figures(outcome)}
                if best is None or _better(outcome, best[0]):
                    best = (outcome, trial, path[i] + path[i + 1])
        if best is None or not _better(best[0], current):
            break
        current, segments = best[0], best[1]
        if log:
            log(f"fuse {' + '.join(best[2])}: {_figures(current)}")
    if current is None:
        raise errors[0] if errors else FlowserveError("no configuration meets the SLO")  # pragma: no cover
    chains = segments_to_chains(segments)
    record: dict[str, Any] = {"unfused": _figures(apart), "chains": {}, "considered": list(considered.values()),
                              "refused": refused}
    for name, members in chains.items():
        without = evaluate({k: v for k, v in chains.items() if k != name})
        fused = _figures(current)
        if without is not None and current[0] < without[0] - 1e-5:
            why = f"cheaper: ${current[0]:.3f}/h fused against ${without[0]:.3f}/h apart"
        elif without is not None:
            why = f"as cheap (${current[0]:.3f}/h), p99 {current[1] * 1000:.1f} ms fused against " \
                  f"{without[1] * 1000:.1f} ms apart"
        else:
            why = "apart, no configuration meets the SLO"
        record["chains"][name] = {"members": members, "hardware": current[2][name].hardware, "fused": fused,
                                  "apart": _figures(without), "why": why}
    return chains, fused_options(options, chains), current[2], current[3], record


def make_fused_plan(topology: Topology, arrivals: np.ndarray, slo_ms: float, *, hop_ms: float,
                    overhead_ms: float = 0.0, prices: dict[str, float] | None = None, headroom: float = 2.0,
                    seed: int = 0, log: Callable[[str], None] | None = None) -> Plan:
    """:func:`flowserve.tuning.plan.make_plan`, choosing which chains to fuse too (``flowserve plan``)."""
    prices = prices or default_prices()
    options = priced_options(topology, prices)
    chains, planned, config, result, record = choose_fusion(
        topology, options, arrivals, slo_ms / 1000, prices=prices, log=log, hop_s=hop_ms / 1000,
        overhead_s=overhead_ms / 1000, seed=seed, min_partitions=topology.spec.partitions, headroom=headroom)
    return build_plan(topology, planned, config, result, arrivals, slo_ms, hop_ms=hop_ms, overhead_ms=overhead_ms,
                      prices=prices, headroom=headroom, fuse=chains, fusion=record)
