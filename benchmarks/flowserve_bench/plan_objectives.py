"""The planner's objectives side by side: ``flowserve bench plan-objectives``.

Per emulated pipeline (InferLine's four shapes, the SLOs of ``flowserve bench tuner``) and rate, a seeded
Poisson trace is planned three times with ``flowserve plan --no-fuse``'s search and defaults (hop 5 ms,
per-batch overhead 5 ms, headroom 2): minimising dollars (``cost``), joules (``energy``: each hardware
kind at its active watts, :data:`flowserve.energy.POWER`) and grams CO2e (``carbon``: the same joules at
one carbon intensity, so the same ranking unless kinds sit on different grids). Each plan is then run in
the simulator over ``repeats`` fresh traces of the same process (other seeds); per run its dollars per
hour, joules per request (each stage's consumers at idle watts plus the active share at the run's
utilisation, :func:`flowserve.tuning.objectives.account_energy`), grams CO2e per request and p99.

Target ``energy_plan_le_0_8x_cost_plan_joules_somewhere``: for at least one pipeline and rate, the energy
plan's joules per request are at most 0.8x the cost plan's on every fresh trace (the two plans simulated
over the same traces: the largest paired ratio, the conservative end). No broker: the planner and the
simulator only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flowserve.energy import carbon_intensity, power_watts
from flowserve.errors import FlowserveError
from flowserve.runtime import hardware as hw
from flowserve.topology.graph import load_topology
from flowserve.tuning.objectives import OBJECTIVES, account_energy, plan_for_objective
from flowserve.tuning.plan import Plan, make_plan, stage_options
from flowserve.tuning.simulate import simulate
from flowserve.tuning.stages import sim_stages
from flowserve.tuning.traces import generate
from flowserve_bench import graphs
from flowserve_bench.planner_speed import PIPELINES

RATES = (100.0, 1000.0, 3000.0)
#: the energy plan must use at most this share of the cost plan's joules per request (somewhere)
RATIO = 0.8
HOP_MS, OVERHEAD_MS = 5.0, 5.0


def runs_of(plan: Plan, topology_path: str, rate: float, seconds: float, seeds: Sequence[int],
            g_per_kwh: float) -> list[dict[str, float]]:
    """The plan simulated over fresh Poisson traces (one per seed): dollars/h, J and g per request, p99."""
    options = stage_options(load_topology(topology_path))
    dollars = {k: h.price_per_hour for k, h in hw.HARDWARE.items()}
    out = []
    for seed in seeds:
        arrivals = generate("poisson", rate=rate, seconds=seconds, seed=seed).arrivals
        result = simulate(sim_stages(options, plan.stages), arrivals, partitions=plan.partitions,
                          hop_s=plan.hop_ms / 1000, overhead_s=plan.overhead_ms / 1000, seed=seed)
        ran = Plan(plan.topology, plan.slo_ms, plan.partitions, plan.hop_ms, plan.stages,
                   {"utilisation": {k: s.utilisation for k, s in result.stages.items()}})
        p = account_energy(ran, arrivals, objective="cost", dollars=dollars, watts=power_watts(),
                           g_per_kwh=g_per_kwh).predicted
        out.append({"seed": seed, "cost_per_hour": p["cost_per_hour"], "joules_per_request": p["joules_per_request"],
                    "g_co2e_per_request": p["g_co2e_per_request"], "p99_ms": result.percentile(99) * 1000})
    return out


def objective_rows(pipeline: str, slo_ms: float, rate: float, *, seconds: float, repeats: int,
                   g_per_kwh: float) -> list[dict[str, Any]]:
    """One row per objective: the plan (stages; predicted dollars, joules, grams) and its simulated runs."""
    path = str(graphs.EXAMPLES / f"{pipeline}.yaml")
    topology = load_topology(path)
    trace = generate("poisson", rate=rate, seconds=seconds, seed=0)
    dollars = {k: h.price_per_hour for k, h in hw.HARDWARE.items()}
    # each search runs once: the cost search for every objective, and carbon's, whose prices are energy's
    # times a constant (the search compares prices only with each other), for energy's too
    searched: dict[tuple[tuple[str, float], ...], Plan] = {}

    def plan_with(prices: dict[str, float]) -> Plan:
        top = max(prices.values())
        key = tuple(sorted((k, round(v / top, 9)) for k, v in prices.items()))
        if key not in searched:
            searched[key] = make_plan(topology, trace.arrivals, slo_ms, hop_ms=HOP_MS, overhead_ms=OVERHEAD_MS,
                                      prices=prices)
        return searched[key]

    rows = []
    for objective in OBJECTIVES:
        row: dict[str, Any] = {"pipeline": pipeline, "rate": rate, "slo_ms": slo_ms, "objective": objective}
        try:
            plan = plan_for_objective(objective, plan_with, trace.arrivals, dollars=dollars, watts=power_watts(),
                                      g_per_kwh=g_per_kwh)
        except FlowserveError as exc:
            rows.append({**row, "error": str(exc)})
            continue
        p = plan.predicted
        row.update(stages={k: [v.hardware, v.max_batch, v.consumers] for k, v in plan.stages.items()},
                   cost_per_hour=p["cost_per_hour"], joules_per_request=p["joules_per_request"],
                   g_co2e_per_request=p["g_co2e_per_request"], p99_ms=p["p99_ms"],
                   searches=p.get("searches", []), chosen_search=p.get("chosen_search", 0),
                   runs=runs_of(plan, path, rate, seconds, range(1, repeats + 1), g_per_kwh))
        rows.append(row)
    return rows


def paired_ratios(energy: Mapping[str, Any], cost: Mapping[str, Any]) -> list[float]:
    """Per fresh trace (both plans were simulated over the same ones), the energy plan's joules per request
    over the cost plan's."""
    cost_by_seed = {r["seed"]: float(r["joules_per_request"]) for r in cost.get("runs", [])}
    return [float(r["joules_per_request"]) / cost_by_seed[r["seed"]] for r in energy.get("runs", [])
            if cost_by_seed.get(r["seed"])]


def comparisons(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per pipeline and rate: the energy plan's joules per request over the cost plan's, at the conservative
    (largest) end of the paired runs, predicted, and for the best plan any watt-priced search found; and the
    dollars ratio."""
    by: dict[tuple[str, float], dict[str, Mapping[str, Any]]] = {}
    for row in rows:
        by.setdefault((str(row["pipeline"]), float(row["rate"])), {})[str(row["objective"])] = row
    out = []
    for (pipeline, rate), plans in by.items():
        cost, energy = plans.get("cost"), plans.get("energy")
        entry: dict[str, Any] = {"pipeline": pipeline, "rate": rate}
        for name, row in plans.items():  # each objective's plan: dollars per hour, J and mg CO2e per request
            if "error" not in row:
                entry.update({f"{name}_usd_h": row.get("cost_per_hour"), f"{name}_j": row.get("joules_per_request"),
                              f"{name}_mg_co2e": row["g_co2e_per_request"] * 1000
                              if row.get("g_co2e_per_request") is not None else None})
        entry["conservative_ratio"] = None
        ratios = paired_ratios(energy, cost) if cost and energy and "error" not in cost and "error" not in energy \
            else []
        if not ratios or cost is None or energy is None:
            out.append(entry)
            continue
        watt_priced = [s["joules_per_request"] for s in energy.get("searches", [])[1:]]
        # the columns docs/benchmarks.md has room for first: each plan's dollars and joules, the target's
        # ratio, the carbon plan's grams
        order = ["pipeline", "rate", "cost_usd_h", "cost_j", "cost_mg_co2e", "energy_usd_h", "energy_j"]
        entry = {**{k: entry[k] for k in order if k in entry}, "conservative_ratio": max(ratios),
                 "carbon_mg_co2e": entry.get("carbon_mg_co2e"), **entry}
        entry.update(conservative_ratio=max(ratios),
                     predicted_joules_ratio=energy["joules_per_request"] / cost["joules_per_request"],
                     best_watt_priced_ratio=min(watt_priced) / cost["joules_per_request"] if watt_priced else None,
                     cost_ratio=energy["cost_per_hour"] / cost["cost_per_hour"],
                     same_plan=energy.get("stages") == cost.get("stages"))
        out.append(entry)
    return out


def objective_targets(rows: Sequence[Mapping[str, Any]]) -> dict[str, bool]:
    """The target holds when some pipeline and rate's conservative ratio is at most :data:`RATIO`."""
    ratios = [c["conservative_ratio"] for c in comparisons(rows) if c["conservative_ratio"] is not None]
    return {"energy_plan_le_0_8x_cost_plan_joules_somewhere": any(r <= RATIO for r in ratios)}


def plan_objectives_bench(pipelines: Sequence[str] = tuple(PIPELINES), rates: Sequence[float] = RATES, *,
                          seconds: float = 30.0, repeats: int = 3, g_per_kwh: float | None = None,
                          region: str | None = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every pipeline x rate x objective: the rows, the comparisons and the targets."""
    intensity = carbon_intensity(g_per_kwh, region)
    rows: list[dict[str, Any]] = []
    for rate in rates:
        for name in pipelines:
            found = objective_rows(name, PIPELINES[name], rate, seconds=seconds, repeats=repeats, g_per_kwh=intensity)
            rows += found
            if log:
                for r in found:
                    log(f"{name} @ {rate:g} req/s, {r['objective']:>6}: " + (r["error"] if "error" in r else
                        f"${r['cost_per_hour']:.3f}/h  {r['joules_per_request']:.4g} J/req  "
                        f"{r['g_co2e_per_request'] * 1000:.4g} mg CO2e/req  p99 {r['p99_ms']:.0f} ms  {r['stages']}"))
    compared = comparisons(rows)
    if log:
        for c in compared:
            if c["conservative_ratio"] is not None:
                log(f"{c['pipeline']} @ {c['rate']:g}: energy plan / cost plan joules "
                    f"{c['predicted_joules_ratio']:.3f} (conservative {c['conservative_ratio']:.3f}; the best "
                    f"watt-priced search's {c['best_watt_priced_ratio']:.3f}), dollars x{c['cost_ratio']:.3f}"
                    + (" (same plan)" if c["same_plan"] else ""))
    # the comparisons first: the one table docs/benchmarks.md shows (the plans and runs stay in the JSON)
    return {"workload": "plan-objectives", "comparisons": compared,
            "trace": {"kind": "poisson", "seconds": seconds, "repeats": repeats},
            "hop_ms": HOP_MS, "overhead_ms": OVERHEAD_MS, "g_per_kwh": intensity, "watts": power_watts(),
            "prices": {k: h.price_per_hour for k, h in hw.HARDWARE.items()}, "rows": rows,
            "targets": objective_targets(rows)}
