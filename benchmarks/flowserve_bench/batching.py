"""SLO-aware batching vs static and timeout batching, on a compute-heavy node behind the real broker.

One node, ``flowserve_components.torch_stage:TorchClassifier`` with the ``digits-cnn`` model (one torch thread):
a call costs about a millisecond whatever the batch, so batching matters. The adaptive node's
``max_batch`` is the component's own (256), and the static batches span the same range, up to 256
(:data:`STATIC_SIZES`): the best fixed batch is in the table whatever it is. A static or timeout node's
``max_batch`` is its own batch, at least 32 (a node maximum above the batch only makes the fixed policy
fetch more per step, measured slower). Each policy runs in its own worker process (``flowserve worker``)
exactly as deployed, all side by side; this process sends open-loop traffic to one at a time and reads
the replies. Steps:

1. profile the node (``flowserve profile``, batch sizes up to the node's maximum);
2. the SLO: 10x the lone-request end-to-end latency, the median over every static policy in turn (a lone
   request is a batch of one on each, so it is the node's and the path's latency, not one worker's);
3. maximum throughput: each policy works off a backlog, ``rounds`` times, in balanced order
   (:func:`~flowserve_bench.paired.balanced_order`); adaptive / best static with a 95% interval over rounds;
4. the capacity: the highest open-loop Poisson rate the best static policy keeps up with — every request
   answered, p99 within the SLO, in the median of 3 interleaved 2-s probes per policy and rate — ramping
   x1.2 from a quarter of the best static's drain rate, then one bisection step
   (:mod:`flowserve_bench.batching_capacity`). The drain rate of a backlog overstates it: open-loop
   traffic makes the client, the broker and the worker share the CPUs while requests are paced one by one;
5. cells: Poisson and bursty (Gamma, CV 4) arrivals at 10/50/80/95% of capacity. Per cell the policies
   take ``rounds`` slices each of ``cell_seconds``, interleaved in balanced order; slice ``i`` of every
   policy replays the same arrival trace, so slices pair up (:mod:`flowserve_bench.attainment`).

Per cell and policy: SLO attainment = replies without error within the SLO / requests sent (refused,
doomed, expired, late and lost all count as misses) with a 95% bootstrap interval over slices, what
became of the misses, and the mean batch (from the worker's metrics); then adaptive minus the best other
policy, in points, with its paired interval. The last line is JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from flowserve.client import TopologyClient
from flowserve.client.kafka import Reply
from flowserve.client.traffic import wait_ready
from flowserve.component import import_library
from flowserve.errors import ErrorKind
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.topology import load_topology
from flowserve_bench import graphs, paired
from flowserve_bench.attainment import Tally, attainment, difference
from flowserve_bench.batching_capacity import REPEATS, sustainable_rates
from flowserve_bench.common import console, run_id

#: the adaptive node's largest batch: TorchClassifier's own ``max_batch`` (no cap in its topology)
MAX_BATCH = 256
#: the static batches, over the same range as adaptive's: up to its cap
STATIC_SIZES = (1, 8, 32, MAX_BATCH)
#: the smallest node ``max_batch`` of a static or timeout node (and the per-request cost printed beside batch 1)
STATIC = 32
POLICIES: dict[str, str] = {
    **{f"static-{n}": f"{{policy: fixed, size: {n}}}" for n in STATIC_SIZES},
    "timeout-32/10ms": "{policy: timeout, size: 32, max_wait_ms: 10}",
    "adaptive": "{policy: slo}",
}
#: each policy's node ``max_batch`` (None: the component's own)
CAPS: dict[str, int | None] = {**{f"static-{n}": max(n, STATIC) for n in STATIC_SIZES},
                               "timeout-32/10ms": STATIC, "adaptive": None}
STATICS = [label for label in POLICIES if label.startswith("static-")]
#: seconds of one capacity probe
PROBE_SECONDS = 2.0
LOADS = (0.10, 0.50, 0.80, 0.95)
ARRIVALS = ("poisson", "bursty")
BACKLOG = 2000
#: what became of each request sent, in the order the tables print them
OUTCOMES = ("within", "late", "refused", "deadline", "failed", "lost")
#: the paired difference adaptive - other may not reach below this (attainment points / 100)
TOLERANCE = 0.005


def topology_text(name: str, batching: str, max_batch: int | None = None) -> str:
    """``topologies/batching.yaml`` under ``name``, its node batching by the policy ``batching`` (YAML),
    with ``max_batch`` (none: the component's own)."""
    return graphs.text("batching.yaml", name, {"nodes.model.batching": yaml.safe_load(batching),
                                               "nodes.model.max_batch": max_batch or graphs.DROP})


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
    outcomes = dict.fromkeys(OUTCOMES, 0)
    last_ms = epoch0
    for rid, due in scheduled.items():
        reply = collector.got.pop(rid, None)
        if reply is None:
            outcomes["lost"] += 1
            continue
        last_ms = max(last_ms, reply.received_ms)
        if reply.error is not None:
            errors += 1
            failure = reply.error_kind
            # a deadline error is either dropped early (doomed) or expired: the worker's counters split them
            outcomes["refused" if failure is ErrorKind.REFUSED else "deadline" if failure is ErrorKind.DEADLINE
                     else "failed"] += 1
            continue
        latency = float(reply.received_ms - due)
        latencies.append(latency)
        within += int(latency <= slo_ms)
        outcomes["within" if latency <= slo_ms else "late"] += 1
    sent = len(scheduled)
    span = max(seconds, (last_ms - epoch0) / 1000)
    return {"arrival": kind, "rate": round(rate, 1), "sent": sent, "ok": len(latencies), "errors": errors,
            "throughput_rps": round(len(latencies) / span, 1),
            "p50_ms": round(float(np.percentile(latencies, 50)), 2) if latencies else None,
            "p99_ms": round(float(np.percentile(latencies, 99)), 2) if latencies else None,
            "attainment": float(within / sent) if sent else 1.0, "within": within, "outcomes": outcomes}


async def _drain(client: TopologyClient, collector: Collector, inputs: list[dict[str, np.ndarray]],
                 tag: str, n: int = BACKLOG) -> paired.Slice:
    """A backlog of ``n`` worked off: requests answered and the seconds it took (the maximum throughput)."""
    rids = [f"{tag}-{i}" for i in range(n)]
    t0 = time.time() * 1000
    for i, rid in enumerate(rids):
        await client.queue(inputs[i % len(inputs)], request_id=rid, timeout_ms=300_000)
    await client.flush()
    await collector.wait_for(rids, time.monotonic() + 120)
    replies = [collector.got.pop(r) for r in rids if r in collector.got]
    done = sum(r.error is None for r in replies)
    last = max((r.received_ms for r in replies), default=t0 + 1)
    return paired.Slice(done, (last - t0) / 1000)


async def _lone_latencies(client: TopologyClient, inputs: list[dict[str, np.ndarray]], n: int) -> list[float]:
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        reply = await client.call(inputs[i % len(inputs)], timeout_ms=10_000)
        if reply.error is None:
            lat.append((time.perf_counter() - t0) * 1000)
    return lat


class _Policy:
    """One policy's worker process and a client, for the duration of a ``with``."""

    def __init__(self, kafka: KafkaSettings, workdir: Path, label: str, name: str, profile: Path | None) -> None:
        self.path = workdir / f"{name}.yaml"
        # The static and timeout baselines keep the node at their own batch (at least 32), as they are
        # deployed: a node maximum above it only makes the fixed policy fetch more per step, measured slower.
        self.path.write_text(topology_text(name, POLICIES[label], CAPS[label]))
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

    async def counters(self) -> dict[str, float]:
        """The worker's counters and batch-size histogram so far (from its latest metrics snapshot)."""
        from flowserve.runtime.metrics import read_snapshots

        snaps = await read_snapshots(self.topology, self.kafka)
        out = {k: float(sum(int(s.get("counters", {}).get(k, 0)) for s in snaps))
               for k in ("requests_ok", "refused", "expired", "doomed", "late", "batches")}
        size = [s.get("metrics", {}).get("batch.size", {}) for s in snaps]
        out["batch_sum"] = float(sum(h.get("mean", 0.0) * h.get("count", 0) for h in size))
        out["batch_count"] = float(sum(h.get("count", 0) for h in size))
        return out

    async def __aexit__(self, *exc: object) -> None:
        await self.collector.stop()
        await self.client.stop()
        self.host.stop()


async def batching(kafka: KafkaSettings, cell_seconds: float = 3.0, rounds: int = 4) -> dict[str, Any]:
    from flowserve.tuning.profile import profile_topology

    inputs = _inputs()
    bid = run_id()
    labels = list(POLICIES)
    with tempfile.TemporaryDirectory(prefix="fs-bench-batching-") as tmp:
        workdir = Path(tmp)
        base = workdir / "profiled.yaml"
        base.write_text(topology_text("profiled", POLICIES["adaptive"]))
        console.print(f"profiling the node (TorchClassifier digits-cnn, 1 torch thread, batches up to {MAX_BATCH})…")
        profile, timings = profile_topology(base, "model", max_batch=MAX_BATCH, repeats=30)
        by_size = {t.size: t for t in timings["model"]}
        per1, per32 = by_size[1].p50_s * 1000, by_size[STATIC].p50_s * 1000 / STATIC
        perbig = by_size[MAX_BATCH].p50_s * 1000 / MAX_BATCH
        console.print(f"  process() per request: batch 1 {per1:.3f} ms, batch {STATIC} {per32:.3f} ms "
                      f"({per1 / per32:.1f}x cheaper batched), batch {MAX_BATCH} {perbig:.3f} ms")
        policies = {label: _Policy(kafka, workdir, label, f"bb{bid}p{k}", profile if label == "adaptive" else None)
                    for k, label in enumerate(labels)}
        async with contextlib.AsyncExitStack() as stack:
            console.print(f"deploying the {len(labels)} policies side by side, one worker process each…")
            sides = {label: await stack.enter_async_context(policy) for label, policy in policies.items()}
            console.print(f"lone-request latency, each static policy in turn ({', '.join(STATICS)})…")
            lone: list[float] = []
            for _ in range(3):
                for label in STATICS:
                    lone += await _lone_latencies(sides[label][0], inputs, 20)
            lone_ms = float(np.median(lone))
            slo_ms = round(10 * lone_ms, 1)
            console.print(f"  lone request {lone_ms:.2f} ms end to end (median of {len(lone)}) -> SLO {slo_ms:.1f} ms")

            order = paired.balanced_order(labels, rounds)
            console.print(f"maximum throughput: a backlog of {BACKLOG}, {len(order) // len(labels)} times per policy, "
                          "interleaved…")
            drains: dict[str, list[paired.Slice]] = {label: [] for label in labels}
            for j, label in enumerate(order):
                c, col = sides[label]
                drains[label].append(await _drain(c, col, inputs, f"{label}-max{j}"))
            for label in labels:
                console.print(f"  {label:<16} {paired.throughput(drains[label]):>6.0f} req/s")
            drain = max(paired.throughput(drains[label]) for label in STATICS)

            async def probe(label: str, rate: float, seed: int) -> dict[str, Any]:
                c, col = sides[label]
                return await _cell(c, col, inputs, tag=f"probe-{label}-{rate:.0f}-{seed}", kind="poisson", rate=rate,
                                   seconds=PROBE_SECONDS, slo_ms=slo_ms, seed=seed)

            console.print(f"capacity: open-loop Poisson probes of every static policy, {REPEATS} interleaved "
                          f"{PROBE_SECONDS:g}-s probes per policy and rate, the median one deciding…")
            sustained = await sustainable_rates(probe, STATICS, slo_ms, 0.25 * drain, drain, log=console.print)
            best_static = max(STATICS, key=sustained.__getitem__)
            capacity = sustained[best_static]
            if capacity <= 0:
                raise RuntimeError("no static policy kept up with any probed rate; the machine is too loaded to "
                                   "benchmark")
            console.print(f"  capacity {capacity:.0f} req/s ({best_static}, the highest rate a static policy keeps "
                          f"up with: all answered, p99 <= SLO) = {capacity / drain:.2f}x the best backlog drain rate")

            cells = []
            for kind in ARRIVALS:
                for j, load in enumerate(LOADS):
                    before = {label: await policy.counters() for label, policy in policies.items()}
                    slices: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
                    for label in order:
                        c, col = sides[label]
                        k = len(slices[label])  # slice k of every policy replays the same trace
                        slices[label].append(await _cell(
                            c, col, inputs, tag=f"{label}-{kind}-{load}-{k}", kind=kind, rate=load * capacity,
                            seconds=cell_seconds, slo_ms=slo_ms, seed=1000 + 100 * (j + 4 * (kind == "bursty")) + k))
                    await asyncio.sleep(2.5)  # every worker publishes its metrics every 2 s
                    after = {label: await policy.counters() for label, policy in policies.items()}
                    cell = _cell_summary(kind, load, load * capacity, slices, before, after)
                    cells.append(cell)
                    _print_cell(cell, len(order) // len(labels), cell_seconds)

    report = _report(cells, drains, capacity, slo_ms, lone_ms, per1, per32, cell_seconds, rounds)
    report.update({
        "per_request_ms_batch256": round(perbig, 4), "best_static_drain_rps": round(drain, 1),
        "capacity_policy": best_static, "sustained_rps": {k: round(v, 1) for k, v in sustained.items()},
        # a sustained rate of 0: fell behind at every rate it was probed at, from probed_from_rps
        "probed_from_rps": round(0.25 * drain, 1), "slices_per_policy": len(order) // len(labels),
        "slo_method": f"10x the median lone-request latency over {', '.join(STATICS)} ({len(lone)} calls)",
        "capacity_method": (f"highest open-loop Poisson rate the best static policy keeps up with (all answered, "
                            f"p99 <= SLO) in the median of {REPEATS} interleaved {PROBE_SECONDS:g}-s probes per "
                            "policy and rate")})
    return report


def _cell_summary(kind: str, load: float, rate: float, slices: dict[str, list[dict[str, Any]]],
                  before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, Any]:
    """One cell: per policy its attainment with an interval, outcomes and batches; adaptive vs the others."""
    tallies = {label: [Tally(s["sent"], s["within"]) for s in ss] for label, ss in slices.items()}
    policies: dict[str, Any] = {}
    for label, ss in slices.items():
        point, low, high = attainment(tallies[label])
        delta = {k: after[label][k] - before[label][k] for k in after[label]}
        batches = delta["batch_count"] or delta["batches"]
        mean_batch = (delta["batch_sum"] if delta["batch_count"] else delta["requests_ok"]) / batches if batches else 0
        latencies = [s["p99_ms"] for s in ss if s["p99_ms"] is not None]
        policies[label] = {
            "attainment": point, "interval": [low, high], "sent": sum(s["sent"] for s in ss),
            "outcomes": {k: sum(s["outcomes"][k] for s in ss) for k in OUTCOMES},
            "worker": {k: int(delta[k]) for k in ("refused", "doomed", "expired", "late", "batches")},
            "mean_batch": round(mean_batch, 1), "p99_ms_worst_slice": max(latencies) if latencies else None,
            "throughput_rps": round(float(np.mean([s["throughput_rps"] for s in ss])), 1)}
    others = [label for label in slices if label != "adaptive"]
    best = max(others, key=lambda label: policies[label]["attainment"])
    diffs = {label: difference(tallies["adaptive"], tallies[label]) for label in others}
    return {"arrival": kind, "load": load, "rate": round(rate, 1), "policies": policies, "best_other": best,
            "diff_vs_best": list(diffs[best]), "diffs": {k: list(v) for k, v in diffs.items()},
            "dominates": all(low >= -TOLERANCE for _, low, _ in diffs.values())}


def _print_cell(cell: dict[str, Any], slices: int, seconds: float) -> None:
    console.print(f"[bold]{cell['arrival']} {cell['load']:.0%}[/] ({cell['rate']:.0f}/s; {slices} slices of "
                  f"{seconds:g} s per policy, interleaved)")
    console.print(f"  {'policy':<16} {'attainment [95% CI]':<26} {'late':>5} {'refused':>7} {'doomed':>6} "
                  f"{'expired':>7} {'lost':>5} {'batch':>6}")
    for label, p in cell["policies"].items():
        low, high = p["interval"]
        w, o = p["worker"], p["outcomes"]
        console.print(f"  {label:<16} {p['attainment']:8.3%} [{low:7.3%}, {high:7.3%}] {o['late']:>5} "
                      f"{o['refused']:>7} {w['doomed']:>6} {w['expired']:>7} {o['lost'] + o['failed']:>5} "
                      f"{p['mean_batch']:>6.1f}")
    d, low, high = cell["diff_vs_best"]
    console.print(f"  adaptive - best other ({cell['best_other']}): {d * 100:+.2f} points [{low * 100:+.2f}, "
                  f"{high * 100:+.2f}]; vs every other >= -{TOLERANCE * 100:g}: "
                  f"{'yes' if cell['dominates'] else 'NO'}")


def _report(cells: list[dict[str, Any]], drains: dict[str, list[paired.Slice]], capacity: float, slo_ms: float,
            lone_ms: float, per1: float, per32: float, cell_seconds: float, rounds: int) -> dict[str, Any]:
    at80 = next(c for c in cells if c["arrival"] == "poisson" and c["load"] == 0.80)["policies"]["adaptive"]
    short = [f"{c['arrival']}@{c['load']}" for c in cells if not c["dominates"]]
    statics = {k: paired.throughput(v) for k, v in drains.items() if k.startswith("static")}
    best_static = max(statics, key=statics.__getitem__)
    ratio, low, high = paired.throughput_ratio(drains["adaptive"], drains[best_static])
    lo80, hi80 = at80["interval"]
    targets = {  # each on its interval's conservative end
        "adaptive_ge_99_9pct_at_80pct_poisson": bool(lo80 >= 0.999),
        "adaptive_ge_every_policy_every_cell": not short,
        "max_throughput_ge_0_9x_best_static": bool(low >= 0.9),
    }
    console.print(f"adaptive at Poisson 80%: {at80['attainment']:.3%} [{lo80:.3%}, {hi80:.3%}] within {slo_ms} ms "
                  f"(target: low end >= 99.9%: {'met' if lo80 >= 0.999 else 'NOT met'})")
    console.print(f"adaptive >= every other policy (difference interval not below -{TOLERANCE * 100:g} points) in "
                  f"{len(cells) - len(short)}/{len(cells)} cells" + (f"; not in {short}" if short else ""))
    console.print(f"adaptive max throughput {paired.throughput(drains['adaptive']):.0f} req/s = {ratio:.2f}x "
                  f"[{low:.2f}, {high:.2f}] the best static ({best_static}, {statics[best_static]:.0f}) "
                  f"(target: low end >= 0.9x: {'met' if low >= 0.9 else 'NOT met'})")
    return {"workload": "batching", "capacity_rps": round(capacity, 1), "slo_ms": slo_ms,
            "lone_latency_ms": round(lone_ms, 2), "per_request_ms_batch1": round(per1, 4),
            f"per_request_ms_batch{STATIC}": round(per32, 4), "cell_seconds": cell_seconds, "rounds": rounds,
            "max_rps": {k: round(paired.throughput(v), 1) for k, v in drains.items()},
            "adaptive_max_rps_ratio_to_best_static": [round(ratio, 3), round(low, 3), round(high, 3)],
            "cells": cells, "not_dominated_in": short, "targets": targets}
