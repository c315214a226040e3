"""The planner (``flowserve plan``): the cheapest per-stage configuration whose simulated p99 meets the SLO.

InferLine's low-frequency planner. Each stage has options: the hardware kinds it can run on (from its
component's declared latency table, or the topology's measured profile for a CPU stage), a max batch and
a number of consumers. The search:

1. **feasible start**: every stage at batch 1 on its fastest hardware, with the fewest consumers the
   bounds allow (:class:`Bounds`); while the simulated p99 misses the SLO, grow the busiest stage by a
   quarter (up to MAX_CONSUMERS);
2. **greedy cost reduction**: for every stage, the families of cheaper variants (its hardware with fewer
   consumers, or the next cheaper kind; the batch as it is or doubled up to 64), each at the fewest
   consumers that meet the SLO (bisected); take the cheapest; repeat until no family is cheaper.

**Pruning**: the trace's arrival curve against a stage's maximum service curve bounds from below how
many requests miss (network calculus's lower delay bound); a candidate the bound refuses is not
simulated, and a family whose fewest allowed consumers already cost more than the best found is skipped.
The bound holds for the simulator itself, so pruning changes the time taken, not the plan.

The plan file gives, per stage, the hardware kind, max batch and consumers, plus the topology's partition
count: the most consumers any stage has, times ``headroom``, so that the tuner can add consumers without
adding partitions. ``flowserve run --plan`` and ``flowserve worker --plan`` apply it (:func:`apply_plan`).
``flowserve plan`` also chooses which chains of stages to fuse (:mod:`flowserve.tuning.fusion_plan`): a plan
names them under ``fuse`` (a stage of the plan is then a chain) and says why under ``fusion``.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.component import Component
from flowserve.errors import FlowserveError
from flowserve.runtime import hardware as hw
from flowserve.runtime.profiles import load_profiles, profile_path
from flowserve.topology.fuse import Chain
from flowserve.topology.graph import Topology, compile_spec
from flowserve.topology.spec import BatchingSpec
from flowserve.tuning import curves
from flowserve.tuning.bounds import Bounds, required_stages  # noqa: F401 - required_stages: re-exported
from flowserve.tuning.capabilities import latency_table, route_fractions
from flowserve.tuning.documents import read_document
from flowserve.tuning.simulate import SimResult, SimStage, batch_time, simulate
from flowserve.tuning.stages import StageConfig, StageOptions

PLAN_FORMAT = "flowserve-plan/1"
#: A stage with neither a declared table nor a profile costs this (builtin plumbing such as Identity).
NEGLIGIBLE_S = 5e-5
MAX_BATCH = 64
#: per stage: a cluster's worth (the search bisects, so the cap costs a few simulations, not a thousand)
MAX_CONSUMERS = 1000


@dataclass
class Plan:
    topology: str
    slo_ms: float
    partitions: int
    hop_ms: float
    stages: dict[str, StageConfig]
    predicted: dict[str, Any] = field(default_factory=dict)
    #: what a worker spends per batch besides the device (see flowserve.tuning.simulate), in ms
    overhead_ms: float = 0.0
    #: the arrival envelope of the trace the plan was made for: (window seconds, most arrivals in such a
    #: window). The tuner scales against it (InferLine: the plan holds for its sample; act when live exceeds it).
    envelope: list[tuple[float, int]] = field(default_factory=list)
    #: the chains the planner fused: fused stage id -> its members in order (a stage of ``stages``)
    fuse: dict[str, list[str]] = field(default_factory=dict)
    #: why: each fused chain's cost and p99 against its members apart, the candidates weighed, the
    #: links that may not fuse and the reason (:func:`flowserve.tuning.fusion_plan.choose_fusion`)
    fusion: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"format": PLAN_FORMAT, "topology": self.topology, "slo_ms": self.slo_ms,
                "partitions": self.partitions, "hop_ms": self.hop_ms, "overhead_ms": self.overhead_ms,
                "stages": {k: asdict(v) for k, v in self.stages.items()}, "predicted": self.predicted,
                "envelope": [[w, n] for w, n in self.envelope], "fuse": self.fuse, "fusion": self.fusion}

    def cost_per_hour(self, prices: dict[str, float]) -> float:
        return sum(c.consumers * prices[c.hardware] for c in self.stages.values())


def save_plan(plan: Plan, path: str | Path) -> Path:
    target = Path(path)
    target.write_text(json.dumps(plan.to_json(), indent=1) + "\n")
    return target


def load_plan(path: str | Path) -> Plan:
    doc = read_document(path, PLAN_FORMAT, "plan", "; write one with 'flowserve plan'")
    stages = {k: StageConfig(str(v["hardware"]), int(v["max_batch"]), int(v["consumers"]))
              for k, v in doc["stages"].items()}
    fuse = {str(k): [str(m) for m in v] for k, v in (doc.get("fuse") or {}).items()}
    return Plan(doc["topology"], float(doc["slo_ms"]), int(doc["partitions"]), float(doc["hop_ms"]), stages,
                dict(doc.get("predicted") or {}), float(doc.get("overhead_ms", 0.0)),
                [(float(w), int(n)) for w, n in doc.get("envelope") or []], fuse, dict(doc.get("fusion") or {}))


# -- from a topology -------------------------------------------------------------------------------

def stage_options(topology: Topology) -> list[StageOptions]:
    """Each node's options: declared tables per hardware kind, else the measured profile (as ``cpu``); a
    fused chain's, the sums of its members' tables on the kinds they share (:func:`sum_tables`)."""
    profiles = load_profiles(profile_path(topology.source)) if topology.source.endswith((".yaml", ".yml")) else {}
    outputs = {src.node for src in topology.outputs.values()}

    def tables_of(node_id: str, component: Component) -> dict[str, dict[int, float]]:
        tables = {kind: t for kind in hw.HARDWARE if (t := latency_table(component, kind))}
        if not tables:
            entry = profiles.get(node_id, {})
            measured = {int(k): float(v) for k, v in (entry.get("p50_s") or {}).items()}
            tables = {"cpu": measured or {1: NEGLIGIBLE_S}}
        return tables

    options = []
    for node_id, node in topology.nodes.items():
        component = node.component
        if isinstance(component, Chain) and node_id not in profiles:
            parts = [tables_of(step.id, c) for step, c in component.steps]
            shared = set.intersection(*(set(t) for t in parts))
            tables = {k: sum_tables([t[k] for t in parts]) for k in sorted(shared)} or {"cpu": {1: NEGLIGIBLE_S}}
            component = component.steps[-1][1]  # its routing is its last member's
        else:
            tables = tables_of(node_id, component)
        inputs = [(src.node, src.tensor) for src in node.sources]
        options.append(StageOptions(node_id, tables, inputs, node.join.type, route_fractions(component),
                                    node_id in outputs))
    return options


def sum_tables(tables: Sequence[dict[int, float]]) -> dict[int, float]:
    """The latency table of stages run one after the other on one batch: at every size any of them lists
    (and 1 and MAX_BATCH), the sum of their batch times. :func:`batch_time` is piecewise linear between
    listed sizes, so the sum is exact at every size up to the largest listed.

    >>> sum_tables([{1: 1.0, 4: 2.5}, {2: 1.0}])
    {1: 1.5, 2: 2.5, 4: 4.5, 64: 64.5}
    """
    sizes = sorted({1, MAX_BATCH, *(n for t in tables for n in t)})
    return {n: sum(batch_time(t, n) for t in tables) for n in sizes}


def apply_plan(topology: Topology, plan: Plan) -> Topology:
    """The topology with the plan's partitions, per node its consumers, max batch and hardware, and the
    plan's chains fused (each member of a chain configured as the chain's stage, then fused by ``fuse:``)."""
    if plan.topology != topology.name:
        raise FlowserveError(f"the plan is for topology '{plan.topology}', not '{topology.name}'")
    nodes = dict(topology.spec.nodes)
    chains = {**topology.spec.fuse, **plan.fuse}
    components: dict[str, Component] = {}
    for node_id, compiled in topology.nodes.items():
        members = compiled.component.steps if isinstance(compiled.component, Chain) else []
        components.update({node_id: compiled.component, **{step.id: c for step, c in members}})
    for stage_id, cfg in plan.stages.items():
        for node_id in chains.get(stage_id, [stage_id]):
            if node_id not in nodes:
                raise FlowserveError(f"the plan names node '{node_id}', which topology '{topology.name}' lacks")
            node = nodes[node_id]
            params = dict(node.params)
            param = components[node_id].hardware_param
            if param is not None:
                params[param] = cfg.hardware
            nodes[node_id] = node.model_copy(update={
                "replicas": cfg.consumers, "max_batch": cfg.max_batch, "params": params,
                "batching": BatchingSpec(policy="lag")})
    spec = topology.spec.model_copy(update={"nodes": nodes, "partitions": plan.partitions, "fuse": chains})
    return compile_spec(spec, topology.source)


# -- the search ------------------------------------------------------------------------------------

Evaluate = Callable[[dict[str, StageConfig]], SimResult]


def sim_stages(options: Sequence[StageOptions], config: dict[str, StageConfig]) -> list[SimStage]:
    return [SimStage(o.id, o.tables[config[o.id].hardware], o.inputs, config[o.id].consumers,
                     config[o.id].max_batch, o.join, o.fractions, o.output) for o in options]


def cost(config: dict[str, StageConfig], prices: dict[str, float]) -> float:
    return sum(c.consumers * prices[c.hardware] for c in config.values())


def partitions_for(config: dict[str, StageConfig], minimum: int = 1, headroom: float = 2.0) -> int:
    """The topology's partitions under ``config``: at least the most consumers of any stage times
    ``headroom``, and up to twice that, the count that spreads most evenly over every stage's consumers
    (the range assignor gives some consumers ``ceil(P / c)`` partitions: the worst such excess decides)."""
    base = max(minimum, math.ceil(max(c.consumers for c in config.values()) * headroom))
    counts = {c.consumers for c in config.values() if c.consumers > 1}

    def excess(p: int) -> float:
        return max((math.ceil(p / c) * c / p for c in counts), default=1.0)

    return min(range(base, 2 * base), key=lambda p: (excess(p), p)) if counts else base


def search(options: Sequence[StageOptions], arrivals: np.ndarray, slo_s: float, *, prices: dict[str, float],
           hop_s: float, overhead_s: float = 0.0, seed: int = 0, jitter: float = 0.05, percentile: float = 99.0,
           min_partitions: int = 1, headroom: float = 2.0, prune: bool = True,
           max_consumers: int = MAX_CONSUMERS, log: Callable[[str], None] | None = None,
           counts: dict[str, int] | None = None) -> tuple[dict[str, StageConfig], SimResult]:
    """InferLine's planner search (see the module docstring); the cheapest feasible config found.
    ``prune=False`` simulates what the bounds would rule out (the same answer, slower: tests compare);
    ``counts`` receives how many configurations were simulated and how many the bounds ruled out."""
    tally = counts if counts is not None else {}
    tally.update(simulated=0, pruned=0)
    arrivals = np.sort(np.asarray(arrivals, dtype=float))
    bounds = Bounds(options, arrivals, slo_s, percentile=percentile, hop_s=hop_s, overhead_s=overhead_s,
                    jitter=jitter, seed=seed)
    cache: dict[tuple[tuple[str, str, int, int], ...], SimResult] = {}

    def run(config: dict[str, StageConfig]) -> SimResult:
        key = tuple(sorted((k, v.hardware, v.max_batch, v.consumers) for k, v in config.items()))
        if key not in cache:
            tally["simulated"] += 1
            cache[key] = simulate(sim_stages(options, config), arrivals,
                                  partitions=partitions_for(config, min_partitions, headroom),
                                  hop_s=hop_s, jitter=jitter, seed=seed, overhead_s=overhead_s)
        return cache[key]

    def ok(result: SimResult) -> bool:
        return result.percentile(percentile) <= slo_s

    def meets(config: dict[str, StageConfig]) -> SimResult | None:
        if prune and bounds.rules_out(config):
            tally["pruned"] += 1
            return None
        result = run(config)
        return result if ok(result) else None

    def batch_one(o: StageOptions, kind: str) -> float:
        return o.tables[kind][min(o.tables[kind])]

    fastest = {o.id: min(o.tables, key=functools.partial(batch_one, o)) for o in options}
    # start where the bounds allow (fewer consumers cannot meet the SLO), grow the busiest stage by a quarter
    config = {o.id: StageConfig(fastest[o.id], 1, min(max_consumers, bounds.fewest(o.id, fastest[o.id], 1)))
              for o in options}
    result = run(config)
    while not ok(result):
        busiest = max((s for s in options if config[s.id].consumers < max_consumers),
                      key=lambda s: result.stages[s.id].utilisation + result.stages[s.id].mean_wait_s, default=None)
        if busiest is None:
            raise FlowserveError(f"no configuration meets p{percentile:g} <= {slo_s * 1000:.0f} ms even with "
                                 f"{max_consumers} consumers per stage on the fastest hardware; relax the SLO")
        now = config[busiest.id].consumers
        grown = min(max_consumers, now + max(1, now // 4))
        config = {**config, busiest.id: replace(config[busiest.id], consumers=grown)}
        result = run(config)
        if log:
            log(f"feasible start: {busiest.id} x{grown} -> p99 {result.percentile(percentile) * 1000:.1f} ms")
    answers: dict[tuple[str, str, int], int] = {}  # (stage, hardware, batch) -> its fewest, last time
    while True:
        current = cost(config, prices)
        best: tuple[float, float, dict[str, StageConfig], SimResult] | None = None

        # each family's cheapest conceivable cost: the fewest consumers the bounds allow
        floors = {(sid, kind, batch, most): current - config[sid].consumers * prices[config[sid].hardware]
                  + max(1, bounds.fewest(sid, kind, batch)) * prices[kind]
                  for sid, kind, batch, most in _families(options, config, prices, max_consumers)}
        for family in sorted(floors, key=floors.__getitem__):
            if best is not None and prune and floors[family] > best[0] + 1e-12:
                break  # no family from here on can beat the best found
            found = _fewest_feasible(config, family, meets, answers.get(family[:3]))
            if found is not None:
                trial, r = found
                answers[family[:3]] = trial[family[0]].consumers
                c, p = cost(trial, prices), r.percentile(percentile)
                if best is None or (c, p) < (best[0], best[1]):
                    best = (c, p, trial, r)
        if best is None:
            return config, result
        config, result = best[2], best[3]
        if log:
            log(f"cheaper: ${best[0]:.3f}/h, p99 {best[1] * 1000:.1f} ms")


def _families(options: Sequence[StageOptions], config: dict[str, StageConfig], prices: dict[str, float],
              max_consumers: int) -> list[tuple[str, str, int, int]]:
    """The cheaper variants of each stage as (stage, hardware, max batch, most consumers that keep it
    cheaper): its hardware with fewer consumers, or the next cheaper kind; the batch as it is or doubled up
    to MAX_BATCH (cost does not depend on the batch)."""
    out = []
    for o in options:
        cfg = config[o.id]
        batches = [cfg.max_batch]
        while batches[-1] < MAX_BATCH:
            batches.append(min(MAX_BATCH, batches[-1] * 2))
        now = cfg.consumers * prices[cfg.hardware]
        kinds = [(cfg.hardware, cfg.consumers - 1)]
        cheaper = sorted((k for k in o.tables if prices[k] < prices[cfg.hardware]), key=lambda k: -prices[k])
        if cheaper:
            kinds.append((cheaper[0], min(max_consumers, max(1, math.ceil(now / prices[cheaper[0]]) - 1))))
        out += [(o.id, kind, b, most) for kind, most in kinds if most >= 1 for b in batches]
    return out


def _fewest_feasible(config: dict[str, StageConfig], family: tuple[str, str, int, int],
                     meets: Callable[[dict[str, StageConfig]], SimResult | None], hint: int | None = None
                     ) -> tuple[dict[str, StageConfig], SimResult] | None:
    """The fewest consumers in ``family`` that meet the SLO (latency falls as consumers grow): galloping
    out from ``hint`` (this family's answer in the previous round: one stage changed since, so the answer
    moved little), then bisecting; plain bisection of [1, most] without a hint. The probes depend only on
    the answers, so the bounds answering some of them change nothing but the time taken."""
    sid, kind, batch, most = family
    results: dict[int, SimResult | None] = {}

    def feasible(c: int) -> bool:
        if c not in results:
            results[c] = meets({**config, sid: StageConfig(kind, batch, c)})
        return results[c] is not None

    # lo: the fewest not known to fail; hi: the fewest known to meet the SLO (most + 1: none known)
    lo, hi = 1, most + 1
    if hint is not None:
        h = min(max(hint, 1), most)
        step = 1
        if feasible(h):
            hi = h
            while hi - step >= 1 and feasible(hi - step):
                hi, step = hi - step, step * 2
            lo = max(1, hi - step + 1)
        else:
            lo = h + 1
            while lo + step - 1 <= most and not feasible(lo + step - 1):
                lo, step = lo + step, step * 2
            hi = min(most + 1, lo + step - 1)
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid + 1
    if hi > most or not feasible(hi):
        return None
    found = results[hi]
    assert found is not None  # noqa: S101 - feasible(hi) holds
    return {**config, sid: StageConfig(kind, batch, hi)}, found


def make_plan(topology: Topology, arrivals: np.ndarray, slo_ms: float, *, hop_ms: float,
              overhead_ms: float = 0.0, prices: dict[str, float] | None = None, headroom: float = 2.0,
              seed: int = 0, log: Callable[[str], None] | None = None,
              counts: dict[str, int] | None = None) -> Plan:
    """Plan ``topology`` for the trace ``arrivals`` and the end-to-end p99 objective ``slo_ms``, with
    ``hop_ms`` per Kafka hop and ``overhead_ms`` per batch besides the device (both measured on the target)."""
    prices = prices or default_prices()
    options = priced_options(topology, prices)
    config, result = search(options, arrivals, slo_ms / 1000, prices=prices, hop_s=hop_ms / 1000,
                            overhead_s=overhead_ms / 1000, seed=seed, min_partitions=topology.spec.partitions,
                            headroom=headroom, log=log, counts=counts)
    return build_plan(topology, options, config, result, arrivals, slo_ms, hop_ms=hop_ms, overhead_ms=overhead_ms,
                      prices=prices, headroom=headroom)


def default_prices() -> dict[str, float]:
    return {k: h.price_per_hour for k, h in hw.HARDWARE.items()}


def priced_options(topology: Topology, prices: dict[str, float]) -> list[StageOptions]:
    """:func:`stage_options` on the priced hardware kinds only (a node on none of them is refused)."""
    options = stage_options(topology)
    for o in options:
        o.tables = {k: t for k, t in o.tables.items() if k in prices}
        if not o.tables:
            raise FlowserveError(f"node '{o.id}' runs on none of the hardware kinds priced ({', '.join(prices)})")
    return options


def build_plan(topology: Topology, options: Sequence[StageOptions], config: dict[str, StageConfig],
               result: SimResult, arrivals: np.ndarray, slo_ms: float, *, hop_ms: float, overhead_ms: float,
               prices: dict[str, float], headroom: float, fuse: dict[str, list[str]] | None = None,
               fusion: dict[str, Any] | None = None) -> Plan:
    """The plan of a configuration the search found (``options``: the stages it planned, chains fused)."""
    partitions = partitions_for(config, topology.spec.partitions, headroom)
    predicted = {"p50_ms": result.percentile(50) * 1000, "p99_ms": result.percentile(99) * 1000,
                 "attainment": result.attainment(slo_ms / 1000), "cost_per_hour": cost(config, prices),
                 "utilisation": {k: round(s.utilisation, 3) for k, s in result.stages.items()},
                 "stage_p99_ms": stage_p99_ms(options, config, result, overhead_ms)}
    # InferLine starts the envelope's windows at the system's service time: here the slowest stage's batch
    service = max(batch_time(o.tables[config[o.id].hardware], config[o.id].max_batch) for o in options)
    return Plan(topology.name, slo_ms, partitions, hop_ms, config, predicted, overhead_ms,
                planned_envelope(arrivals, service + overhead_ms / 1000), dict(fuse or {}), dict(fusion or {}))


def stage_p99_ms(options: Sequence[StageOptions], config: dict[str, StageConfig], result: SimResult,
                 overhead_ms: float) -> dict[str, float]:
    """Per stage, what a request spent there at the simulated p99: its wait for a consumer plus a batch's
    time and overhead. The tuner splits half the SLO in these proportions
    (:func:`flowserve.tuning.targets.targets_from_plan`)."""
    return {o.id: round((result.stages[o.id].p99_wait_s
                         + batch_time(o.tables[config[o.id].hardware], config[o.id].max_batch)) * 1000
                        + overhead_ms, 3)
            for o in options if o.id in result.stages}


def planned_envelope(arrivals: np.ndarray, shortest_s: float) -> list[tuple[float, int]]:
    """(window, most arrivals in it) for windows doubling from ``shortest_s`` up to half the trace (a
    window as long as the trace says nothing about bursts) and at most 60 s."""
    a = np.sort(np.asarray(arrivals, dtype=float))
    span = float(a[-1] - a[0]) if a.size > 1 else 0.0
    longest = min(curves.MAX_WINDOW_S, span / 2)
    if longest <= shortest_s:
        return []
    return [(round(w, 6), curves.max_arrivals(a, w)) for w in curves.windows(max(shortest_s, 0.01), longest)]


def service_curves(options: Sequence[StageOptions], plan: Plan) -> dict[str, curves.RateLatency]:
    """Each planned stage's rate-latency service curve: its consumers serving full batches of its planned
    size at the hardware's batch time plus the plan's per-batch overhead (filling a batch is paid as part
    of the queueing the envelope bounds)."""
    out: dict[str, curves.RateLatency] = {}
    for o in options:
        cfg = plan.stages.get(o.id)
        if cfg is not None:
            seconds = batch_time(o.tables[cfg.hardware], cfg.max_batch) + plan.overhead_ms / 1000
            out[o.id] = curves.service_curve(cfg.consumers, cfg.max_batch, seconds)
    return out
