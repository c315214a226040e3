"""``flowserve bench tuner``: the simulator against live runs, and the tuner against two baselines.

**simulate** section: per pipeline (InferLine's four shapes, emulated stages), plan for a Poisson trace,
deploy the plan, replay the trace open-loop and compare the live p99 with the simulator's for the same
trace and plan. Two figures of this machine the planner and simulator use are measured first: the per-hop
Kafka latency, on a one-stage identity topology replayed the same way (half of each request's latency: two
hops), and the per-batch overhead of a worker besides its device, on a one-stage emulated accelerator at
batch 1 held at saturation (the gap between consecutive replies, less the device's time).

**tuner** section: one topology (``image-processing`` on the ``cpu`` kind only, so that a modest rate needs
several consumers), four traces (steady, a 2x step, gamma CV 4, diurnal compressed into the run), and
contenders each deployed afresh per trace: **static** provisioning for the peak (the plan for a sample
of the trace's arrival process at its peak rate: gamma keeps its CV, the others are Poisson), **keda**:
KEDA's Kafka scaler and the HPA as their users run them, on the ScaledObject ``flowserve deploy render``
writes for the plan (:mod:`flowserve_bench.keda`: minReplicaCount the plan's consumers, lagThreshold a
consumer's throughput within its SLO share, HPA defaults: a 15-s sync, 300-s scale-down stabilisation),
``keda-tuned`` (60-s stabilisation) where the trace is long enough for that to differ, and the flowserve
**tuner** (the adaptive ones start from the plan for a sample at the trace's mean rate). Per trace and
contender: SLO attainment, p99, cost (replica-seconds x price) and scaling actions; each tuner run is
also run in the simulated cluster on the same trace and plan (its fidelity). Targets
(:func:`~flowserve_bench.tuner_report.tuner_targets`): the tuner attains >= 99% on every trace; its cost
is <= 0.6x static's on the step and diurnal traces; its misses are <= 1/5 of KEDA's; the simulator's p99
is within 15% of the live p99 for every pipeline; each tuned run's simulated twin is within 2 points of
its attainment and 15% of its cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.client import TopologyClient, new_request_id
from flowserve.client.replay import ReplayReport, replay
from flowserve.client.traffic import wait_ready
from flowserve.errors import FlowserveError
from flowserve.gateway.health import ReadinessProbe
from flowserve.kafka.lag import LagReader
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime import hardware as hw
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.topology.graph import Topology, load_topology
from flowserve.tuning.cluster import LOCAL_START_S, PAUSE_S
from flowserve.tuning.plan import Plan, apply_plan, make_plan, save_plan, stage_options
from flowserve.tuning.scalers import LocalScaler
from flowserve.tuning.simulate import simulate
from flowserve.tuning.stages import sim_stages
from flowserve.tuning.traces import Trace, generate
from flowserve.tuning.tuner import Action, tune
from flowserve_bench import graphs
from flowserve_bench.common import console, run_id
from flowserve_bench.keda import PRESETS, KedaAutoscaler, autoscalers
from flowserve_bench.tuner_contenders import SimSettings, run_tuner
from flowserve_bench.tuner_report import print_tables, tuner_targets

PIPELINES = {"image-processing": 250.0, "cascade-emulated": 250.0, "social-media": 400.0,
             "video-monitoring": 300.0}


def _fresh(source: str | Path, tmp: Path) -> Path:
    """A copy of a topology (a bench topology's file name, or a path) under a unique name (fresh topics and
    groups)."""
    name = f"b{run_id()}"
    path = tmp / f"{name}.yaml"
    path.write_text(graphs.text(source, name))
    return path


async def _deployed(path: Path, kafka: KafkaSettings, plan: Plan | None, tmp: Path
                    ) -> tuple[ProcessHost, Topology, Path | None]:
    topology = load_topology(path)
    plan_path = None
    if plan is not None:
        plan.topology = topology.name
        plan_path = save_plan(plan, tmp / f"{topology.name}.plan.json")
        topology = apply_plan(topology, plan)
    host = ProcessHost(path, topology, kafka, extra_args=["--plan", str(plan_path)] if plan_path else [])
    await create_topology_topics(topology, kafka)
    host.start_processes()
    await _groups_settled(topology, kafka)
    return host, topology, plan_path


async def _groups_settled(topology: Topology, kafka: KafkaSettings, timeout_s: float = 120.0) -> None:
    """Wait until every stage's consumer group is Stable with all its workers as members: a worker joining
    late rebalances its group, and a rebalance inside the measured trace is a pause the simulator (and a
    static plan) does not have."""
    want = {n: node.replicas for n, node in topology.nodes.items()}
    probe = ReadinessProbe([topology], kafka, cache_s=0)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            readiness = (await probe.check())[topology.name]
            if not readiness.groups_checked:  # a broker without DescribeGroups: nothing to wait on
                return
            members = readiness.members
            if all(members.get(n, 0) >= count for n, count in want.items()):
                return
            if time.monotonic() > deadline:
                raise FlowserveError(f"topology '{topology.name}': consumer groups did not settle within "
                                     f"{timeout_s:.0f} s (members {dict(members)}, planned {want})")
            await asyncio.sleep(0.5)
    finally:
        await probe.close()


async def _replay(topology: Topology, kafka: KafkaSettings, trace: Trace,
                  during: Callable[[TopologyClient], Any] | None = None) -> ReplayReport:
    requests, _ = topology.sampler()(256)
    async with TopologyClient(topology, kafka) as client:
        await wait_ready(client, requests[0], timeout_s=120)
        # warm every consumer (first fetches, joins) before the measured trace
        await replay(client, np.linspace(0, 2.0, 60), lambda i: requests[i % 256], timeout_ms=30_000)
        task = asyncio.create_task(during(client)) if during else None
        try:
            return await replay(client, trace.arrivals, lambda i: requests[i % 256], timeout_ms=30_000)
        finally:
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


async def measure_hops(kafka: KafkaSettings, tmp: Path, seconds: float) -> np.ndarray:
    """Hop times (seconds) on this broker: half of each request's latency through a one-stage identity."""
    host, topology, _ = await _deployed(_fresh("tuner-hop.yaml", tmp), kafka, None, tmp)
    try:
        report = await _replay(topology, kafka, generate("poisson", rate=40, seconds=seconds, seed=9))
    finally:
        host.stop()
    lat = report.latency_s[np.isfinite(report.latency_s)]
    return lat / 2


async def measure_overhead(kafka: KafkaSettings, tmp: Path, requests: int = 300) -> np.ndarray:
    """Per-batch overhead samples (seconds): what a worker spends per batch besides its device, at saturation.

    ``requests`` are queued at once for one worker at batch 1; once it is busy, consecutive replies are one
    batch cycle apart, and a cycle less the device's time is the overhead (fetching, decoding, encoding,
    producing, and the CPU the machine's other processes take meanwhile). The mean is the worker's; single
    gaps also carry the reply path's jitter (replies fetched together arrive together).
    """
    host, topology, _ = await _deployed(_fresh("tuner-overhead.yaml", tmp), kafka, None, tmp)
    try:
        samples, _ = topology.sampler()(64)
        async with TopologyClient(topology, kafka) as client:
            await wait_ready(client, samples[0], timeout_s=120)
            done: list[float] = []
            ids = [new_request_id() for _ in range(requests)]
            futures = [client.expect(rid, 120.0) for rid in ids]
            for f in futures:
                f.add_done_callback(lambda _: done.append(time.perf_counter()))
            for i, rid in enumerate(ids):
                await client.queue(samples[i % 64], request_id=rid, timeout_ms=120_000)
            await client.flush()
            await asyncio.gather(*futures)
    finally:
        host.stop()
    # skip the first replies (the worker's first fetch) and the last (the queue running dry)
    gaps = np.diff(np.sort(np.asarray(done))[requests // 10:-5])
    return np.clip(gaps - hw.batch_seconds("resnet50", "cpu", 1), 0.0, None)


async def simulate_section(kafka: KafkaSettings, tmp: Path, hops: np.ndarray, overheads: np.ndarray, *,
                           rate: float, seconds: float, repeats: int = 3) -> list[dict[str, Any]]:
    """Per pipeline: plan for one Poisson trace, deploy the plan once, replay ``repeats`` traces of the same
    process (seeds 1..repeats) and simulate each; the verdict compares the p99 of all live requests with
    the p99 of all simulated ones. One 30-s trace's p99 is a handful of requests, and one transient decides
    it: single traces swung the ratio by 0.3-0.7 between runs."""
    hop_ms = float(np.mean(hops)) * 1000
    overhead_ms = float(np.mean(overheads)) * 1000
    rows = []
    for name, slo in PIPELINES.items():
        traces = [generate("poisson", rate=rate, seconds=seconds, seed=seed) for seed in range(1, repeats + 1)]
        path = _fresh(graphs.EXAMPLES / f"{name}.yaml", tmp)
        try:
            plan = make_plan(load_topology(path), traces[0].arrivals, slo, hop_ms=hop_ms, overhead_ms=overhead_ms)
        except FlowserveError as exc:  # the measured hops alone may exceed the SLO on a loaded machine
            console.print(f"simulate {name}: no plan: {exc}")
            rows.append({"pipeline": name, "slo_ms": slo, "error": str(exc)})
            continue
        host, topology, _ = await _deployed(path, kafka, plan, tmp)
        try:
            lives = [await _replay(topology, kafka, trace) for trace in traces]
        finally:
            host.stop()
        stages = sim_stages(stage_options(load_topology(path)), plan.stages)
        sims = [simulate(stages, trace.arrivals, partitions=plan.partitions, hop_s=hops, overhead_s=overheads,
                         seed=3 + i) for i, trace in enumerate(traces)]
        live = np.nan_to_num(np.concatenate([r.latency_s for r in lives]), nan=np.inf)
        sim = np.concatenate([r.latency_s for r in sims])

        def p(values: np.ndarray, q: float) -> float:
            return float(np.percentile(values, q, method="higher")) * 1000

        ratios = [s.percentile(99) / r.percentile(99) for s, r in zip(sims, lives, strict=True)]
        row = {"pipeline": name, "slo_ms": slo, "plan": {k: vars(v) for k, v in plan.stages.items()},
               "cost_per_hour": plan.predicted["cost_per_hour"], "repeats": repeats,
               "sim_p50_ms": p(sim, 50), "sim_p99_ms": p(sim, 99), "live_p50_ms": p(live, 50),
               "live_p99_ms": p(live, 99), "live_ok": sum(r.ok for r in lives), "sent": sum(r.sent for r in lives),
               "p99_ratio_each": ratios}
        row["p99_ratio"] = row["sim_p99_ms"] / row["live_p99_ms"]
        console.print(f"simulate {name}: sim p99 {row['sim_p99_ms']:.1f} ms, live p99 {row['live_p99_ms']:.1f} ms "
                      f"over {repeats} traces (each: {', '.join(f'{r:.2f}' for r in ratios)})")
        rows.append(row)
    return rows


async def _keda(kafka: KafkaSettings, topology: Topology, scaler: LocalScaler, stop: asyncio.Event,
                actions: list[Action], hpas: dict[str, KedaAutoscaler]) -> None:
    """KEDA + HPA live: at each HPA sync, read the lag and apply what each stage's autoscaler sets."""
    reader = LagReader(kafka, topology)
    await reader.start()
    try:
        while not stop.is_set():
            now = time.monotonic()
            due = [n for n, hpa in hpas.items() if now >= hpa.next_sync_s]
            if due:
                lag = await reader.per_topic()
                alive = scaler.current()
                for node_id in due:
                    have = hpas[node_id].replicas
                    want = hpas[node_id].sync(now, lag.get(node_id, []), ready=alive.get(node_id, have))
                    if want != have:
                        await scaler.scale(node_id, want)
                        actions.append(Action(node_id, have, want, time.time(), f"lag {lag.get(node_id)}"))
            wake = min(hpa.next_sync_s for hpa in hpas.values()) - time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.05, wake))
    finally:
        await reader.close()


async def _metered(host: ProcessHost, prices: dict[str, float], stop: asyncio.Event, meter: dict[str, float]
                   ) -> None:
    """Integrate replica-seconds x price over the run."""
    last = time.monotonic()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)
        now = time.monotonic()
        alive = host.alive()
        meter["replica_s"] += sum(alive.values()) * (now - last)
        meter["dollars"] += sum(n * prices[node] for node, n in alive.items()) * (now - last) / 3600
        last = now


async def _control(_: TopologyClient, *, contender: str, kafka: KafkaSettings, topology: Topology, plan: Plan,
                   scaler: LocalScaler, host: ProcessHost, prices: dict[str, float], stop: asyncio.Event,
                   meter: dict[str, float], actions: list[Action], rule: str = "profile") -> None:
    """What runs beside the replay: the cost meter, and the contender's controller (none for static)."""
    tasks: list[asyncio.Task[Any]] = [asyncio.create_task(_metered(host, prices, stop, meter))]
    if contender in PRESETS:
        # the ScaledObject comes with the deployment, seconds before the measured trace: its HPA starts here
        hpas = autoscalers(topology, plan, PRESETS[contender], start_s=time.monotonic())
        tasks.append(asyncio.create_task(_keda(kafka, topology, scaler, stop, actions, hpas)))
    elif contender == "tuner":
        tasks.append(asyncio.create_task(tune(topology, plan, kafka, scaler, stop=stop, hold_s=5, horizon_s=10,
                                              rule=rule, on_action=actions.append)))
    try:
        await asyncio.gather(*tasks)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


def _contenders(seconds: float) -> list[str]:
    """keda-tuned differs from keda only by its scale-down stabilisation (its pollingInterval changes nothing
    from 1 replica up, see flowserve_bench.keda): on a trace no longer than that window they are one policy."""
    tuned = ["keda-tuned"] if seconds > PRESETS["keda-tuned"].down_stabilisation_s else []
    return ["static", "keda", *tuned, "tuner"]


def _peak_rate(trace: Trace, window: float = 5.0) -> float:
    counts = np.histogram(trace.arrivals, bins=max(1, int(trace.seconds / window)), range=(0, trace.seconds))[0]
    return float(counts.max()) / window


def _sample_like(trace: Trace, rate: float, seed: int, seconds: float = 30.0) -> Trace:
    """What the planner is given, as InferLine's is: a sample of the workload's arrival process at ``rate``
    (another seed). A gamma trace's burstiness is a property of the workload, so its sample keeps the CV; a
    step or a diurnal curve is the change over time the tuner is there for, so theirs is Poisson."""
    if trace.kind == "gamma":
        return generate("gamma", rate=rate, cv=float(trace.params.get("cv", 4.0)), seconds=seconds, seed=seed)
    return generate("poisson", rate=rate, seconds=seconds, seed=seed)


async def tuner_section(kafka: KafkaSettings, tmp: Path, hop_ms: float, overhead_ms: float, *, rate: float,
                        seconds: float, slo_ms: float, rule: str = "profile",
                        draws: tuple[np.ndarray, np.ndarray] | None = None) -> list[dict[str, Any]]:
    """Each trace x contender live; with ``draws`` (the measured hops and overheads), each tuner run also
    in the simulated cluster (:func:`_simulated_twin`)."""
    prices = {"cpu": hw.HARDWARE["cpu"].price_per_hour}
    traces = {
        "steady": generate("poisson", rate=rate, seconds=seconds, seed=21),
        "step": generate("step", rate=rate, factor=2, seconds=seconds, seed=22),
        "bursty": generate("gamma", rate=rate, cv=4, seconds=seconds, seed=23),
        "diurnal": generate("diurnal", rate=2 * rate, low=0.25, seconds=seconds, seed=24),
    }
    rows = []
    for trace_name, trace in traces.items():
        base = load_topology(_fresh(graphs.EXAMPLES / "image-processing.yaml", tmp))
        peak = make_plan(base, _sample_like(trace, _peak_rate(trace), seed=5).arrivals, slo_ms,
                         hop_ms=hop_ms, overhead_ms=overhead_ms, prices=prices)
        # the adaptive contenders start from the plan for the trace's mean rate, on the peak's partitions
        mean = make_plan(base, _sample_like(trace, trace.rate, seed=6).arrivals, slo_ms,
                         hop_ms=hop_ms, overhead_ms=overhead_ms, prices=prices)
        start = Plan(peak.topology, slo_ms, peak.partitions, hop_ms, dict(mean.stages), overhead_ms=overhead_ms,
                     envelope=list(mean.envelope))
        for contender in _contenders(seconds):
            plan = peak if contender == "static" else Plan(**{**vars(start), "stages": dict(start.stages)})
            path = _fresh(graphs.EXAMPLES / "image-processing.yaml", tmp)
            host, topology, _ = await _deployed(path, kafka, plan, tmp)
            node_price = {n: prices[c.hardware] for n, c in plan.stages.items()}
            stop, meter, actions = asyncio.Event(), {"replica_s": 0.0, "dollars": 0.0}, []  # type: ignore[var-annotated]
            scaler = LocalScaler(host)

            during = functools.partial(_control, contender=contender, kafka=kafka, topology=topology, plan=plan,
                                       scaler=scaler, host=host, prices=node_price, stop=stop, meter=meter,
                                       actions=actions, rule=rule)
            try:
                report = await _replay(topology, kafka, trace, during)
            finally:
                stop.set()
                await asyncio.sleep(0.3)  # let the meter and controllers see the stop before workers go
                host.stop()
            slo_s = slo_ms / 1000
            row: dict[str, Any] = {"trace": trace_name, "contender": contender, "sent": report.sent,
                                   "attainment": report.attainment(slo_s),
                                   "misses": int(round((1 - report.attainment(slo_s)) * report.sent)),
                                   "p99_ms": report.percentile(99) * 1000, "cost_dollars": meter["dollars"],
                                   "replica_s": meter["replica_s"], "actions": len(actions)}
            if contender == "tuner" and draws is not None:
                row.update(_simulated_twin(base, trace, plan, slo_s, node_price, draws, rule))
            console.print(f"tuner bench {trace_name}/{contender}: attainment {row['attainment'] * 100:.2f}% "
                          f"p99 {row['p99_ms']:.0f} ms cost ${row['cost_dollars']:.5f} actions {len(actions)}"
                          + (f" (simulated: {row['sim_attainment'] * 100:.2f}%, ${row['sim_cost_dollars']:.5f})"
                             if "sim_attainment" in row else ""))
            rows.append(row)
    return rows


def _simulated_twin(topology: Topology, trace: Trace, plan: Plan, slo_s: float, prices: dict[str, float],
                    draws: tuple[np.ndarray, np.ndarray], rule: str) -> dict[str, float]:
    """The same trace and plan in the simulated cluster, the tuner's controller driving it as it drove the
    live run: this machine's start delays (a local worker process), hops and per-batch overheads drawn
    from those measured. Its attainment and cost beside the live run's are the tuned run's fidelity."""
    hops, overheads = draws
    cfg = SimSettings(slo_s=slo_s, hop_s=hops, overhead_s=overheads, start_s=LOCAL_START_S, pause_s=PAUSE_S)
    out = run_tuner(stage_options(topology), trace.arrivals, plan, cfg, trace.seconds, rule=rule)
    ok = out.latency_s <= slo_s
    return {"sim_attainment": float(np.mean(ok)) if ok.size else 1.0,
            "sim_p99_ms": float(np.percentile(out.latency_s, 99)) * 1000 if ok.size else 0.0,
            "sim_cost_dollars": sum(out.pod_seconds[k] * prices[k] for k in out.pod_seconds) / 3600}


async def tuner_bench(kafka: KafkaSettings, *, rate: float = 30.0, seconds: float = 40.0, slo_ms: float = 600.0,
                      sim_rate: float = 30.0, only: str | None = None, rule: str = "profile",
                      sim_repeats: int = 3) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fs-bench-tuner-") as d:
        tmp = Path(d)
        # The broker's JIT compiles its hot paths in its first tens of seconds; a probe run first keeps that
        # out of the figures measured next.
        await measure_overhead(kafka, tmp, requests=200)
        hops = await measure_hops(kafka, tmp, seconds=10)
        hop_ms = float(np.mean(hops)) * 1000
        console.print(f"measured hop latency: mean {hop_ms:.2f} ms, p99 {np.percentile(hops, 99) * 1000:.2f} ms")
        overheads = await measure_overhead(kafka, tmp)
        overhead_ms = float(np.mean(overheads)) * 1000
        console.print(f"measured per-batch overhead: mean {overhead_ms:.2f} ms, "
                      f"p99 {np.percentile(overheads, 99) * 1000:.2f} ms")
        sim_rows = [] if only == "tuner" else await simulate_section(kafka, tmp, hops, overheads, rate=sim_rate,
                                                                     seconds=seconds, repeats=sim_repeats)
        tuner_rows = [] if only == "simulate" else await tuner_section(kafka, tmp, hop_ms, overhead_ms, rate=rate,
                                                                       seconds=seconds, slo_ms=slo_ms, rule=rule,
                                                                       draws=(np.asarray(hops), np.asarray(overheads)))
    print_tables(sim_rows, tuner_rows, hop_ms, overhead_ms)
    targets = tuner_targets(tuner_rows, sim_rows)
    return {"workload": "tuner", "hop_ms": hop_ms, "overhead_ms": overhead_ms, "simulate": sim_rows,
            "tuner": tuner_rows, "targets": targets}
