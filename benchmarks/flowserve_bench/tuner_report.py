"""The live ``flowserve bench tuner``'s tables and targets (:mod:`flowserve_bench.tuner`), kept apart so
that the accounting is tested on rows whose answers are known."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from flowserve_bench.common import console


def print_tables(sim_rows: list[dict[str, Any]], tuner_rows: list[dict[str, Any]], hop_ms: float, overhead_ms: float
                 ) -> None:
    """The live bench's two tables: the simulator against live runs, and the contenders per trace."""
    out = Table(title=f"simulator vs live (hops and per-batch overheads drawn from those measured, means "
                      f"{hop_ms:.1f} and {overhead_ms:.1f} ms)")
    for col in ("pipeline", "SLO ms", "plan", "$/h", "sim p50", "live p50", "sim p99", "live p99", "sim/live p99",
                "each trace"):
        out.add_column(col, justify="left" if col in ("pipeline", "plan") else "right")
    for r in sim_rows:
        if "error" in r:
            out.add_row(r["pipeline"], f"{r['slo_ms']:.0f}", r["error"], *[""] * 7)
            continue
        plan = ", ".join(f"{k}: {v['hardware']} b{v['max_batch']} x{v['consumers']}" for k, v in r["plan"].items())
        out.add_row(r["pipeline"], f"{r['slo_ms']:.0f}", plan, f"{r['cost_per_hour']:.3f}", f"{r['sim_p50_ms']:.1f}",
                    f"{r['live_p50_ms']:.1f}", f"{r['sim_p99_ms']:.1f}", f"{r['live_p99_ms']:.1f}",
                    f"{r['p99_ratio']:.2f}", " ".join(f"{x:.2f}" for x in r["p99_ratio_each"]))
    console.print(out)
    t = Table(title="tuner vs static-peak vs KEDA (Kafka scaler + HPA defaults, ScaledObject as rendered)")
    for col in ("trace", "contender", "sent", "attainment %", "misses", "p99 ms", "cost $", "replica-s", "actions"):
        t.add_column(col, justify="left" if col in ("trace", "contender") else "right")
    for r in tuner_rows:
        t.add_row(r["trace"], r["contender"], str(r["sent"]), f"{r['attainment'] * 100:.2f}", str(r["misses"]),
                  f"{r['p99_ms']:.0f}", f"{r['cost_dollars']:.5f}", f"{r['replica_s']:.0f}", str(r["actions"]))
    console.print(t)


def tuner_targets(tuner_rows: list[dict[str, Any]], sim_rows: list[dict[str, Any]]) -> dict[str, bool]:
    """The bench's targets from its rows (a section that did not run sets none)."""
    by = {(r["trace"], r["contender"]): r for r in tuner_rows}
    targets: dict[str, bool] = {}
    if tuner_rows:
        traces = sorted({r["trace"] for r in tuner_rows})
        targets["tuner_attainment_ge_99pct_every_trace"] = all(by[(t, "tuner")]["attainment"] >= 0.99
                                                               for t in traces)
        targets["tuner_cost_le_0.6x_static_on_step_and_diurnal"] = all(
            by[(t, "tuner")]["cost_dollars"] <= 0.6 * by[(t, "static")]["cost_dollars"] for t in ("step", "diurnal"))
        keda_misses = sum(by[(t, "keda")]["misses"] for t in traces)
        targets["tuner_misses_le_fifth_of_keda"] = sum(by[(t, "tuner")]["misses"] for t in traces) <= keda_misses / 5
    twins = [r for r in tuner_rows if "sim_attainment" in r]
    if twins:
        targets["simulated_tuned_runs_within_2pts_and_15pct_cost"] = all(
            abs(r["sim_attainment"] - r["attainment"]) <= 0.02
            and abs(r["sim_cost_dollars"] - r["cost_dollars"]) <= 0.15 * r["cost_dollars"] for r in twins)
    if sim_rows:
        targets["simulator_p99_within_15pct_of_live"] = all("error" not in r and abs(r["p99_ratio"] - 1) <= 0.15
                                                            for r in sim_rows)
    return targets
