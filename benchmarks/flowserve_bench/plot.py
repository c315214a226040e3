"""``flowserve bench ... --plot FILE.png``: a figure of a bench's result, drawn with matplotlib.

One function per workload, each reading only the result dict the bench returns (so a result saved as
JSON can be drawn again later). matplotlib is imported when a plot is drawn, never with flowserve, and
only its object API is used (``Figure`` rendered by the Agg canvas): no pyplot state, no display.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowserve.tuning.plot_plan import figure
from flowserve_bench import plot_learning, plot_tuner

Drawer = Callable[[Any, dict[str, Any]], None]


def _interval_bars(point: float, interval: list[float] | None) -> tuple[float, float]:
    """Error-bar offsets below and above ``point`` for ``interval`` (``[low, high]``; none: no bar)."""
    if not interval:
        return 0.0, 0.0
    return point - interval[0], interval[1] - point


def batching(fig: Any, result: dict[str, Any]) -> None:
    """Per arrival process: each policy's SLO attainment against load with its 95% interval over slices;
    then the worst slice's p99 against load (a colour per policy, a dash per arrival)."""
    cells = result["cells"]
    arrivals = list(dict.fromkeys(c["arrival"] for c in cells))
    policies = list(dict.fromkeys(p for c in cells for p in c["policies"]))
    *attains, p99 = fig.subplots(1, len(arrivals) + 1)
    slo = result.get("slo_ms")
    for j, (arrival, ax) in enumerate(zip(arrivals, attains, strict=True)):
        rows = sorted((c for c in cells if c["arrival"] == arrival), key=lambda c: c["load"])
        for i, policy in enumerate(policies):
            points = [(100 * c["load"], c["policies"][policy]) for c in rows if policy in c["policies"]]
            loads = [x for x, _ in points]
            values = [100 * p["attainment"] for _, p in points]
            bars = [_interval_bars(p["attainment"], p.get("interval")) for _, p in points]
            ax.errorbar([x + (i - (len(policies) - 1) / 2) * 0.6 for x in loads], values,  # side by side
                        yerr=[[100 * b for b, _ in bars], [100 * a for _, a in bars]], color=f"C{i}", marker="o",
                        capsize=3, label=policy)
            p99.plot(loads, [p["p99_ms_worst_slice"] if p.get("p99_ms_worst_slice") is not None else float("nan")
                             for _, p in points], ["-", "--", ":", "-."][j % 4], color=f"C{i}", marker="o",
                     label=f"{policy} ({arrival})")
        ax.set(title=f"{arrival} arrivals: requests within the {slo} ms SLO", xlabel="offered load (% of capacity)",
               ylabel="attainment (%, 95% interval)")
        ax.legend(fontsize=7)
    ratio = result.get("adaptive_max_rps_ratio_to_best_static")
    title = "worst slice's p99 latency"
    if ratio:
        title += f"\n(max throughput adaptive / best static {ratio[0]:.2f} [{ratio[1]:.2f}, {ratio[2]:.2f}])"
    p99.set(title=title, xlabel="offered load (% of capacity)", ylabel="p99 latency (ms)", yscale="log")
    if slo:
        p99.axhline(slo, color="red", linestyle="--", linewidth=1, label="SLO")
    p99.legend(fontsize=6, loc="center right")


def broker(fig: Any, result: dict[str, Any]) -> None:
    """Throughput against concurrency per broker; each broker's throughput over Kafka's (the baseline)
    with its 95% interval."""
    rps, ratio = fig.subplots(1, 2)
    for i, (label, b) in enumerate(result["brokers"].items()):
        levels = sorted(b["levels"], key=int)
        rps.plot([int(lvl) for lvl in levels], [b["levels"][lvl]["rps"] for lvl in levels], marker="o",
                 color=f"C{i}", label=f"{label} ({b.get('kind', label)})")
    levels = sorted({int(lvl) for b in result["brokers"].values() for lvl in b["levels"]})
    rps.set(title=f"{result.get('topology', '')} through the gateway, closed loop",
            xlabel="concurrency (requests in flight)", ylabel="throughput (req/s)", xscale="log")
    rps.legend(fontsize=8)
    labels = list(result["brokers"])
    for label, per_level in result["throughput_over_kafka"].items():
        keys = sorted(per_level, key=int)
        points = [per_level[lvl][0] for lvl in keys]
        err = [_interval_bars(per_level[lvl][0], per_level[lvl][1:]) for lvl in keys]
        i = labels.index(label) if label in labels else len(labels)
        ratio.errorbar([int(lvl) for lvl in keys], points, yerr=[[b for b, _ in err], [a for _, a in err]],
                       marker="o", capsize=4, color=f"C{i}", label=f"{label} / kafka")
    ratio.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ratio.axhline(0.8, color="red", linestyle=":", linewidth=1, label="target 0.8x")
    ratio.set(title="throughput over Kafka's, 95% intervals", xlabel="concurrency (requests in flight)",
              ylabel="ratio", xscale="log")
    for ax in (rps, ratio):
        ax.set_xticks(levels, [str(lvl) for lvl in levels])
        ax.minorticks_off()
    ratio.legend(fontsize=8)


def gateway(fig: Any, result: dict[str, Any]) -> None:
    """Per topology: p99 and throughput against concurrency, the gateway and the Kafka client."""
    runs = result["topologies"]
    axes = fig.subplots(2, len(runs), squeeze=False)
    for col, (name, run) in enumerate(runs.items()):
        p99, rps = axes[0][col], axes[1][col]
        for contender, label in (("gateway", "HTTP gateway"), ("async", "async Kafka client")):
            levels = sorted(run[contender], key=int)
            xs = [int(lvl) for lvl in levels]
            p99.plot(xs, [run[contender][lvl]["p99_ms"] for lvl in levels], marker="o", label=label)
            rps.plot(xs, [run[contender][lvl]["rps"] for lvl in levels], marker="o", label=label)
        p99.set(title=f"{name}: p99", xlabel="concurrency (requests in flight)", ylabel="p99 latency (ms)",
                xscale="log")
        rps.set(title=f"{name}: throughput", xlabel="concurrency (requests in flight)",
                ylabel="throughput (req/s)", xscale="log")
        p99.legend(fontsize=8)
        rps.legend(fontsize=8)


def latency(fig: Any, result: dict[str, Any]) -> None:
    """Per-hop p50 and p99, flowserve against the raw aiokafka chain."""
    ax = fig.subplots()
    import numpy as np

    quantiles = ("p50", "p99")
    x = np.arange(len(quantiles))
    for i, (side, label) in enumerate((("raw", "raw aiokafka chain"), ("flowserve", "flowserve topology"))):
        ax.bar(x + (i - 0.5) * 0.38, [result[f"{side}_hop_{q}_ms"] for q in quantiles], 0.38, label=label)
    ax.set_xticks(x, [f"per hop {q}" for q in quantiles])
    ax.set(title=f"latency per hop at {result.get('rate')} req/s", xlabel="quantile", ylabel="latency (ms)")
    ax.legend()


def passthrough(fig: Any, result: dict[str, Any]) -> None:
    """Records per second through one stage, per contender."""
    ax = fig.subplots()
    labels = {"a_raw_send": "raw aiokafka\n(send per record)", "b_raw_batch": "raw aiokafka\n(batch API)",
              "c_flowserve": "flowserve\nidentity node"}
    ax.bar(list(labels.values()), [result[k] for k in labels], color=["#999", "#666", "#3b6fd6"])
    ax.set(title=f"pass-through, {result.get('records')} records of {result.get('value_bytes')} B",
           xlabel="contender", ylabel="throughput (records/s)")


def capture(fig: Any, result: dict[str, Any]) -> None:
    """Each ratio with its 95% interval; 1.0 is 'no cost' (capture's, and explain's, which has one)."""
    ax = fig.subplots()
    ratios = result["ratios"]
    names = list(ratios)
    values = [ratios[n]["ratio"] for n in names]
    low = [v - ratios[n]["95ci"][0] for n, v in zip(names, values, strict=True)]
    high = [ratios[n]["95ci"][1] - v for n, v in zip(names, values, strict=True)]
    ax.errorbar(values, range(len(names)), xerr=[low, high], fmt="o", capsize=4)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(names)), [n.replace("_", " ") for n in names])
    ax.set(title=f"{result.get('workload', 'capture')}: with / without, 95% intervals", xlabel="ratio",
           ylabel="comparison")


def tuner(fig: Any, result: dict[str, Any]) -> None:
    """The tuner against static and KEDA provisioning per trace (attainment, cost), and the simulator's
    p99 against the live p99 per pipeline, for the sections the result holds; the simulated part's
    consumers over time (:mod:`flowserve_bench.plot_tuner`)."""
    if result.get("part") == "simulated":
        plot_tuner.simulated(fig, result)
        return
    rows = result.get("tuner") or []
    sims = [r for r in result.get("simulate") or [] if "error" not in r]
    axes = list(fig.subplots(1, (2 if rows else 0) + (1 if sims else 0) or 1, squeeze=False)[0])
    if rows:
        attain, cost = axes.pop(0), axes.pop(0)
        traces = list(dict.fromkeys(r["trace"] for r in rows))
        contenders = list(dict.fromkeys(r["contender"] for r in rows))
        by = {(r["trace"], r["contender"]): r for r in rows}
        width = 0.8 / len(contenders)
        for i, c in enumerate(contenders):
            xs = [t + (i - (len(contenders) - 1) / 2) * width for t in range(len(traces))]
            attain.bar(xs, [100 * by[(t, c)]["attainment"] if (t, c) in by else 0 for t in traces], width, label=c)
            cost.bar(xs, [by[(t, c)]["cost_dollars"] if (t, c) in by else 0 for t in traces], width, label=c)
        for ax in (attain, cost):
            ax.set_xticks(range(len(traces)), traces)
            ax.legend(fontsize=7)
        attain.axhline(99, color="red", linestyle="--", linewidth=1)
        attain.set(title="requests within the SLO", xlabel="trace", ylabel="attainment (%)")
        cost.set(title="cost (replica-seconds x price)", xlabel="trace", ylabel="cost ($)")
    if sims:
        ax = axes.pop(0)
        names = [r["pipeline"] for r in sims]
        at = list(range(len(names)))
        ax.bar([x - 0.2 for x in at], [r["sim_p99_ms"] for r in sims], 0.4, label="simulated")
        ax.bar([x + 0.2 for x in at], [r["live_p99_ms"] for r in sims], 0.4, label="live")
        ax.set_xticks(at, names, rotation=15)
        ax.set(title="p99 of the planned configuration", xlabel="pipeline", ylabel="p99 latency (ms)")
        ax.legend(fontsize=7)


def parity(fig: Any, result: dict[str, Any]) -> None:
    """Per straggler scenario and contender: the p50, p99 and p99.9 latency, and the gap p99.9 - p50."""
    lat, gap = fig.subplots(1, 2)
    scenarios = list(result["scenarios"])
    first = result["scenarios"][scenarios[0]]
    contenders = [c for c, r in first.items() if isinstance(r, dict)]
    width = 0.8 / len(contenders)
    for i, c in enumerate(contenders):
        xs = [x + (i - (len(contenders) - 1) / 2) * width for x in range(len(scenarios))]
        rows = [result["scenarios"][s][c] for s in scenarios]
        lat.bar(xs, [r["p99_9_ms"] for r in rows], width, color=f"C{i}", alpha=0.35)
        lat.bar(xs, [r["p50_ms"] for r in rows], width, color=f"C{i}", label=f"{c} (p50; light: p99.9)")
        gap.bar(xs, [r["gap_ms"] for r in rows], width, color=f"C{i}", label=c)
    for ax in (lat, gap):
        ax.set_xticks(range(len(scenarios)), scenarios)
        ax.legend(fontsize=7)
    lat.set(title="latency", xlabel="scenario", ylabel="latency (ms)", yscale="log")
    gap.set(title="tail gap p99.9 - p50", xlabel="scenario", ylabel="gap (ms)", yscale="log")


def scale(fig: Any, result: dict[str, Any]) -> None:
    """Throughput of a stage with 1 and 2 consumers, and the ratio with its 95% interval."""
    ax = fig.subplots()
    cpu = result["cpu"]
    ratio = cpu["ratio_2_over_1"]
    ax.bar(["1 consumer", "2 consumers"], [cpu["consumers_1"]["throughput_rps"], cpu["consumers_2"]["throughput_rps"]])
    ax.set(title=f"CPU stage: 2/1 = {ratio['point']:.2f} (95% interval {ratio['low']:.2f}-{ratio['high']:.2f})",
           xlabel="consumers of the stage", ylabel="throughput (req/s)")


def hop_cpu(fig: Any, result: dict[str, Any]) -> None:
    """CPU per record per hop, this code / the earlier commit, per level with its 95% interval; 0.5 is
    issue 35's bound."""
    ax = fig.subplots()
    rows = result["loads"]
    values = [r["cpu_ratio"][0] for r in rows]
    low = [v - r["cpu_ratio"][1] for v, r in zip(values, rows, strict=True)]
    high = [r["cpu_ratio"][2] - v for v, r in zip(values, rows, strict=True)]
    ax.errorbar(range(len(rows)), values, yerr=[low, high], fmt="o", capsize=4)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.axhline(0.5, color="#c33", linestyle=":", linewidth=1)
    ax.set_xticks(range(len(rows)), [r["load"] for r in rows])
    ax.set(title=f"{result.get('topology')}: worker CPU per record per hop, now / {result['before']['commit']}",
           xlabel="closed-loop concurrency", ylabel="ratio (95% interval)")


def chaos(fig: Any, result: dict[str, Any]) -> None:
    """The accounting per caller (sent, answered, failed, lost) and each fault on the run's timeline."""
    acc, timeline = fig.subplots(1, 2)
    rows = {"HTTP": result["http"], "async": result["async"]}
    outcomes = ["sent", "ok", "error", "failed", "lost"]
    width = 0.8 / len(outcomes)
    for i, outcome in enumerate(outcomes):
        xs = [x + (i - (len(outcomes) - 1) / 2) * width for x in range(len(rows))]
        acc.bar(xs, [r.get(outcome, 0) for r in rows.values()], width, color=f"C{i}", label=outcome)
    acc.set_xticks(range(len(rows)), list(rows))
    acc.set(title=f"requests: lost {result['lost']}", xlabel="caller", ylabel="requests")
    acc.legend(fontsize=7)
    kinds = sorted({f["kind"] for f in result["faults"]})
    for f in result["faults"]:
        timeline.plot(f["at_s"], kinds.index(f["kind"]), "o", color=f"C{kinds.index(f['kind'])}")
    timeline.set_yticks(range(len(kinds)), kinds)
    timeline.set(title=f"{len(result['faults'])} faults in {result['seconds']:.0f} s", xlabel="time (s)",
                 ylabel="fault")


def plan_objectives(fig: Any, result: dict[str, Any]) -> None:
    """``--plot``: joules per request of the cost and energy plans per pipeline and rate, the dollars ratio
    above each pair (flowserve bench plan-objectives)."""
    compared = [c for c in result.get("comparisons", []) if c.get("conservative_ratio") is not None]
    ax = fig.subplots()
    labels = [f"{c['pipeline']}\n{c['rate']:g}/s" for c in compared]
    xs = range(len(compared))
    ax.bar([x - 0.2 for x in xs], [c["cost_j"] for c in compared], width=0.4, label="cost plan")
    ax.bar([x + 0.2 for x in xs], [c["energy_j"] for c in compared], width=0.4, label="energy plan")
    for x, c in zip(xs, compared, strict=True):
        ax.annotate(f"${c['cost_ratio']:.2f}x", (x, max(c["cost_j"], c["energy_j"])), ha="center", va="bottom",
                    fontsize=7)
    ax.set_xticks(list(xs), labels, rotation=60, fontsize=7)
    ax.legend()
    ax.set(title="expected joules per request (energy plan's dollars / cost plan's above)",
           xlabel="pipeline and rate", ylabel="J per request")


def models(fig: Any, result: dict[str, Any]) -> None:
    """``flowserve bench models`` (simulated): share answered within the SLO per load, flowserve's scheduler
    against load-on-demand LRU, one panel per catalogue (models, Zipf s, workers)."""
    cells: dict[str, list[dict[str, Any]]] = {}
    for r in result.get("rows", []):
        cells.setdefault(f"{r['models']} models, s {r['s']}, {r['workers']} workers", []).append(r)
    rows_n = 2 if len(cells) > 3 else 1
    axes = fig.subplots(rows_n, max(1, -(-len(cells) // rows_n)), squeeze=False).ravel()
    for ax, (title, rows) in zip(axes, cells.items(), strict=False):
        loads = [r["load"] for r in rows]
        for side in ("flowserve", "lru"):
            ax.plot(loads, [r[side]["attainment"][0] * 100 for r in rows], marker="o", label=side)
        ax.set(title=title, xlabel="load (share of capacity)", ylabel="% within SLO")
        ax.title.set_fontsize(8)
        ax.xaxis.label.set_fontsize(8)
        ax.yaxis.label.set_fontsize(8)
    axes[0].legend()


def numbers(fig: Any, result: dict[str, Any]) -> None:
    """Any other result: its top-level numbers as bars."""
    ax = fig.subplots()
    items = [(k, v) for k, v in result.items() if isinstance(v, int | float) and not isinstance(v, bool)]
    ax.barh([k for k, _ in items], [v for _, v in items])
    ax.set(title=str(result.get("workload", "bench")), xlabel="value", ylabel="figure")


DRAWERS: dict[str, Drawer] = {"batching": batching, "gateway": gateway, "latency": latency,
                              "passthrough": passthrough, "capture": capture, "explain": capture, "tuner": tuner,
                              "simulate": tuner, "parity": parity, "scale": scale, "chaos": chaos, "broker": broker,
                              "plan-objectives": plan_objectives, "models": models, "hop-cpu": hop_cpu,
                              **plot_learning.DRAWERS}


def plot_result(result: dict[str, Any], path: str | Path) -> Any:
    """Draw ``result`` (what ``flowserve bench`` prints last) to ``path``; returns the matplotlib Figure."""
    workload = str(result.get("workload", ""))
    drawer = DRAWERS.get(workload, numbers)
    arrivals = {c.get("arrival") for c in result.get("cells") or []}
    panels = {"batching": len(arrivals) + 1, "parity": 2, "gateway": len(result.get("topologies", {})) or 1,
              "tuner": 2 * bool(result.get("tuner")) + bool(result.get("simulate")) or 1, "broker": 2, "chaos": 2,
              "learn": 2}.get(workload, 2 if workload.startswith("learn-") else 1)
    fig = figure(panels, width=5.5 if workload == "gateway" else 6.5)
    if workload == "gateway":
        fig.set_figheight(8)
    if workload == "tuner" and result.get("part") == "simulated":
        rows, cols = plot_tuner.panels(result)
        fig.set_size_inches(5 * cols, 3.6 * rows)
    if workload == "learn":  # a row of two panels per part
        fig.set_figheight(4.5 * sum(isinstance(result.get(p), dict) for p in plot_learning.PARTS) or 4.5)
    drawer(fig, result)
    fig.suptitle(f"flowserve bench {workload}")
    fig.savefig(path, dpi=110)
    return fig
