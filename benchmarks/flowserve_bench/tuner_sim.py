"""``flowserve bench tuner --simulated``: the tuner against KEDA, static and a clairvoyant floor, at cluster
scale in the simulated cluster (:mod:`flowserve.tuning.cluster`, contenders in
:mod:`flowserve_bench.tuner_contenders`).

Per pipeline x trace: **static** is the plan for the trace's busiest minute (``flowserve plan`` on that
slice: the cheapest configuration whose simulated p99 meets the SLO there); the adaptive contenders start
from the plan for a sample of the trace's arrival process at its mean rate (Poisson; gamma keeps its CV),
on static's partitions, as the live bench does; the **oracle** keeps static's hardware and batches and
sizes each minute, and **oracle-late** takes its counts a second into each minute, with no foresight.
Every contender pays the same start delays (``start``: ``kubernetes`` by default) and rebalance pauses,
and serves requests that carry the SLO as their deadline (``deadline``: a worker refuses at once what it
can no longer make, a miss). Cost: pod-seconds x the hardware's price. Rows: attainment within the SLO,
misses, p99, cost, actions, cost / oracle, cost / static. Targets (:func:`simulated_targets`), per pipeline x trace:
the tuner attains >= 99.5%; costs <= 1.3x the oracle; <= 0.7x static on diurnal and spike; against both
KEDA variants, higher-or-equal attainment at lower-or-equal cost, and <= 1/5 of their misses on spike
and bursty.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from flowserve.runtime import hardware as hw
from flowserve.topology.graph import load_topology
from flowserve.tuning.cluster import PAUSE_S, START_S
from flowserve.tuning.plan import Plan, make_plan, planned_envelope, stage_options
from flowserve.tuning.simulate import batch_time
from flowserve.tuning.stages import StageConfig
from flowserve.tuning.traces import SCALE_KINDS, Trace, at_scale, generate, load_trace
from flowserve_bench import graphs
from flowserve_bench.common import console
from flowserve_bench.tuner_contenders import (
    CONTENDERS,
    LATE_S,
    ORACLE_PERCENTILE,
    Outcome,
    SimSettings,
    oracle_counts,
    run_keda,
    run_oracle,
    run_static,
    run_tuner,
)

PIPELINES = {"image-processing": 250.0, "cascade-emulated": 250.0, "social-media": 400.0,
             "video-monitoring": 300.0}
#: the default run: the four pipelines x the four traces, an hour each at a 2,000 req/s peak (~40 minutes here;
#: ``--pipelines image-processing`` for one, ~10)
DEFAULT_PIPELINES = tuple(PIPELINES)
TUNER = "tuner"


def _busiest(trace: Trace, window: float = 60.0) -> np.ndarray:
    """The arrivals of the trace's busiest ``window`` seconds (starting on a whole second), from 0."""
    a = trace.arrivals
    starts = np.arange(0.0, max(1.0, trace.seconds - window + 1), 1.0)
    counts = np.searchsorted(a, starts + window) - np.searchsorted(a, starts)
    t0 = float(starts[int(np.argmax(counts))])
    return a[(a >= t0) & (a < t0 + window)] - t0


def _mean_sample(trace: Trace, seconds: float = 60.0, seed: int = 6) -> np.ndarray:
    rate = max(trace.rate, 1.0)
    if trace.params.get("kind") == "gamma" or trace.kind == "gamma":
        return generate("gamma", rate=rate, cv=float(trace.params.get("cv", 4.0)), seconds=seconds, seed=seed).arrivals
    return generate("poisson", rate=rate, seconds=seconds, seed=seed).arrivals


def plans(pipeline: str, trace: Trace, slo_ms: float, cfg: SimSettings) -> tuple[Plan, Plan]:
    """(static's plan: the busiest minute; the adaptive start: static's hardware, batches and partitions
    with the fewest consumers meeting the SLO on a mean-rate sample, and that sample's envelope)."""
    topology = load_topology(graphs.EXAMPLES / f"{pipeline}.yaml")
    # the planner takes one figure each: the mean of what the cluster draws from
    hop_ms, overhead_ms = float(np.mean(cfg.hop_s)) * 1000, float(np.mean(cfg.overhead_s)) * 1000
    peak = make_plan(topology, _busiest(trace), slo_ms, hop_ms=hop_ms, overhead_ms=overhead_ms, seed=cfg.seed,
                     headroom=cfg.headroom)
    sample = _mean_sample(trace)
    # every contender runs static's hardware and batches, so they differ in consumers alone (a plan for the
    # mean rate picks smaller batches, which serve fewer requests per consumer at the peak)
    options = stage_options(topology)
    counts = oracle_counts(options, sample, peak, cfg, 60.0)[0]
    stages = {k: StageConfig(c.hardware, c.max_batch, counts[k]) for k, c in peak.stages.items()}
    fastest = min(batch_time(o.tables[stages[o.id].hardware], stages[o.id].max_batch) for o in options)
    # the tuner splits the SLO as the peak plan's simulation found each stage's p99 (its stage_p99_ms)
    start = Plan(peak.topology, slo_ms, peak.partitions, hop_ms, stages,
                 {"stage_p99_ms": peak.predicted["stage_p99_ms"]}, overhead_ms=overhead_ms,
                 envelope=planned_envelope(sample, fastest + overhead_ms / 1000))
    return peak, start


def run_contender(name: str, pipeline: str, trace: Trace, peak: Plan, start: Plan, cfg: SimSettings,
                  sized: dict[str, list[dict[str, int]]] | None = None) -> Outcome:
    """One contender's run; ``sized`` keeps the oracles' per-window counts between the two oracles of a
    pipeline x trace (the costliest part of either)."""
    topology = load_topology(graphs.EXAMPLES / f"{pipeline}.yaml")
    options = stage_options(topology)
    a, s = trace.arrivals, trace.seconds
    if name == "static":
        return run_static(options, a, peak, cfg, s)
    if name.startswith("oracle"):
        sized = {} if sized is None else sized
        if "counts" not in sized:
            sized["counts"] = oracle_counts(options, a, peak, cfg, s, ORACLE_PERCENTILE)
        late = LATE_S if name == "oracle-late" else None
        return run_oracle(options, a, peak, cfg, s, counts=sized["counts"], late_s=late)
    if name.startswith("keda"):
        return run_keda(topology, options, a, start, cfg, s, preset=name)
    return run_tuner(options, a, start, cfg, s, rule=name.removeprefix("tuner-") if "-" in name else "profile")


def row(pipeline: str, trace: str, contender: str, out: Outcome, prices: dict[str, float], slo_s: float
        ) -> dict[str, Any]:
    """The figures of one run (cost: pod-seconds x each stage's price per hour)."""
    lat = out.latency_s
    ok = lat <= slo_s
    return {"pipeline": pipeline, "trace": trace, "contender": contender, "requests": int(lat.size),
            "attainment": float(np.mean(ok)) if lat.size else 1.0, "misses": int(lat.size - np.count_nonzero(ok)),
            "p99_ms": float(np.percentile(lat, 99, method="higher")) * 1000 if lat.size else 0.0,
            "cost_dollars": sum(out.pod_seconds[k] * prices[k] for k in out.pod_seconds) / 3600,
            "pod_hours": sum(out.pod_seconds.values()) / 3600, "actions": out.actions,
            "peak_consumers": {k: max(c for _, c in v) for k, v in out.timeline.items()}}


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row's cost / oracle and cost / static, within its pipeline x trace."""
    by = {(r["pipeline"], r["trace"], r["contender"]): r for r in rows}
    for r in rows:
        for ref in ("oracle", "static"):
            base = by.get((r["pipeline"], r["trace"], ref))
            r[f"cost_vs_{ref}"] = r["cost_dollars"] / base["cost_dollars"] if base and base["cost_dollars"] else None
    return rows


def simulated_targets(rows: Sequence[dict[str, Any]], tuner: str = TUNER) -> dict[str, bool]:
    """The issue's targets, each decided per pipeline x trace (a contender missing from a pair fails it)."""
    by = {(r["pipeline"], r["trace"], r["contender"]): r for r in rows}
    pairs = sorted({(r["pipeline"], r["trace"]) for r in rows})

    def every(check: Callable[[str, str], bool], traces: Sequence[str] | None = None) -> bool:
        chosen = [(p, t) for p, t in pairs if traces is None or t in traces]
        return bool(chosen) and all(check(p, t) for p, t in chosen)

    def get(p: str, t: str, c: str) -> dict[str, Any] | None:
        return by.get((p, t, c))

    def attains(p: str, t: str) -> bool:
        r = get(p, t, tuner)
        return r is not None and r["attainment"] >= 0.995

    def ratio(ref: str, limit: float) -> Callable[[str, str], bool]:
        def check(p: str, t: str) -> bool:
            r, base = get(p, t, tuner), get(p, t, ref)
            return r is not None and base is not None and r["cost_dollars"] <= limit * base["cost_dollars"]
        return check

    def beats_keda(p: str, t: str) -> bool:
        r = get(p, t, tuner)
        kedas = [get(p, t, k) for k in ("keda", "keda-tuned")]
        return r is not None and all(k is not None and r["attainment"] >= k["attainment"]
                                     and r["cost_dollars"] <= k["cost_dollars"] for k in kedas)

    def fifth_of_keda(p: str, t: str) -> bool:
        r = get(p, t, tuner)
        kedas = [get(p, t, k) for k in ("keda", "keda-tuned")]
        return r is not None and all(k is not None and r["misses"] <= k["misses"] / 5 for k in kedas)

    return {"tuner_attainment_ge_99.5pct": every(attains),
            "tuner_cost_le_1.3x_oracle": every(ratio("oracle", 1.3)),
            "tuner_cost_le_0.7x_static_on_diurnal_and_spike": every(ratio("static", 0.7), ("diurnal", "spike")),
            "tuner_attainment_ge_and_cost_le_keda": every(beats_keda),
            "tuner_misses_le_fifth_of_keda_on_spike_and_bursty": every(fifth_of_keda, ("spike", "bursty"))}


def simulated_bench(pipelines: Sequence[str] = DEFAULT_PIPELINES, traces: Sequence[str] = SCALE_KINDS,
                    trace_file: str | Path | None = None, *, peak: float = 2000.0, seconds: float = 3600.0,
                    start: str = "kubernetes", contenders: Sequence[str] = CONTENDERS, seed: int = 0,
                    deadline: bool = True, pause: bool = True, log: Callable[[str], None] | None = print
                    ) -> dict[str, Any]:
    """Pipelines x traces x contenders in the simulated cluster; ``trace_file`` adds a trace read from a
    file (``flowserve trace record`` output, or a user's)."""
    made = {name: at_scale(name, peak=peak, seconds=seconds, seed=seed + i) for i, name in enumerate(traces)}
    if trace_file is not None:
        made[Path(trace_file).stem] = load_trace(trace_file)
    pause_s = PAUSE_S if pause else np.zeros(1)  # none: the bound a cooperative rebalance approaches
    prices_hw = {k: h.price_per_hour for k, h in hw.HARDWARE.items()}
    rows, plans_out, timelines = [], [], []
    # the arrival rate per minute of each trace, drawn by --plot against the contenders' consumers
    rates = {name: (np.bincount((t.arrivals // 60).astype(int)) / 60).round(1).tolist() for name, t in made.items()}
    wall = time.perf_counter()
    for pipeline in pipelines:
        slo_ms = PIPELINES[pipeline]
        cfg = SimSettings(slo_s=slo_ms / 1000, start_s=START_S[start], pause_s=pause_s, seed=seed,
                          deadline_s=slo_ms / 1000 if deadline else None)
        for tname, trace in made.items():
            peak_plan, start_plan = plans(pipeline, trace, slo_ms, cfg)
            plans_out.append({"pipeline": pipeline, "trace": tname, "requests": int(trace.arrivals.size),
                              "seconds": trace.seconds, "peak_1s": int(_busiest(trace, 1.0).size),
                              "static": {k: [v.hardware, v.max_batch, v.consumers]
                                         for k, v in peak_plan.stages.items()},
                              "start": {k: [v.hardware, v.max_batch, v.consumers]
                                        for k, v in start_plan.stages.items()},
                              "partitions": start_plan.partitions})
            prices = {k: prices_hw[v.hardware] for k, v in peak_plan.stages.items()}
            sized: dict[str, list[dict[str, int]]] = {}
            for name in contenders:
                t0 = time.perf_counter()
                out = run_contender(name, pipeline, trace, peak_plan, start_plan, cfg, sized)
                r = row(pipeline, tname, name, out, prices, cfg.slo_s)
                r["wall_s"] = time.perf_counter() - t0
                rows.append(r)
                timelines.append({"pipeline": pipeline, "trace": tname, "contender": name,
                                  "consumers": total_consumers(out.timeline)})
                if log:
                    log(f"{pipeline} / {tname} / {name}: attainment {r['attainment'] * 100:.3f}% misses {r['misses']} "
                        f"p99 {r['p99_ms']:.0f} ms ${r['cost_dollars']:.2f} actions {r['actions']} "
                        f"({r['wall_s']:.1f} s)")
    rows = with_ratios(rows)
    _print(rows)
    return {"workload": "tuner", "part": "simulated", "peak_rps": peak, "seconds": seconds, "start": start,
            "start_s": [float(START_S[start].min()), float(START_S[start].max())],
            "pause_s": [float(pause_s.min()), float(pause_s.max())],
            "hop_ms": 5.0, "overhead_ms": 5.0,
            "deadline": "slo" if deadline else "none",
            "summary": summary(rows), "plans": plans_out, "rows": rows, "rates_per_minute": rates,
            "timelines": timelines, "wall_s": time.perf_counter() - wall, "targets": simulated_targets(rows)}


def total_consumers(timeline: dict[str, list[tuple[float, int]]]) -> list[list[float]]:
    """[time, consumers of every stage together] at each change."""
    events = sorted({t for changes in timeline.values() for t, _ in changes})
    out: list[list[float]] = []
    for t in events:
        total = sum(next((c for at, c in reversed(changes) if at <= t), 0) for changes in timeline.values())
        if not out or out[-1][1] != total:
            out.append([round(t, 2), total])
    return out


def summary(rows: Sequence[dict[str, Any]], tuner: str = TUNER) -> list[dict[str, Any]]:
    """Per pipeline x trace, the tuner beside the others: its attainment and cost against the oracle's and
    static's, and the better KEDA variant's (the one missing fewer)."""
    by = {(r["pipeline"], r["trace"], r["contender"]): r for r in rows}
    out = []
    for p, t in dict.fromkeys((r["pipeline"], r["trace"]) for r in rows):
        me, oracle, late = by.get((p, t, tuner)), by.get((p, t, "oracle")), by.get((p, t, "oracle-late"))
        kedas = [k for k in (by.get((p, t, "keda")), by.get((p, t, "keda-tuned"))) if k is not None]
        keda = min(kedas, key=lambda k: k["misses"]) if kedas else None
        if me is None:
            continue
        out.append({"pipeline": p, "trace": t, "tuner_attainment": me["attainment"],
                    "tuner_cost_vs_oracle": me.get("cost_vs_oracle"), "tuner_cost_vs_static": me.get("cost_vs_static"),
                    "oracle_attainment": oracle["attainment"] if oracle else None,
                    "late_oracle_attainment": late["attainment"] if late else None,
                    "keda_best": keda["contender"] if keda else None,
                    "keda_attainment": keda["attainment"] if keda else None,
                    "keda_cost_vs_oracle": keda.get("cost_vs_oracle") if keda else None,
                    "tuner_misses_vs_keda": me["misses"] / keda["misses"] if keda and keda["misses"] else None})
    return out


def _print(rows: list[dict[str, Any]]) -> None:
    t = Table(title="simulated cluster: contenders per pipeline x trace")
    for col in ("pipeline", "trace", "contender", "attainment %", "misses", "p99 ms", "cost $", "actions",
                "/ oracle", "/ static"):
        t.add_column(col, justify="left" if col in ("pipeline", "trace", "contender") else "right")
    for r in rows:
        t.add_row(r["pipeline"], r["trace"], r["contender"], f"{r['attainment'] * 100:.3f}", str(r["misses"]),
                  f"{r['p99_ms']:.0f}", f"{r['cost_dollars']:.2f}", str(r["actions"]),
                  f"{r['cost_vs_oracle']:.2f}" if r["cost_vs_oracle"] else "",
                  f"{r['cost_vs_static']:.2f}" if r["cost_vs_static"] else "")
    console.print(t)
