"""``flowserve profile`` (each node's execution time per batch size) and ``flowserve stats`` (workers' metrics)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from rich.table import Table

from flowserve.cli.common import console as err
from flowserve.cli.common import out
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import load_topology
from flowserve.tuning.profile import profile_topology


def register(sub: Any) -> None:
    p = sub.add_parser("profile", help="measure each node's execution time per batch size (saved beside the topology)")
    p.add_argument("topology")
    p.add_argument("node", nargs="?", help="only this node (default: every node)")
    p.add_argument("--max-batch", type=int, help="largest batch size to profile (default: the node's max_batch)")
    p.add_argument("--repeats", type=int, default=30, help="timed calls per batch size")
    p.add_argument("--out", help="profile file (default: <topology>.profile.json beside the topology)")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("stats", help="latest metrics snapshot of every worker of a topology")
    p.add_argument("topology")
    p.add_argument("--broker", required=True)
    p.add_argument("--json", action="store_true", help="print the snapshots as JSON")
    p.set_defaults(func=cmd_stats)


def cmd_profile(args: argparse.Namespace) -> int:
    with err.status("profiling (calling process directly at batch sizes 1, 2, 4, ...)…"):
        path, results = profile_topology(args.topology, args.node, max_batch=args.max_batch,
                                         repeats=args.repeats, out=args.out)
    table = Table(title=f"execution time per batch size → {path}")
    for col in ("node", "batch", "p50 ms", "p99 ms", "p99 ms / request", "runs"):
        table.add_column(col, justify="left" if col == "node" else "right")
    for node, timings in results.items():
        for t in timings:
            table.add_row(node, str(t.size), f"{t.p50_s * 1000:.3f}", f"{t.p99_s * 1000:.3f}",
                          f"{t.p99_s * 1000 / t.size:.3f}", str(t.runs))
    out.print(table)
    print(json.dumps({"profile": str(path), "nodes": {n: {str(t.size): round(t.p99_s * 1000, 4) for t in ts}
                                                      for n, ts in results.items()}}))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from flowserve.runtime.metrics import (  # the snapshot reader
        LIVE_AGE_S,
        PLACEMENT_ROLE,
        model_rows,
        read_snapshots,
        snapshot_rows,
    )

    topology = load_topology(args.topology)
    snaps = asyncio.run(read_snapshots(topology, KafkaSettings.from_env(args.broker)))
    if args.json:
        print(json.dumps(snaps))
        return 0
    # gateways publish their refusal counters here too (flowserve.gateway.app): a table of their own
    gateways = [s for s in snaps if s.get("role") == "gateway"]
    # placement agents (flowserve.models.agent) publish where the models of many-model nodes are placed
    placements = [s for s in snaps if s.get("role") == PLACEMENT_ROLE and "placement" in s]
    snaps = [s for s in snaps if s.get("role") not in ("gateway", PLACEMENT_ROLE)]
    if gateways:
        _gateway_table(topology.name, gateways)
    if not snaps:
        err.print(f"no metrics snapshots in {topology.metrics_topic} yet (workers publish every 2 s)")
        return 1
    rows = snapshot_rows(snaps)
    table = Table(title=f"{topology.name}: latest snapshot per worker ({topology.metrics_topic})")
    cols = [("node", "node"), ("worker", "worker"), ("policy", "policy"), ("age s", "age_s"),
            ("batches", "batches"), ("batch mean", "batch_mean"), ("batch p99", "batch_p99"),
            ("exec p50 ms", "exec_p50_ms"), ("exec p99 ms", "exec_p99_ms"), ("wait p50 ms", "wait_p50_ms"),
            ("wait p99 ms", "wait_p99_ms"), ("lag", "lag"), ("ok", "requests_ok"), ("refused", "refused"),
            ("doomed", "doomed"), ("expired", "expired"), ("late", "late"), ("dead letters", "dead_lettered")]
    # parity counters (flowserve.parity) only where some worker reports them: groups, reconstructions, drops
    parity = [("dup dropped", "duplicates"), ("parity groups", "parity_groups"),
              ("parity abandoned", "parity_abandoned"), ("reconstructed", "reconstructed"),
              ("late real", "parity_late_real")]
    if any(row.get(key) for row in rows for _, key in parity):
        cols += parity
    if any(row.get("rewinds") for row in rows):  # produces the broker did not take in time (runtime/rewind.py)
        cols.append(("rewinds", "rewinds"))
    cache = [("cache hits", "cache_hits"), ("cache misses", "cache_misses"), ("evictions", "cache_evictions"),
             ("cache bytes", "cache_bytes")]  # nodes with a prediction cache (flowserve.cache)
    if any(key in row for row in rows for _, key in cache):
        cols += cache
    models = [("models resident", "models_resident"), ("model loads", "model_loads"),
              ("model evictions", "model_evictions"), ("model refusals", "model_refusals")]
    if any(key in row for row in rows for _, key in models):  # many-model nodes (flowserve.models)
        cols += models
    energy = _energy_columns(rows, snaps)
    cols += energy
    for title, _ in cols:
        table.add_column(title, justify="left" if title in ("node", "worker", "policy") else "right")
    for row in rows:
        table.add_row(*(str(row.get(key, 0)) for _, key in cols))
    out.print(table)
    # consumers per stage: workers whose latest snapshot is recent (the tuner starts and stops them)
    live: dict[str, int] = {}
    for row in rows:
        live.setdefault(str(row["node"]), 0)
        if row["age_s"] <= LIVE_AGE_S:
            live[str(row["node"])] += 1
    out.print("consumers per stage: " + ", ".join(f"{n} {c}" for n, c in live.items()))
    _models_table(model_rows(snaps + placements), [p["placement"] for p in placements])
    if energy:
        busy, idle = sum(r.get("energy_j", 0) for r in rows), sum(r.get("idle_j", 0) for r in rows)
        grams = sum(r.get("co2e_g", 0) for r in rows)
        out.print(f"energy: {busy:.4g} J serving + {idle:.4g} J idle, {grams:.4g} g CO2e (workers' lifetimes)")
    return 0


def _energy_columns(rows: list[dict[str, Any]], snaps: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Energy counters (flowserve.energy: millijoules, micrograms) into the rows as J and g, where any
    worker meters energy; the columns to show."""
    if not any("energy_mj" in s.get("counters", {}) for s in snaps):
        return []
    for row, snap in zip(rows, snaps, strict=True):  # snapshot_rows keeps the snapshots' order
        c = snap.get("counters", {})
        row.update(energy_j=round(c.get("energy_mj", 0) / 1000, 3), idle_j=round(c.get("energy_idle_mj", 0) / 1000, 3),
                   co2e_g=round(c.get("co2e_ug", 0) / 1e6, 6))
    return [("energy J", "energy_j"), ("idle J", "idle_j"), ("CO2e g", "co2e_g")]


def _models_table(rows: list[dict[str, Any]], placements: list[dict[str, Any]], top: int = 20) -> None:
    """The busiest models of many-model nodes (flowserve.models, ``model_rows``), summed over workers; all:
    flowserve models list. ``placed`` (with a placement agent): the partitions its requests go to, one per
    worker, where it has more than its home; each placement agent's line says over how many workers and
    partitions it places."""
    for p in placements:
        out.print(f"placement of node {p.get('node')}: {p.get('workers')} worker(s), {p.get('partitions')} "
                  f"partitions, {len(p.get('models', {}))} model(s) on more than one worker")
    if not rows:
        return
    busiest = rows[:top]
    table = Table(title=f"models: the {len(busiest)} busiest of {len(rows)} with any activity")
    cols = ("resident", "loads", "evictions", "refusals", "answers")
    table.add_column("model")
    for col in (*cols, "placed"):
        table.add_column(col, justify="right")
    for row in busiest:
        table.add_row(row["model"], *(str(row[col]) for col in cols), ",".join(map(str, row["placed"])) or "home")
    out.print(table)


def _gateway_table(model: str, snaps: list[dict[str, Any]]) -> None:
    """Each gateway's refusals of requests to this model (and, apart, of requests naming no served model)."""
    kinds = ("unauthorized", "forbidden", "rate_limited")
    table = Table(title=f"{model}: gateways' refusals (401, 403, 429 by kind)")
    for title in ("gateway", "age s", *kinds, "elsewhere"):
        table.add_column(title, justify="left" if title == "gateway" else "right")
    now_ms = int(time.time() * 1000)
    for s in snaps:
        counters, other = s.get("counters", {}), s.get("unattributed", {})
        table.add_row(str(s.get("worker")), f"{(now_ms - int(s.get('ts_ms', now_ms))) / 1000:.1f}",
                      *(str(counters.get(k, 0)) for k in kinds), str(sum(other.get(k, 0) for k in kinds)))
    out.print(table)
