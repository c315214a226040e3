"""The planner (``flowserve plan``): the cheapest per-stage configuration whose simulated p99 meets the SLO.

InferLine's low-frequency planner. Each stage has options: the hardware kinds it can run on (from its
component's declared latency table, or the topology's measured profile for a CPU stage), a max batch and
a number of consumers. The search:

1. **feasible start**: every stage at batch 1, one consumer, on its fastest hardware; while the
   simulated p99 misses the SLO, add a consumer to the busiest stage;
2. **greedy cost reduction**: try, for every stage, one cheaper hardware kind (with as many consumers as
   keep it cheaper) and one consumer fewer, each with the stage's batch as it is or doubled up to 64;
   take the cheapest candidate whose simulated p99 stays within the SLO; repeat until none is.

The plan file gives, per stage, the hardware kind, max batch and consumers, plus the topology's partition
count: the most consumers any stage has, times ``headroom``, so that the tuner can add consumers without
adding partitions. ``flowserve run --plan`` and ``flowserve worker --plan`` apply it (:func:`apply_plan`).
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

from flowserve.errors import FlowserveError
from flowserve.runtime import hardware as hw
from flowserve.runtime.profiles import load_profiles, profile_path
from flowserve.topology.graph import Topology, compile_spec
from flowserve.topology.spec import BatchingSpec
from flowserve.tuning import curves
from flowserve.tuning.documents import read_document
from flowserve.tuning.simulate import SimResult, SimStage, batch_time, simulate

PLAN_FORMAT = "flowserve-plan/1"
#: A stage with neither a declared table nor a profile costs this (builtin plumbing such as Identity).
NEGLIGIBLE_S = 5e-5
MAX_BATCH = 64
MAX_CONSUMERS = 32


@dataclass(frozen=True)
class StageConfig:
    hardware: str
    max_batch: int
    consumers: int


@dataclass
class StageOptions:
    """A node as the planner sees it: its wiring and a latency table per hardware kind it runs on."""

    id: str
    tables: dict[str, dict[int, float]]
    inputs: list[tuple[str | None, str]]
    join: str = "inner"
    fractions: dict[str, float] = field(default_factory=dict)
    output: bool = False


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

    def to_json(self) -> dict[str, Any]:
        return {"format": PLAN_FORMAT, "topology": self.topology, "slo_ms": self.slo_ms,
                "partitions": self.partitions, "hop_ms": self.hop_ms, "overhead_ms": self.overhead_ms,
                "stages": {k: asdict(v) for k, v in self.stages.items()}, "predicted": self.predicted,
                "envelope": [[w, n] for w, n in self.envelope]}

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
    return Plan(doc["topology"], float(doc["slo_ms"]), int(doc["partitions"]), float(doc["hop_ms"]), stages,
                dict(doc.get("predicted") or {}), float(doc.get("overhead_ms", 0.0)),
                [(float(w), int(n)) for w, n in doc.get("envelope") or []])


# -- from a topology -------------------------------------------------------------------------------

def stage_options(topology: Topology) -> list[StageOptions]:
    """Each node's options: declared tables per hardware kind, else the measured profile (as ``cpu``)."""
    profiles = load_profiles(profile_path(topology.source)) if topology.source.endswith((".yaml", ".yml")) else {}
    outputs = {src.node for src in topology.outputs.values()}
    options = []
    for node_id, node in topology.nodes.items():
        tables = {kind: t for kind in hw.HARDWARE if (t := node.component.latency_table(kind))}
        if not tables:
            entry = profiles.get(node_id, {})
            measured = {int(k): float(v) for k, v in (entry.get("p50_s") or {}).items()}
            tables = {"cpu": measured or {1: NEGLIGIBLE_S}}
        inputs = [(src.node, src.tensor) for src in node.sources]
        options.append(StageOptions(node_id, tables, inputs, node.join.type, node.component.route_fractions(),
                                    node_id in outputs))
    return options


def apply_plan(topology: Topology, plan: Plan) -> Topology:
    """The topology with the plan's partitions, and per node its consumers, max batch and hardware."""
    if plan.topology != topology.name:
        raise FlowserveError(f"the plan is for topology '{plan.topology}', not '{topology.name}'")
    nodes = dict(topology.spec.nodes)
    for node_id, cfg in plan.stages.items():
        if node_id not in nodes:
            raise FlowserveError(f"the plan names node '{node_id}', which topology '{topology.name}' lacks")
        node = nodes[node_id]
        params = dict(node.params)
        param = topology.nodes[node_id].component.hardware_param
        if param is not None:
            params[param] = cfg.hardware
        nodes[node_id] = node.model_copy(update={
            "replicas": cfg.consumers, "max_batch": cfg.max_batch, "params": params,
            "batching": BatchingSpec(policy="lag")})
    return compile_spec(topology.spec.model_copy(update={"nodes": nodes, "partitions": plan.partitions}),
                        topology.source)


# -- the search ------------------------------------------------------------------------------------

Evaluate = Callable[[dict[str, StageConfig]], SimResult]


def sim_stages(options: Sequence[StageOptions], config: dict[str, StageConfig]) -> list[SimStage]:
    return [SimStage(o.id, o.tables[config[o.id].hardware], o.inputs, config[o.id].consumers,
                     config[o.id].max_batch, o.join, o.fractions, o.output) for o in options]


def cost(config: dict[str, StageConfig], prices: dict[str, float]) -> float:
    return sum(c.consumers * prices[c.hardware] for c in config.values())


def partitions_for(config: dict[str, StageConfig], minimum: int = 1, headroom: float = 2.0) -> int:
    """The topology's partitions under ``config``: the most consumers of any stage times ``headroom``."""
    return max(minimum, math.ceil(max(c.consumers for c in config.values()) * headroom))


def search(options: Sequence[StageOptions], arrivals: np.ndarray, slo_s: float, *, prices: dict[str, float],
           hop_s: float, overhead_s: float = 0.0, seed: int = 0, jitter: float = 0.05, percentile: float = 99.0,
           min_partitions: int = 1, headroom: float = 2.0, log: Callable[[str], None] | None = None
           ) -> tuple[dict[str, StageConfig], SimResult]:
    """InferLine's planner search (see the module docstring); the cheapest feasible config found."""
    cache: dict[tuple[tuple[str, str, int, int], ...], SimResult] = {}

    def run(config: dict[str, StageConfig]) -> SimResult:
        key = tuple(sorted((k, v.hardware, v.max_batch, v.consumers) for k, v in config.items()))
        if key not in cache:
            cache[key] = simulate(sim_stages(options, config), arrivals,
                                  partitions=partitions_for(config, min_partitions, headroom),
                                  hop_s=hop_s, jitter=jitter, seed=seed, overhead_s=overhead_s)
        return cache[key]

    def ok(result: SimResult) -> bool:
        return result.percentile(percentile) <= slo_s

    def batch_one(o: StageOptions, kind: str) -> float:
        return o.tables[kind][min(o.tables[kind])]

    fastest = {o.id: min(o.tables, key=functools.partial(batch_one, o)) for o in options}
    config = {o.id: StageConfig(fastest[o.id], 1, 1) for o in options}
    result = run(config)
    while not ok(result):
        busiest = max((s for s in options if config[s.id].consumers < MAX_CONSUMERS),
                      key=lambda s: result.stages[s.id].utilisation + result.stages[s.id].mean_wait_s, default=None)
        if busiest is None:
            raise FlowserveError(f"no configuration meets p{percentile:g} <= {slo_s * 1000:.0f} ms even with "
                                 f"{MAX_CONSUMERS} consumers per stage on the fastest hardware; relax the SLO")
        config = {**config, busiest.id: replace(config[busiest.id], consumers=config[busiest.id].consumers + 1)}
        result = run(config)
        if log:
            log(f"feasible start: +1 consumer on {busiest.id} -> p99 {result.percentile(percentile) * 1000:.1f} ms")
    while True:
        current = cost(config, prices)
        best: tuple[float, float, dict[str, StageConfig], SimResult] | None = None
        for o in options:
            for cand in _candidates(o, config[o.id], prices):
                trial = {**config, o.id: cand}
                c = cost(trial, prices)
                if c >= current - 1e-12 or (best is not None and c > best[0]):
                    continue
                r = run(trial)
                if ok(r) and (best is None or (c, r.percentile(percentile)) < (best[0], best[1])):
                    best = (c, r.percentile(percentile), trial, r)
        if best is None:
            return config, result
        config, result = best[2], best[3]
        if log:
            log(f"cheaper: ${best[0]:.3f}/h, p99 {best[1] * 1000:.1f} ms")


def _candidates(o: StageOptions, cfg: StageConfig, prices: dict[str, float]) -> list[StageConfig]:
    """Cheaper variants of one stage's config, each with its batch as it is or doubled up to MAX_BATCH."""
    batches = [cfg.max_batch]
    while batches[-1] < MAX_BATCH:
        batches.append(min(MAX_BATCH, batches[-1] * 2))
    out = []
    if cfg.consumers > 1:
        out += [StageConfig(cfg.hardware, b, cfg.consumers - 1) for b in batches]
    now = cfg.consumers * prices[cfg.hardware]
    cheaper = sorted((k for k in o.tables if prices[k] < prices[cfg.hardware]), key=lambda k: -prices[k])
    if cheaper:
        kind = cheaper[0]
        most = max(1, math.ceil(now / prices[kind]) - 1)
        out += [StageConfig(kind, b, n) for n in range(1, min(most, MAX_CONSUMERS) + 1) for b in batches]
    return out


def make_plan(topology: Topology, arrivals: np.ndarray, slo_ms: float, *, hop_ms: float,
              overhead_ms: float = 0.0, prices: dict[str, float] | None = None, headroom: float = 2.0,
              seed: int = 0, log: Callable[[str], None] | None = None) -> Plan:
    """Plan ``topology`` for the trace ``arrivals`` and the end-to-end p99 objective ``slo_ms``, with
    ``hop_ms`` per Kafka hop and ``overhead_ms`` per batch besides the device (both measured on the target)."""
    prices = prices or {k: h.price_per_hour for k, h in hw.HARDWARE.items()}
    options = stage_options(topology)
    for o in options:
        o.tables = {k: t for k, t in o.tables.items() if k in prices}
        if not o.tables:
            raise FlowserveError(f"node '{o.id}' runs on none of the hardware kinds priced ({', '.join(prices)})")
    config, result = search(options, arrivals, slo_ms / 1000, prices=prices, hop_s=hop_ms / 1000,
                            overhead_s=overhead_ms / 1000, seed=seed, min_partitions=topology.spec.partitions,
                            headroom=headroom, log=log)
    partitions = partitions_for(config, topology.spec.partitions, headroom)
    predicted = {"p50_ms": result.percentile(50) * 1000, "p99_ms": result.percentile(99) * 1000,
                 "attainment": result.attainment(slo_ms / 1000), "cost_per_hour": cost(config, prices),
                 "utilisation": {k: round(s.utilisation, 3) for k, s in result.stages.items()}}
    # InferLine starts the envelope's windows at the system's service time: here the slowest stage's batch
    service = max(batch_time(o.tables[config[o.id].hardware], config[o.id].max_batch) for o in options)
    return Plan(topology.name, slo_ms, partitions, hop_ms, config, predicted, overhead_ms,
                planned_envelope(arrivals, service + overhead_ms / 1000))


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
