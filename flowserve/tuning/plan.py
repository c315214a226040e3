"""The planner (``flowserve plan``): a plan file from a topology and a trace.

A plan gives, per stage, the hardware kind, max batch and consumers the search found
(:mod:`flowserve.tuning.search`: the cheapest configuration whose simulated p99 meets the SLO), plus the
topology's partition count: the most consumers any stage has, times ``headroom``, so that the tuner can add
consumers without adding partitions. Each stage's options come from its component's declared latency
tables, or the topology's measured profile for a CPU stage. ``flowserve run --plan`` and ``flowserve worker
--plan`` apply it (:func:`apply_plan`). ``flowserve plan`` also chooses which chains of stages to fuse
(:mod:`flowserve.tuning.fusion_plan`): a plan names them under ``fuse`` (a stage of the plan is then a
chain) and says why under ``fusion``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
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
from flowserve.tuning.search import MAX_BATCH, search
from flowserve.tuning.simulate import SimResult, batch_time
from flowserve.tuning.stages import StageConfig, StageOptions, cost, partitions_for

PLAN_FORMAT = "flowserve-plan/1"
#: A stage with neither a declared table nor a profile costs this (builtin plumbing such as Identity).
NEGLIGIBLE_S = 5e-5


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
