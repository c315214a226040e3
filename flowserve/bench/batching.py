"""SLO-aware batching vs static and timeout batching, on a compute-heavy node behind the real broker.

One node, ``flowserve_components.torch_stage:TorchClassifier`` with the ``digits-cnn`` model (one torch thread):
a call costs about a millisecond whatever the batch, so batching matters. The worker runs in its own
process (``flowserve worker``) exactly as deployed; this process sends open-loop traffic and reads the
replies. Steps:

1. profile the node (``flowserve profile``; per-request p99 at batch 1 vs 32 is printed);
2. measure the lone-request end-to-end latency (the SLO is 10x it) and the capacity: the highest
   open-loop Poisson rate at which static batch 32 (= the node's ``max_batch``, the best static policy)
   keeps up with bounded queueing — every request answered, p99 within the SLO — found by 2 s probes
   ramping x1.2 from a quarter of its backlog-drain rate, then one bisection step. The drain rate of a
   backlog overstates it: open-loop traffic makes the client, the broker and the worker share the CPUs
   while requests are paced one by one, and the cells below are open-loop;
3. for each policy — static 1, static 8, static 32, timeout (32 / 10 ms, as Ray Serve and Triton
   batch), flowserve adaptive (SLO policy, seeded by the profile) — its own worker process: its maximum
   throughput (backlog drain), then Poisson and bursty (Gamma, CV 4) arrivals at 10/50/80/95% of capacity.

Per cell: throughput (replies/s), p50/p99 latency of successful replies (from the scheduled arrival, so
a late sender is not hidden), SLO attainment = replies without error within the SLO / requests sent
(refused, expired and late all count as misses). The last line is JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.bench.common import console, run_id
from flowserve.client import TopologyClient
from flowserve.client.kafka import Reply
from flowserve.client.traffic import wait_ready
from flowserve.component import import_library
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.topology import load_topology

MAX_BATCH = 32
POLICIES: dict[str, str] = {
    "static-1": "{policy: fixed, size: 1}",
    "static-8": "{policy: fixed, size: 8}",
    "static-32": "{policy: fixed, size: 32}",
    "timeout-32/10ms": "{policy: timeout, size: 32, max_wait_ms: 10}",
    "adaptive": "{policy: slo}",
}
LOADS = (0.10, 0.50, 0.80, 0.95)
ARRIVALS = ("poisson", "bursty")
BACKLOG = 3000


def _topology_text(name: str, batching: str) -> str:
    return f"""
name: {name}
partitions: 4
nodes:
  model:
    component: flowserve_components.torch_stage:TorchClassifier
    params: {{model: digits-cnn, threads: 1}}
    inputs: {{x: input.x}}
    max_batch: {MAX_BATCH}
    batching: {batching}
outputs: {{logits: model.logits}}
"""


def _inputs(n: int = 256) -> list[dict[str, np.ndarray]]:
    digits = import_library("flowserve_components.digits")
    requests, _ = digits.sample(n, seed=1)
    return [{"x": (r["pixels"] / np.float32(digits.PIXEL_MAX)).astype(np.float32)} for r in requests]


class Collector:
    """Reads every reply of the client once, recording when it arrived and whether it failed."""

    def __init__(self, client: TopologyClient) -> None:
        self.client = client
        self.got: dict[str, Reply] = {}
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            reply = await self.client.replies()
            self.got[reply.request_id] = reply
            self._changed.set()

    async def wait_for(self, rids: list[str], until: float) -> None:
        while any(r not in self.got for r in rids) and time.monotonic() < until:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), max(0.01, until - time.monotonic()))

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def _gaps(kind: str, rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "poisson":
        return rng.exponential(1.0 / rate, n)
    shape = 1.0 / 16  # CV = 1/sqrt(shape) = 4
    return rng.gamma(shape, 1.0 / (rate * shape), n)


async def _cell(client: TopologyClient, collector: Collector, inputs: list[dict[str, np.ndarray]], *,
                tag: str, kind: str, rate: float, seconds: float, slo_ms: float, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(_gaps(kind, rate, int(rate * seconds * 3) + 10, rng))
    arrivals = arrivals[arrivals < seconds]
    scheduled: dict[str, float] = {}
    t0 = time.perf_counter()
    epoch0 = time.time() * 1000
    i, n = 0, len(arrivals)
    while i < n:
        now = time.perf_counter() - t0
        while i < n and arrivals[i] <= now:
            rid = f"{tag}-{i}"
            due = epoch0 + arrivals[i] * 1000
            scheduled[rid] = due
            left = max(1, int(due + slo_ms - time.time() * 1000))
            await client.queue(inputs[i % len(inputs)], request_id=rid, timeout_ms=left)
            i += 1
        await client.flush()
        if i < n:
            await asyncio.sleep(max(0.0, arrivals[i] - (time.perf_counter() - t0)))
    await collector.wait_for(list(scheduled), time.monotonic() + slo_ms / 1000 + 5.0)
    latencies, within, errors = [], 0, 0
    reasons: dict[str, int] = {}
    last_ms = epoch0
    for rid, due in scheduled.items():
        reply = collector.got.pop(rid, None)
        if reply is None:
            continue
        last_ms = max(last_ms, reply.received_ms)
        if reply.error is not None:
            errors += 1
            why = reply.error.split(":")[0][:60]
            reasons[why] = reasons.get(why, 0) + 1
            continue
        latency = float(reply.received_ms - due)
        latencies.append(latency)
        within += int(latency <= slo_ms)
    sent = len(scheduled)
    span = max(seconds, (last_ms - epoch0) / 1000)
    return {"arrival": kind, "rate": round(rate, 1), "sent": sent, "ok": len(latencies), "errors": errors,
            "throughput_rps": round(len(latencies) / span, 1),
            "p50_ms": round(float(np.percentile(latencies, 50)), 2) if latencies else None,
            "p99_ms": round(float(np.percentile(latencies, 99)), 2) if latencies else None,
            "attainment": float(within / sent) if sent else 1.0, "error_kinds": reasons}


async def _drain_rate(client: TopologyClient, collector: Collector, inputs: list[dict[str, np.ndarray]],
                      tag: str, n: int = BACKLOG) -> float:
    """Requests per second a backlog of ``n`` is worked off at (the policy's maximum throughput)."""
    rids = [f"{tag}-{i}" for i in range(n)]
    t0 = time.time() * 1000
    for i, rid in enumerate(rids):
        await client.queue(inputs[i % len(inputs)], request_id=rid, timeout_ms=300_000)
    await client.flush()
    await collector.wait_for(rids, time.monotonic() + 120)
    replies = [collector.got.pop(r) for r in rids if r in collector.got]
    done = sum(r.error is None for r in replies)
    last = max((r.received_ms for r in replies), default=t0 + 1)
    return done / ((last - t0) / 1000)


def _keeps_up(cell: dict[str, Any], slo_ms: float) -> bool:
    return bool(cell["errors"] == 0 and cell["ok"] == cell["sent"] and cell["p99_ms"] is not None
                and cell["p99_ms"] <= slo_ms)


async def _sustainable_rate(client: TopologyClient, collector: Collector, inputs: list[dict[str, np.ndarray]],
                            slo_ms: float, drain: float, probe_s: float = 2.0) -> float:
    """The highest open-loop Poisson rate this worker keeps up with (see the module docstring)."""
    rate, good, bad = 0.25 * drain, 0.0, 0.0
    for k in range(16):
        cell = await _cell(client, collector, inputs, tag=f"probe-{k}", kind="poisson", rate=rate,
                           seconds=probe_s, slo_ms=slo_ms, seed=500 + k)
        ok = _keeps_up(cell, slo_ms)
        console.print(f"  probe {rate:>6.0f}/s: p99 {cell['p99_ms']} ms, {cell['ok']}/{cell['sent']} ok "
                      f"-> {'keeps up' if ok else 'falls behind'}")
        if ok:
            good = rate
        else:
            bad = rate
        if bad and good:
            if bad / good <= 1.25:  # one bisection step between the last good and the first bad rate
                mid = (good * bad) ** 0.5
                if bad / good > 1.05 and mid not in (good, bad) and k < 15:
                    cell = await _cell(client, collector, inputs, tag=f"probe-{k}b", kind="poisson", rate=mid,
                                       seconds=probe_s, slo_ms=slo_ms, seed=600 + k)
                    ok = _keeps_up(cell, slo_ms)
                    console.print(f"  probe {mid:>6.0f}/s: p99 {cell['p99_ms']} ms, {cell['ok']}/{cell['sent']} "
                                  f"ok -> {'keeps up' if ok else 'falls behind'}")
                    good = mid if ok else good
                return good
            rate = (good * bad) ** 0.5
        elif bad:  # even a quarter of the drain rate is too much: step down
            rate *= 0.5
        elif rate >= 1.5 * drain:
            return good
        else:
            rate *= 1.2
    return good


async def _lone_latency(client: TopologyClient, inputs: list[dict[str, np.ndarray]], n: int = 60) -> float:
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        reply = await client.call(inputs[i % len(inputs)], timeout_ms=10_000)
        if reply.error is None:
            lat.append((time.perf_counter() - t0) * 1000)
    return float(np.median(lat))


class _Policy:
    """One policy's worker process and a client, for the duration of a ``with``."""

    def __init__(self, kafka: KafkaSettings, workdir: Path, label: str, name: str, profile: Path | None) -> None:
        self.path = workdir / f"{name}.yaml"
        self.path.write_text(_topology_text(name, POLICIES[label]))
        if profile is not None:
            (workdir / f"{name}.profile.json").write_text(profile.read_text())
        self.topology = load_topology(self.path)
        self.host = ProcessHost(self.path, self.topology, kafka, log_dir=workdir / "logs")
        self.client = TopologyClient(self.topology, kafka)
        self.kafka = kafka

    async def __aenter__(self) -> tuple[TopologyClient, Collector]:
        await create_topology_topics(self.topology, self.kafka)
        self.host.start_processes()
        await self.client.start()
        inputs = _inputs(8)
        await wait_ready(self.client, inputs[0])
        for i in range(50):  # warm up torch in the worker
            await self.client.call(inputs[i % len(inputs)], timeout_ms=10_000)
        self.collector = Collector(self.client)
        return self.client, self.collector

    async def __aexit__(self, *exc: object) -> None:
        await self.collector.stop()
        await self.client.stop()
        self.host.stop()
        from flowserve.runtime.metrics import read_snapshots

        snaps = await read_snapshots(self.topology, self.kafka)  # each worker's last snapshot at exit
        self.profile_ms = snaps[0].get("profile_p99_ms") if snaps else None
        self.counters = {k: sum(int(s["counters"].get(k, 0)) for s in snaps)
                         for k in ("requests_ok", "refused", "expired", "late", "batches")}


async def batching(kafka: KafkaSettings, cell_seconds: float = 3.0) -> dict[str, Any]:
    from flowserve.tuning.profile import profile_topology

    inputs = _inputs()
    bid = run_id()
    with tempfile.TemporaryDirectory(prefix="fs-bench-batching-") as tmp:
        workdir = Path(tmp)
        base = workdir / "profiled.yaml"
        base.write_text(_topology_text("profiled", POLICIES["adaptive"]))
        console.print("profiling the node (TorchClassifier digits-cnn, 1 torch thread)…")
        profile, timings = profile_topology(base, "model", max_batch=MAX_BATCH, repeats=30)
        by_size = {t.size: t for t in timings["model"]}
        per1, per32 = by_size[1].p50_s * 1000, by_size[MAX_BATCH].p50_s * 1000 / MAX_BATCH
        console.print(f"  process() per request: batch 1 {per1:.3f} ms, batch {MAX_BATCH} {per32:.3f} ms "
                      f"({per1 / per32:.1f}x cheaper batched)")

        console.print("measuring lone-request latency and capacity (open-loop Poisson probes, static 32)…")
        async with _Policy(kafka, workdir, "static-32", f"bb{bid}cap", None) as (client, collector):
            lone_ms = await _lone_latency(client, inputs)
            slo_ms = round(10 * lone_ms, 1)
            drain = await _drain_rate(client, collector, inputs, "cap")
            console.print(f"  lone request {lone_ms:.2f} ms end to end -> SLO {slo_ms:.1f} ms (10x); "
                          f"backlog drain {drain:.0f} req/s")
            capacity = await _sustainable_rate(client, collector, inputs, slo_ms, drain)
        if capacity <= 0:
            raise RuntimeError("static 32 kept up with no probed rate; the machine is too loaded to benchmark")
        console.print(f"  capacity {capacity:.0f} req/s (highest open-loop Poisson rate static 32 keeps up with: "
                      f"all answered, p99 <= SLO) = {capacity / drain:.2f}x the backlog drain rate")

        results: dict[str, dict[str, Any]] = {}
        for k, label in enumerate(POLICIES):
            console.print(f"[bold]{label}[/]")
            prof = profile if label == "adaptive" else None
            policy = _Policy(kafka, workdir, label, f"bb{bid}p{k}", prof)
            async with policy as (client, collector):
                max_rps = await _drain_rate(client, collector, inputs, f"{label}-max")
                cells = []
                for kind in ARRIVALS:
                    for j, load in enumerate(LOADS):
                        cell = await _cell(client, collector, inputs, tag=f"{label}-{kind}-{load}", kind=kind,
                                           rate=load * capacity, seconds=cell_seconds, slo_ms=slo_ms,
                                           seed=1000 + j + (100 if kind == "bursty" else 0))
                        cell["load"] = load
                        cells.append(cell)
                        console.print(f"  {kind:<7} {load:>4.0%} ({cell['rate']:>6.0f}/s)  "
                                      f"attain {cell['attainment']:7.3%}  thr {cell['throughput_rps']:>6.0f}/s  "
                                      f"p50 {cell['p50_ms']} ms  p99 {cell['p99_ms']} ms  errors {cell['errors']}")
            counters = getattr(policy, "counters", {})
            console.print(f"  max throughput (backlog drain) {max_rps:.0f} req/s; worker totals {counters}")
            results[label] = {"max_rps": round(max_rps, 1), "cells": cells, "worker": counters}

    report = _report(results, capacity, slo_ms, lone_ms, per1, per32, cell_seconds)
    report["drain_rps_static32"] = round(drain, 1)
    report["capacity_method"] = ("highest open-loop Poisson rate static-32 keeps up with "
                                 "(all answered, p99 <= SLO), 2 s probes")
    return report


def _report(results: dict[str, dict[str, Any]], capacity: float, slo_ms: float, lone_ms: float,
            per1: float, per32: float, cell_seconds: float) -> dict[str, Any]:
    adaptive = results["adaptive"]
    others = {k: v for k, v in results.items() if k != "adaptive"}
    at80 = next(c for c in adaptive["cells"] if c["arrival"] == "poisson" and c["load"] == 0.80)
    shortfalls = []
    for i, cell in enumerate(adaptive["cells"]):
        best = max(v["cells"][i]["attainment"] for v in others.values())
        if cell["attainment"] < best:
            shortfalls.append({"arrival": cell["arrival"], "load": cell["load"],
                               "adaptive": round(cell["attainment"], 4), "best_other": round(best, 4)})
    best_static = max(v["max_rps"] for k, v in others.items() if k.startswith("static"))
    ratio = adaptive["max_rps"] / best_static if best_static else 0.0
    targets = {
        "attainment_poisson80_ge_99.9": bool(at80["attainment"] >= 0.999),
        "attainment_ge_every_other_everywhere": not shortfalls,
        "max_throughput_ge_0.9x_best_static": bool(ratio >= 0.9),
    }
    console.print(f"adaptive at Poisson 80%: {at80['attainment']:.3%} within {slo_ms} ms "
                  f"(target 99.9%: {'met' if targets['attainment_poisson80_ge_99.9'] else 'NOT met'})")
    console.print(f"adaptive attainment >= every other policy's in {len(adaptive['cells']) - len(shortfalls)}"
                  f"/{len(adaptive['cells'])} cells" + (f"; short in {shortfalls}" if shortfalls else ""))
    console.print(f"adaptive max throughput {adaptive['max_rps']:.0f} req/s = {ratio:.2f}x the best static "
                  f"({best_static:.0f}) (target 0.9x: {'met' if ratio >= 0.9 else 'NOT met'})")
    summary = {k: {"max_rps": v["max_rps"],
                   "attainment": {f"{c['arrival']}@{c['load']}": round(c["attainment"], 4) for c in v["cells"]},
                   "p99_ms": {f"{c['arrival']}@{c['load']}": c["p99_ms"] for c in v["cells"]},
                   "throughput_rps": {f"{c['arrival']}@{c['load']}": c["throughput_rps"] for c in v["cells"]},
                   "worker": v.get("worker", {})}
               for k, v in results.items()}
    return {"workload": "batching", "capacity_rps": round(capacity, 1), "slo_ms": slo_ms,
            "lone_latency_ms": round(lone_ms, 2), "per_request_ms_batch1": round(per1, 4),
            "per_request_ms_batch32": round(per32, 4), "cell_seconds": cell_seconds,
            "adaptive_max_rps_ratio_to_best_static": round(ratio, 3), "shortfalls": shortfalls,
            "targets": targets, "policies": summary}
