"""The planner's and the simulator's speed: ``flowserve bench tuner --part planner``.

Per pipeline (InferLine's four shapes, emulated stages, the SLOs of ``flowserve bench tuner``) and rate
(2,000 and 10,000 req/s), a seeded 60-s Poisson trace is planned with ``flowserve plan``'s defaults (hop
5 ms, per-batch overhead 5 ms, headroom 2, the built-in hardware prices): wall and CPU seconds, the plan
(per stage hardware, max batch, consumers; cost per hour), how many configurations were simulated and how
many the network-calculus bounds ruled out. Then the simulator alone: a 4-stage pipeline (video
monitoring: detection, two classifiers joined) planned for 10,000 req/s, run over a trace of at least a
million requests; requests simulated per wall second.

Targets: every pipeline planned at 2,000 req/s in <= 30 s and at 10,000 req/s in <= 120 s of wall time,
and the simulator >= 1 million requests per 10 s. Wall time on a shared machine includes what others
take; CPU seconds are reported beside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from flowserve.errors import FlowserveError
from flowserve.runtime import hardware as hw
from flowserve.topology.graph import load_topology
from flowserve.tuning import simulate as sim
from flowserve.tuning.plan import Plan, make_plan, stage_options
from flowserve.tuning.stages import sim_stages
from flowserve.tuning.traces import generate
from flowserve_bench import graphs

#: pipeline -> p99 SLO (ms), as flowserve bench tuner plans them
PIPELINES = {"image-processing": 250.0, "cascade-emulated": 250.0, "social-media": 400.0,
             "video-monitoring": 300.0}
RATES = (2000.0, 10000.0)
LIMITS_S = {2000.0: 30.0, 10000.0: 120.0}
SIM_PIPELINE, SIM_RATE, SIM_REQUESTS = "video-monitoring", 10000.0, 1_000_000


def planner_row(pipeline: str, slo_ms: float, rate: float, *, seconds: float = 60.0, seed: int = 0,
                hop_ms: float = 5.0, overhead_ms: float = 5.0) -> dict[str, Any]:
    """Plan one pipeline for a Poisson trace at ``rate``: the times, the plan and the search's counts."""
    topology = load_topology(graphs.EXAMPLES / f"{pipeline}.yaml")
    trace = generate("poisson", rate=rate, seconds=seconds, seed=seed)
    counts: dict[str, int] = {}
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        plan = make_plan(topology, trace.arrivals, slo_ms, hop_ms=hop_ms, overhead_ms=overhead_ms, counts=counts)
    except FlowserveError as exc:
        return {"pipeline": pipeline, "rate": rate, "requests": int(trace.arrivals.size), "error": str(exc),
                "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, **counts}
    return {"pipeline": pipeline, "rate": rate, "requests": int(trace.arrivals.size), "slo_ms": slo_ms,
            "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, **counts,
            "stages": {k: [v.hardware, v.max_batch, v.consumers] for k, v in plan.stages.items()},
            "cost_per_hour": plan.predicted["cost_per_hour"], "p99_ms": plan.predicted["p99_ms"],
            "partitions": plan.partitions}


def simulator_row(plan: Plan | None = None, *, requests: int = SIM_REQUESTS, seed: int = 0) -> dict[str, Any]:
    """Requests simulated per wall second: the 4-stage pipeline under ``plan`` (default: planned for
    SIM_RATE on a 10-s sample) over a Poisson trace of at least ``requests`` at SIM_RATE."""
    topology = load_topology(graphs.EXAMPLES / f"{SIM_PIPELINE}.yaml")
    slo = PIPELINES[SIM_PIPELINE]
    if plan is None:
        plan = make_plan(topology, generate("poisson", rate=SIM_RATE, seconds=10, seed=seed).arrivals, slo,
                         hop_ms=5.0, overhead_ms=5.0)
    stages = sim_stages(stage_options(topology), plan.stages)
    trace = generate("poisson", rate=SIM_RATE, seconds=requests / SIM_RATE * 1.01, seed=seed + 1)
    sim.simulate(stages, trace.arrivals[:1000], partitions=plan.partitions)  # compile (or load) the kernel
    wall, cpu = time.perf_counter(), time.process_time()
    result = sim.simulate(stages, trace.arrivals, partitions=plan.partitions, hop_s=0.005, overhead_s=0.005,
                          seed=seed)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    n = int(trace.arrivals.size)
    return {"pipeline": SIM_PIPELINE, "stages": len(stages), "requests": n, "wall_s": wall, "cpu_s": cpu,
            "requests_per_s": n / wall, "compiled": sim.compiled(), "p99_ms": result.percentile(99) * 1000,
            "consumers": {k: v.consumers for k, v in plan.stages.items()}}


def planner_targets(rows: Sequence[dict[str, Any]], simulator: dict[str, Any]) -> dict[str, bool]:
    """Each rate's target holds when every pipeline was planned within its limit (a failed plan fails it)."""
    def within(rate: float) -> bool:
        mine = [r for r in rows if r["rate"] == rate]
        return bool(mine) and all("error" not in r and r["wall_s"] <= LIMITS_S[rate] for r in mine)

    return {"plan_2000rps_le_30s": within(2000.0), "plan_10000rps_le_120s": within(10000.0),
            "simulator_1m_requests_le_10s": simulator["requests"] >= SIM_REQUESTS
            and simulator["requests"] / simulator["wall_s"] * 10 >= SIM_REQUESTS}


def planner_bench(pipelines: Sequence[str] = tuple(PIPELINES), rates: Sequence[float] = RATES, *,
                  seconds: float = 60.0, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The planner section: a row per pipeline x rate, the simulator's throughput and the targets."""
    rows = []
    for rate in rates:
        for name in pipelines:
            row = planner_row(name, PIPELINES[name], rate, seconds=seconds)
            rows.append(row)
            if log:
                log(f"plan {name} @ {rate:g} req/s: {row['wall_s']:.1f} s wall, {row['cpu_s']:.1f} s CPU, "
                    f"{row.get('simulated', 0)} simulated, {row.get('pruned', 0)} ruled out, "
                    + (row["error"] if "error" in row else f"${row['cost_per_hour']:.2f}/h {row['stages']}"))
    simulator = simulator_row()
    if log:
        log(f"simulator: {simulator['requests']} requests through {simulator['stages']} stages in "
            f"{simulator['wall_s']:.2f} s ({simulator['requests_per_s']:,.0f} req/s)")
    prices = {k: h.price_per_hour for k, h in hw.HARDWARE.items()}
    return {"workload": "tuner", "part": "planner", "trace": {"kind": "poisson", "seconds": seconds},
            "hop_ms": 5.0, "overhead_ms": 5.0, "prices": prices, "planner": rows, "simulator": simulator,
            "targets": planner_targets(rows, simulator)}
