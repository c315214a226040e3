"""``flowserve bench models --fidelity``: the many-model simulator checked against LIVE runs on this machine.

``flowserve bench models`` shows 1,000-4,000 models in the simulator (:mod:`flowserve.models.simulate`) because
two cores cannot run them live. This section runs what two cores can, both ways, on the SAME arrivals (one
seed: each request's model and arrival time): 100 emulated models (the catalogue's mix on an emulated T4,
``flowserve_bench/topologies/models-fidelity.yaml``) on 1 and 2 workers with device memory for about 5% of the
catalogue each, Zipf s 0.9 and 1.2, Poisson arrivals at 30%, 60% and 90% of capacity (all models resident,
99% within the SLO, found in the simulator with the live node's settings) for ``seconds`` each.

- **live**: ``flowserve worker`` processes on the broker (the many-model hook, :mod:`flowserve.models.stage`,
  on :class:`~flowserve_components.many_models.EmulatedModels`, which sleeps each load's and batch's time),
  cold at the start of each cell; requests sent open-loop at their arrival times by the async Kafka client,
  ``fs-model`` naming the model, each to its placed partition (:class:`~flowserve.models.ModelRouter`, placed
  from the workload's popularity) with its deadline (the SLO); answers and refusals read back at the client,
  ``fs-served-by`` checked; loads and evictions from the workers' metric snapshots.
- **sim**: the same catalogue, placement (same partitions, same hot-model replicas, the same turns) and
  scheduler settings as the live hook (:class:`~flowserve.models.scheduler.Scheduler` with the node's
  ``max_batch`` and ``margin``, horizon 0, cold), no jitter (an emulated device sleeps its mean), and the
  hook's granularity (``intake``: a worker takes in what waited for it, up to the node's ``max_batch``, only
  once its previous intake is answered whole, each answer leaving as its batch ends; :func:`flowserve.models.run`)
  and the worker's turnaround between intakes (:func:`turnaround`, measured once per run on the broker).
  It adds the live overhead outside the device, MEASURED per cell after its arrivals (sequential requests to a
  resident model: round trip minus its batch time, median of 20), half before the worker (its deadline is the
  client's) and half after. ``sim_per_request`` is the simulator as ``flowserve bench models`` runs it (each
  request reaches the scheduler on arrival and leaves when its batch ends), with the same hop;
  ``sim_no_turnaround`` and ``sim_no_hop`` are ``sim`` without either.

Targets per cell: live attainment within 2 points of ``sim``'s, live loads within 15% of ``sim``'s.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from flowserve.client import TopologyClient
from flowserve.gateway.health import ReadinessProbe
from flowserve.kafka.replies import Reply
from flowserve.kafka.settings import KafkaSettings
from flowserve.models import Catalogue, ModelRouter, Placement, Scheduler, Workload, model_hooks, poisson_zipf, run
from flowserve.runtime.hooks import StageHooks, chain
from flowserve.runtime.host import InlineHost, ProcessHost
from flowserve.runtime.metrics import read_snapshots
from flowserve.topology import Topology, load_topology, load_topology_text
from flowserve.topology.graph import Node
from flowserve.topology.spec import ModelsSpec
from flowserve.wire.envelope import H_MODEL, H_SERVED_BY
from flowserve_bench import graphs
from flowserve_bench.common import console, run_id

TOPOLOGY = "models-fidelity.yaml"
ATTAINMENT_POINTS = 0.02
LOADS_SHARE = 0.15
CAPACITY_ATTAINMENT = 0.99
#: sequential requests per cell that measure the overhead outside the device (the first may load)
HOP_PROBES = 21
#: requests of each burst that measures the worker's turnaround between intakes, and bursts
BURST, BURSTS = 400, 3
X = np.ones((1, 4), np.float32)


# -- accounting (pure: a unit test feeds it a known-bad live run) ------------------------------------------

def figures(latency: np.ndarray, ok: np.ndarray, refused: np.ndarray, slo_s: float, loads: int,
            evictions: int) -> dict[str, Any]:
    """One side's figures from per-request latencies (NaN: no answer), answered-ok and refused flags."""
    n = latency.size
    answered = ok & ~np.isnan(latency)
    within = answered & (latency <= slo_s)
    late = answered & (latency > slo_s)
    lat = latency[answered] * 1000
    return {"sent": int(n), "attainment": float(within.sum() / n) if n else 0.0,
            "refused": float(refused.sum() / n) if n else 0.0, "late": float(late.sum() / n) if n else 0.0,
            "lost": int(n - answered.sum() - refused.sum()), "loads": int(loads), "evictions": int(evictions),
            "p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),
            "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan")}


def cell_key(workers: int, s: float, load: float) -> str:
    return f"w{workers}_s{s}_{load:.0%}"


def compare(live: Mapping[str, Any], sim: Mapping[str, Any]) -> dict[str, Any]:
    """Live against the simulator (``sim``): the differences and whether each is within its bar."""
    d_att = live["attainment"] - sim["attainment"]
    d_loads = (live["loads"] - sim["loads"]) / max(sim["loads"], 1)
    return {"d_attainment_pts": 100 * d_att, "d_loads_pct": 100 * d_loads,
            "attainment_ok": bool(abs(d_att) <= ATTAINMENT_POINTS), "loads_ok": bool(abs(d_loads) <= LOADS_SHARE)}


def fidelity_targets(rows: Sequence[Mapping[str, Any]]) -> dict[str, bool]:
    """Per cell: ``fidelity_attainment_within_2pts`` and ``fidelity_loads_within_15pct``."""
    out: dict[str, bool] = {}
    for r in rows:
        key = cell_key(r["workers"], r["s"], r["load"])
        c = compare(r["live"], r["sim"])
        out[f"fidelity_attainment_within_2pts/{key}"] = c["attainment_ok"]
        out[f"fidelity_loads_within_15pct/{key}"] = c["loads_ok"]
    return out


# -- the simulator's side -----------------------------------------------------------------------------

def placed(workers: int, partitions: int, shares: Mapping[str, float]) -> Placement:
    placement = Placement(workers, partitions=partitions)
    placement.place(shares)
    return placement


def simulate(catalogue: Catalogue, spec: ModelsSpec, workload: Workload, workers: int, partitions: int, *,
             hop_s: float = 0.0, intake: int = 0, turnaround_s: float = 0.0) -> dict[str, Any]:
    """The cell in the simulator with the live hook's settings; ``hop_s``: the round trip outside the
    device, half before the worker (it sees the client's deadline) and half after its answer; ``intake``:
    the hook's granularity (:func:`flowserve.models.run`), 0 for none; ``turnaround_s``: the worker's time
    between intakes."""
    slo = spec.slo_ms / 1000
    capacity = int(spec.memory_mb * 1e6) if spec.memory_mb is not None else catalogue.total_bytes
    policies = [Scheduler(catalogue, capacity, max_batch=spec.max_batch, margin=spec.margin, horizon=0.0)
                for _ in range(workers)]
    shifted = Workload(workload.arrivals + hop_s / 2, workload.models, workload.popularity)
    out = run(shifted, catalogue, placed(workers, partitions, workload.shares(catalogue)), policies,
              slo_s=slo - hop_s / 2, intake=intake,
              turnaround_s=turnaround_s)
    latency = out.finish + hop_s / 2 - workload.arrivals
    assert out.taken is not None
    intakes = len({(int(k), float(t)) for k, t in zip(out.worker, out.taken, strict=True)})
    return {**figures(latency, out.answered(), out.refused, slo, sum(out.loads), sum(out.evictions)),
            # from the client's send to its intake at the worker, as the worker's queue.wait measures it
            "wait_ms": 1000 * float(np.mean(out.taken - workload.arrivals + hop_s / 2)) if intakes else 0.0,
            "intake": float(out.arrival.size / intakes) if intakes else 0.0}


def capacity(catalogue: Catalogue, spec: ModelsSpec, s: float, workers: int, partitions: int, *,
             seconds: float, seed: int, steps: int = 8) -> float:
    """The highest Poisson rate at which ``workers`` workers holding every model answer 99% within the SLO
    (bisection, simulated, the live node's settings)."""
    every = spec.model_copy(update={"memory_mb": catalogue.total_bytes / 1e6})
    mean_one = float(np.mean([m.batch_s(1) for m in catalogue]))
    lo, hi = 0.25 * workers / mean_one, 4.0 * workers / mean_one
    for _ in range(steps):
        mid = (lo + hi) / 2
        wl = poisson_zipf(len(catalogue), rate=mid, seconds=seconds, s=s, seed=seed)
        lo, hi = (mid, hi) if simulate(catalogue, every, wl, workers, partitions)["attainment"] >= \
            CAPACITY_ATTAINMENT else (lo, mid)
    return lo


# -- the live side --------------------------------------------------------------------------------------

async def _stable(probe: ReadinessProbe, name: str, workers: int) -> None:
    async with asyncio.timeout(120):
        while (await probe.check(0.0))[name].members.get("zoo") != workers:
            await asyncio.sleep(0.2)


def _stamp(got: np.ndarray, i: int, loop: asyncio.AbstractEventLoop) -> Callable[[asyncio.Future[Reply]], None]:
    """A done-callback that notes when request ``i``'s reply came (the loop's clock)."""
    def done(_: asyncio.Future[Reply]) -> None:
        got[i] = loop.time()
    return done


async def _drive(client: TopologyClient, router: ModelRouter, names: Sequence[str], wl: Workload, slo_ms: float,
                 tag: str) -> dict[str, np.ndarray]:
    """Send every request open-loop at its arrival time; per request its send lag, latency at the client
    (NaN: no answer), whether it was answered by its model, refused (kind ``deadline``)."""
    loop = asyncio.get_running_loop()
    n = wl.arrivals.size
    sent, got = np.full(n, np.nan), np.full(n, np.nan)
    futures: list[asyncio.Future[Reply]] = []
    start = loop.time() + 0.2
    i = 0
    while i < n:
        wait = start + wl.arrivals[i] - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        while i < n and start + wl.arrivals[i] <= loop.time():
            model = names[int(wl.models[i])]
            fut = client.expect(f"{tag}-{i}", timeout_s=slo_ms / 1000 + 10)
            fut.add_done_callback(_stamp(got, i, loop))
            futures.append(fut)
            sent[i] = loop.time()
            await client.queue({"x": X}, request_id=f"{tag}-{i}", headers={H_MODEL: model},
                               timeout_ms=int(slo_ms), partition=router.partition(model))
            i += 1
        await client.flush()
    replies = await asyncio.gather(*futures, return_exceptions=True)
    ok, refused = np.zeros(n, bool), np.zeros(n, bool)
    for k, reply in enumerate(replies):
        if isinstance(reply, BaseException):
            got[k] = np.nan
        elif reply.error is not None:
            refused[k] = reply.error_kind is not None and reply.error_kind.value == "deadline"
            got[k] = np.nan
        else:
            ok[k] = reply.headers.get(H_SERVED_BY) == names[int(wl.models[k])].encode()
    return {"lag": sent - (start + wl.arrivals), "latency": got - sent, "ok": ok, "refused": refused}


async def _hop(client: TopologyClient, router: ModelRouter, model: str, slo_ms: float, tag: str) -> float:
    """The overhead outside the device: sequential requests to ``model`` (resident after the first), the
    median of round trip minus its batch time is taken by the caller; here the round trips."""
    loop = asyncio.get_running_loop()
    trips = []
    for k in range(HOP_PROBES):
        t = loop.time()
        reply = await client.call({"x": X}, request_id=f"{tag}-hop{k}", headers={H_MODEL: model},
                                  timeout_ms=int(10 * slo_ms), partition=router.partition(model))
        if reply.error is None and k:
            trips.append(loop.time() - t)
    return float(np.median(trips)) if trips else float("nan")


class _Intakes(StageHooks):
    """Notes when each step's records arrive (:meth:`admit`) and when the hooks have answered them
    (:meth:`begin`, once per part of an answer): the turnaround is the time from one intake's last answers
    to the next intake."""

    def __init__(self) -> None:
        self.admitted: list[float] = []
        self.answered: list[float] = []

    def admit(self, records: list[Any]) -> list[Any]:
        if records:
            self.admitted.append(time.monotonic())
        return records

    def begin(self, items: Sequence[Any]) -> None:
        self.answered.append(time.monotonic())

    def gaps(self) -> list[float]:
        out = []
        for a, b in zip(self.admitted, self.admitted[1:], strict=False):
            last = max((t for t in self.answered if a <= t < b), default=None)
            if last is not None:
                out.append(b - last)
        return out


async def turnaround(kafka: KafkaSettings) -> float:
    """The worker's time between intakes (it produces an intake's answers, waits for the broker's
    acknowledgement, commits and fetches again: ``Worker.step``), measured on this broker: the node in this
    process, bursts of :data:`BURST` requests for one resident model (each step takes in 64 while the rest
    wait), the median gap from one intake's answers to the next intake. Seconds."""
    name = f"mfidt{run_id()}{uuid.uuid4().hex[:4]}"
    topology = load_topology_text(graphs.text(TOPOLOGY, name), source="bench")
    timing = _Intakes()

    def timed(_t: Topology, node: Node, _c: Any) -> list[StageHooks]:
        return [timing] if node.models is not None else []

    async with InlineHost(topology, kafka, hooks=chain(model_hooks(kafka), timed)) as _, \
            TopologyClient(topology, kafka) as client:
        await client.call({"x": X}, request_id=f"{name}-warm", timeout_ms=60_000, headers={H_MODEL: "m-00000"},
                          partition=0)
        gaps: list[float] = []
        for b in range(BURSTS):
            timing.admitted.clear()
            timing.answered.clear()
            futures = [client.expect(f"{name}-{b}-{i}") for i in range(BURST)]
            for i in range(BURST):
                await client.queue({"x": X}, request_id=f"{name}-{b}-{i}", timeout_ms=60_000,
                                   headers={H_MODEL: "m-00000"}, partition=i % topology.spec.partitions)
            await client.flush()
            await asyncio.gather(*futures)
            gaps += timing.gaps()
    return float(np.median(gaps)) if gaps else 0.0


async def live_cell(kafka: KafkaSettings, workers: int, memory_mb: float, wl: Workload, shares: Mapping[str, float],
                    folder: Path) -> dict[str, Any]:
    """One cell live: fresh topics and cold workers; the requests' outcomes, counters and the hop."""
    name = f"mfid{run_id()}{uuid.uuid4().hex[:4]}"
    path = folder / f"{name}.yaml"
    path.write_text(graphs.text(TOPOLOGY, name, {"nodes.zoo.replicas": workers,
                                                 "nodes.zoo.models.memory_mb": memory_mb}))
    topology = load_topology(path)
    spec = topology.nodes["zoo"].models
    assert spec is not None
    catalogue = Catalogue.declared(spec)
    names = [m.name for m in catalogue]
    host = ProcessHost(path, topology, kafka, log_dir=folder / "logs")
    await host.start()
    probe = ReadinessProbe([topology], kafka, cache_s=0.0)
    try:
        await _stable(probe, topology.name, workers)
        router = ModelRouter(topology.spec.partitions, workers=workers)
        router.placement.place(shares)
        async with TopologyClient(topology, kafka) as client:
            # one request naming no model per partition: answered (invalid_input) without a load, so the
            # consumers have fetched before the first timed request and the workers stay cold
            for p in range(topology.spec.partitions):
                await client.call({"x": X}, request_id=f"{name}-warm{p}", timeout_ms=60_000, partition=p)
            got = await _drive(client, router, names, wl, spec.slo_ms, name)
            answers = int(got["ok"].sum())
            async with asyncio.timeout(60):  # the workers' counters once they count every answer
                while True:
                    found = [s for s in await read_snapshots(topology, kafka, timeout_s=5.0) if s.get("node") == "zoo"]
                    snaps, metrics = [s["counters"] for s in found], [s.get("metrics", {}) for s in found]
                    if len(snaps) == workers and sum(c.get("model_answers", 0) for c in snaps) >= answers:
                        break
                    await asyncio.sleep(0.5)
            hottest = names[int(np.argmax(wl.popularity))]
            trip = await _hop(client, router, hottest, spec.slo_ms, name)
    finally:
        await probe.close()
        host.stop()
    return {**got, "loads": sum(c.get("model_loads", 0) for c in snaps), "wait_ms": _mean(metrics, "queue.wait"),
            "evictions": sum(c.get("model_evictions", 0) for c in snaps),
            "hop_s": trip - catalogue.spec(hottest).batch_s(1), "spec": spec, "catalogue": catalogue}


def _mean(metrics: Sequence[Mapping[str, Any]], name: str) -> float:
    """A histogram's mean over the workers' snapshots (weighted by their counts); NaN without one."""
    parts = [m[name] for m in metrics if m.get(name, {}).get("count")]
    total = sum(p["count"] for p in parts)
    return sum(p["mean"] * p["count"] for p in parts) / total if total else float("nan")


async def fidelity_bench(kafka: KafkaSettings, *, workers: Sequence[int] = (1, 2), zipf_s: Sequence[float] = (0.9, 1.2),
                         loads: Sequence[float] = (0.3, 0.6, 0.9), seconds: float = 20.0, seed: int = 0,
                         broker: str = "", log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Every cell live, then in the simulator on the same arrivals; rows, differences and targets."""
    wall = time.perf_counter()
    base = graphs.load(TOPOLOGY, "x")
    spec = base.nodes["zoo"].models
    assert spec is not None
    catalogue = Catalogue.declared(spec)
    partitions = base.spec.partitions
    intake = base.nodes["zoo"].max_batch  # the worker's Kafka batch: what the hook takes in at once
    slo = spec.slo_ms / 1000
    rows: list[dict[str, Any]] = []
    turn = await turnaround(kafka)
    if log:
        log(f"the worker's turnaround between intakes on this broker: {1000 * turn:.1f} ms (median)")
    with tempfile.TemporaryDirectory(prefix="fs-fidelity-") as tmp:
        for w in workers:
            for s in zipf_s:
                cap = capacity(catalogue, spec, s, w, partitions, seconds=10.0, seed=seed)
                for load in loads:
                    wl = poisson_zipf(len(catalogue), rate=load * cap, seconds=seconds, s=s, seed=seed)
                    got = await live_cell(kafka, w, spec.memory_mb or 0, wl, wl.shares(catalogue), Path(tmp))
                    hop = float(got["hop_s"])
                    live = {**figures(got["latency"], got["ok"], got["refused"], slo, got["loads"], got["evictions"]),
                            "wait_ms": got["wait_ms"]}
                    sim = simulate(catalogue, spec, wl, w, partitions, hop_s=max(hop, 0.0), intake=intake,
                                   turnaround_s=turn)
                    c = compare(live, sim)
                    row: dict[str, Any] = {
                        "workers": w, "s": s, "load": load, "rate": load * cap, "live_within": live["attainment"],
                        "sim_within": sim["attainment"], "live_loads": live["loads"], "sim_loads": sim["loads"],
                        "d_attainment_pts": c["d_attainment_pts"], "d_loads_pct": c["d_loads_pct"],
                        "requests": int(wl.arrivals.size), "hop_ms": 1000 * hop,
                        "send_lag_p99_ms": 1000 * float(np.nanpercentile(got["lag"], 99)),
                        "load_average": os.getloadavg()[0],
                        "attainment_ok": c["attainment_ok"], "loads_ok": c["loads_ok"], "live": live, "sim": sim,
                        "sim_per_request": simulate(catalogue, spec, wl, w, partitions, hop_s=max(hop, 0.0)),
                        "sim_no_turnaround": simulate(catalogue, spec, wl, w, partitions, hop_s=max(hop, 0.0),
                                                      intake=intake),
                        "sim_no_hop": simulate(catalogue, spec, wl, w, partitions, intake=intake,
                                               turnaround_s=turn)}
                    rows.append(row)
                    if log:
                        sm, pr = row["sim"], row["sim_per_request"]
                        log(f"{w} worker(s), s={s}, {load:.0%} ({load * cap:.0f} req/s): live "
                            f"{live['attainment']:.2%} within, refused {live['refused']:.2%}, late {live['late']:.2%}, "
                            f"loads {live['loads']}, p50/p99 {live['p50_ms']:.1f}/{live['p99_ms']:.1f} ms, wait "
                            f"{live['wait_ms']:.1f} ms; sim (intake {intake}, hop {1000 * hop:.1f} ms) "
                            f"{sm['attainment']:.2%}, refused {sm['refused']:.2%}, late {sm['late']:.2%}, loads "
                            f"{sm['loads']}, p50/p99 {sm['p50_ms']:.1f}/{sm['p99_ms']:.1f} ms, wait "
                            f"{sm['wait_ms']:.1f} ms, mean intake {sm['intake']:.1f}; no turnaround "
                            f"{row['sim_no_turnaround']['attainment']:.2%}; per request (as bench models) "
                            f"{pr['attainment']:.2%}, loads {pr['loads']}; no hop "
                            f"{row['sim_no_hop']['attainment']:.2%}; send lag p99 "
                            f"{row['send_lag_p99_ms']:.1f} ms; load average {row['load_average']:.1f}")
    _print(rows)
    return {"workload": "models", "part": "fidelity", "broker": broker,
            "note": "live: flowserve worker processes on the broker, emulated models (sleeps); sim: "
                    "flowserve.models.simulate on the same arrivals, placement and scheduler settings, the hook's "
                    "intake, the measured turnaround and hop; sim_per_request: as bench models simulates",
            "models": len(catalogue), "memory_mb_per_worker": spec.memory_mb,
            "memory_share_per_worker": (spec.memory_mb or 0) * 1e6 / catalogue.total_bytes,
            "slo_ms": spec.slo_ms, "seconds": seconds, "intake": intake, "turnaround_ms": 1000 * turn, "rows": rows,
            "wall_s": time.perf_counter() - wall, "targets": fidelity_targets(rows)}


def _print(rows: Sequence[Mapping[str, Any]]) -> None:
    table = Table(title="many models: LIVE vs SIMULATED (intake and measured hop modelled; per request: as bench "
                  "models), same arrivals")
    for col in ("workers", "s", "load", "req/s", "hop ms", "within live/sim/per request", "refused live/sim",
                "late live/sim", "loads live/sim", "evict live/sim", "p50 ms live/sim", "p99 ms live/sim"):
        table.add_column(col, justify="right")
    for r in rows:
        lv, sh, sm = r["live"], r["sim"], r["sim_per_request"]
        table.add_row(str(r["workers"]), f"{r['s']}", f"{r['load']:.0%}", f"{r['rate']:.0f}", f"{r['hop_ms']:.1f}",
                      f"{lv['attainment']:.2%}/{sh['attainment']:.2%}/{sm['attainment']:.2%}",
                      f"{lv['refused']:.2%}/{sh['refused']:.2%}", f"{lv['late']:.2%}/{sh['late']:.2%}",
                      f"{lv['loads']}/{sh['loads']}", f"{lv['evictions']}/{sh['evictions']}",
                      f"{lv['p50_ms']:.1f}/{sh['p50_ms']:.1f}", f"{lv['p99_ms']:.1f}/{sh['p99_ms']:.1f}")
    console.print(table)
