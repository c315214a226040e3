"""``flowserve bench gateway --against URL``: flowserve's gateway against any V2 server, the same load on both.

For each topology (by default digits-fused, the 3-stage digits, and the 3-stage digits with the plan
``flowserve plan`` makes for it, :func:`auto_plan`) this deploys its workers
(:class:`~flowserve.runtime.host.ProcessHost`, ``--plan`` applied as ``flowserve run --plan`` does) and
a gateway, then drives the flowserve gateway and the server at ``URL`` with one load generator
(:mod:`flowserve_bench.load`): closed loop at each concurrency level and open-loop Poisson at each rate.
The two sides take turns in short slices (``ab`` then ``ba``), so a slow stretch of a shared machine falls
on both; throughput and p99 ratios (flowserve / the other) come with 95% bootstrap intervals over slices
(:mod:`flowserve_bench.paired`). The two slices of a pair replay the same open-loop arrival times
(:func:`arrivals`), and every slice counts: one in which a side answered nothing is zero throughput for
that side, so a stall drags its ratio down instead of vanishing.

CPU per request per process is measured over the same slices: this process (the load generator), the
gateway, each worker, the broker, and the other server (found by the ports they listen on,
:mod:`flowserve_bench.procs`). Every group is measured in every slice, so the flowserve side's idle cost
during the other side's slices shows too.

Both sides get the same request bodies (the topology's sample inputs, in the same order). Binary BYTES (a
PNG file) does not survive plain V2 JSON, so each element goes base64 under ``content_type: base64``
(MLServer's codec, which flowserve's gateway reads too; MLServer's REST API has no binary extension). The
result says how (``encoding``).

``--brokers embedded,kafka`` runs the whole comparison on each broker in turn (the first reuses the
broker ``flowserve bench`` started when its kind matches). The targets: :mod:`flowserve_bench.against_targets`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from flowserve.client.traffic import prepare_to_drive
from flowserve.errors import FlowserveError
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.topology import Topology, load_topology
from flowserve.tuning.fusion_plan import make_fused_plan
from flowserve.tuning.plan import apply_plan, load_plan, save_plan
from flowserve.tuning.traces import generate
from flowserve_bench.against_targets import targets
from flowserve_bench.common import console, cpu_seconds
from flowserve_bench.gateway import start_gateway
from flowserve_bench.graphs import EXAMPLES
from flowserve_bench.load import Encoding, Request, Target, closed_slice, has_bytes, poisson_slice, request_body
from flowserve_bench.paired import Slice, percentile_ratio, summary, throughput_ratio
from flowserve_bench.procs import cpu_of, jit_cpu, listener_pids, with_children

LEVELS = (1, 8, 32, 128)
#: ``--topology FILE:auto``: the plan is made at the bench's start (:func:`auto_plan`)
AUTO = "auto"
#: (topology file, plan file or :data:`AUTO` or None), as ``--topology FILE[:PLAN]`` gives them
TOPOLOGIES: tuple[tuple[Path, str | None], ...] = (
    (EXAMPLES / "digits-fused.yaml", None), (EXAMPLES / "digits.yaml", None), (EXAMPLES / "digits-planned.yaml", AUTO))
#: the plan :func:`auto_plan` makes: docs/planning.md's example (a bursty gamma trace, CV 4, 150 req/s for
#: 60 s, seed 1; p99 SLO 200 ms) with ``flowserve plan``'s defaults (5 ms per hop, 5 ms per batch)
AUTO_TRACE: dict[str, Any] = {"kind": "gamma", "rate": 150.0, "seconds": 60.0, "cv": 4.0, "seed": 1}
AUTO_SLO_MS, AUTO_HOP_MS, AUTO_OVERHEAD_MS = 200.0, 5.0, 5.0
FS, OTHER = "flowserve", "other"
#: the open-loop arrivals of slice pair ``k`` at load ``j`` are drawn from ``default_rng([ARRIVAL_SEED, j, k])``
ARRIVAL_SEED = 16
#: one slice of one side: (side, seconds, its arrival stream) -> the slice and how many calls failed
Drive = Callable[[str, float, np.random.Generator], Awaitable[tuple[Slice, int]]]


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout_s)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _port(address: str) -> int:
    return urlsplit(address if "//" in address else f"//{address.split(',')[0]}").port or 80


def _groups(gateway: subprocess.Popen[str], host: ProcessHost, broker_port: int,
            other_port: int) -> dict[str, list[int]]:
    """The processes whose CPU is measured, by role (``self``: this process, the load generator)."""
    groups = {"loadgen": [os.getpid()], "gateway": with_children([gateway.pid])}
    for node, procs in host.procs.items():
        groups[f"worker:{node}"] = [p.pid for p in procs]
    groups["broker"] = with_children(listener_pids(broker_port))
    groups["other"] = with_children(listener_pids(other_port))
    return groups


def _cpu(groups: dict[str, list[int]]) -> dict[str, float]:
    return {name: cpu_seconds() if name == "loadgen" else cpu_of(pids) for name, pids in groups.items()}


class Comparison:
    """Slices of both sides at one load, and CPU seconds per process group spent during each side's slices."""

    def __init__(self, load: str) -> None:
        self.load = load
        self.slices: dict[str, list[Slice]] = {FS: [], OTHER: []}
        self.errors = {FS: 0, OTHER: 0}
        self.cpu: dict[str, dict[str, float]] = {FS: {}, OTHER: {}}

    def add(self, side: str, piece: Slice, errors: int, cpu: dict[str, float]) -> None:
        self.slices[side].append(piece)
        self.errors[side] += errors
        for name, seconds in cpu.items():
            self.cpu[side][name] = self.cpu[side].get(name, 0.0) + seconds

    def result(self) -> dict[str, Any]:
        return comparison_row(self.load, self.slices, self.errors, self.cpu)


def _figure(x: float) -> float | None:
    """A ratio for the JSON line: rounded, or null where it is undefined or unbounded (a side answered
    nothing), which fails any target that reads it."""
    return round(x, 3) if np.isfinite(x) else None


def comparison_row(load: str, slices: dict[str, list[Slice]], errors: dict[str, int],
                   cpu: dict[str, dict[str, float]]) -> dict[str, Any]:
    """One load's figures from its slices: each side's throughput, p50/p99, errors and CPU per request, and
    the ratios flowserve / other over every slice pair with their 95% intervals.

    Every pair counts. A slice in which a side answered nothing (every call failed: the server stalled or
    refused) is zero requests over the seconds it took, so it lowers that side's throughput and its
    ratio; leaving such pairs out would make a stall disappear. ``empty_slices`` says how many there were.
    """
    out: dict[str, Any] = {"load": load}
    for side in (FS, OTHER):
        s = summary(slices[side]) if any(x.latencies for x in slices[side]) else {"throughput_rps": 0.0}
        done = max(sum(x.requests for x in slices[side]), 1)
        out[side] = {**{k: round(v, 2) for k, v in s.items()}, "errors": errors[side],
                     "empty_slices": sum(not x.requests for x in slices[side]),
                     "cpu_us_per_request": {k: round(v / done * 1e6, 1) for k, v in cpu[side].items()}}
    a, b = slices[FS], slices[OTHER]
    if a and len(a) == len(b):
        out["throughput_ratio"] = [_figure(x) for x in throughput_ratio(a, b)]
        out["p99_ratio"] = [_figure(x) for x in percentile_ratio([x.latencies for x in a],
                                                                 [x.latencies for x in b])]
        out["paired_slices"] = len(a)
    return out


def arrivals(load_index: int, pair: int) -> np.random.Generator:
    """The open-loop arrival stream of slice pair ``pair`` at load ``load_index``: a fresh generator in the
    same state for each side of the pair, so both get the same Poisson arrival times and a pair differs by
    the servers alone, not by the draw (one generator shared in turn gave each side its own arrivals)."""
    return np.random.default_rng([ARRIVAL_SEED, load_index, pair])


async def measure_load(load: str, load_index: int, drive: Drive, *, rounds: int, slice_s: float,
                       cpu: Callable[[], dict[str, float]]) -> Comparison:
    """``rounds`` slice pairs of one load, the sides taking turns (``ab``, then ``ba``), each side of pair
    ``k`` driven with :func:`arrivals` of ``(load_index, k)``; CPU per process group read around each slice."""
    comparison = Comparison(load)
    for k in range(rounds):
        for side in ((FS, OTHER) if k % 2 == 0 else (OTHER, FS)):
            before = cpu()
            piece, errors = await drive(side, slice_s, arrivals(load_index, k))
            after = cpu()
            comparison.add(side, piece, errors, {n: after[n] - before[n] for n in before})
    return comparison


#: the warm-up before the first load goes on until the broker's JIT compiler uses under this share of a core
JIT_QUIET = 0.05


async def _until_compiled(sides: dict[str, Target], requests: dict[str, list[Request]], concurrency: int,
                          broker: list[int], max_s: float) -> None:
    """Drive both sides in turn, 2 s each, until the broker's JIT compiler is quiet during flowserve's turn,
    for at most ``max_s`` seconds of flowserve's load.

    A fresh Kafka JVM compiles its hot paths for tens of seconds under load, and on two cores its compiler
    threads can take more CPU per request than the broker's own request handling (docs/benchmarks.md,
    "With the broker's JIT warm"). Measuring then would charge flowserve for the broker's start-up, not
    the steady state a server that runs for days has. The other server gets the same load for the same
    time, so neither side is measured colder. A broker that is not a JVM (or not on this machine) shows no
    compiler threads and is not waited for.
    """
    driven, busy = 0.0, 0.0
    while driven < max_s:
        before, at = jit_cpu(broker), time.perf_counter()
        await closed_slice(sides[FS], requests[FS], concurrency, 2.0)
        driven += time.perf_counter() - at
        busy = (jit_cpu(broker) - before) / (time.perf_counter() - at)
        await closed_slice(sides[OTHER], requests[OTHER], concurrency, 2.0)
        if busy < JIT_QUIET:
            break
    console.print(f"  warm-up: {driven:.0f} s a side at c{concurrency}, until the broker's JIT compiler was quiet "
                  f"(last 2 s: {busy:.0%} of a core)")


def auto_plan(path: Path, folder: Path) -> Path:
    """The plan ``flowserve plan`` makes for ``path`` (fusion chosen by the planner) on :data:`AUTO_TRACE`
    with :data:`AUTO_SLO_MS`, written to ``folder``."""
    topology = load_topology(path)
    trace = generate(str(AUTO_TRACE["kind"]), rate=float(AUTO_TRACE["rate"]), seconds=float(AUTO_TRACE["seconds"]),
                     cv=float(AUTO_TRACE["cv"]), seed=int(AUTO_TRACE["seed"]))
    plan = make_fused_plan(topology, trace.arrivals, AUTO_SLO_MS, hop_ms=AUTO_HOP_MS, overhead_ms=AUTO_OVERHEAD_MS)
    target = save_plan(plan, folder / f"{path.stem}.plan.json")
    chains = ", ".join(f"{name} = {' -> '.join(m)}" for name, m in plan.fuse.items()) or "none"
    console.print(f"plan for {topology.name} ({AUTO_TRACE}, p99 <= {AUTO_SLO_MS:g} ms) -> {target}: fused {chains}")
    return target


def encodings(inputs: list[dict[str, np.ndarray]]) -> dict[str, Encoding]:
    """How each side gets the requests: V2 JSON, where they hold BYTES with each element base64 under
    ``content_type: base64`` (MLServer's codec, which flowserve's gateway reads too): the same body to both."""
    if any(has_bytes(x) for x in inputs):
        return {FS: "base64", OTHER: "base64"}
    return {FS: "json", OTHER: "json"}


async def compare_topology(kafka: KafkaSettings, path: Path, url: str, model: str | None, *,
                           levels: tuple[int, ...], rates: tuple[float, ...], slice_s: float, rounds: int,
                           warm_max_s: float = 90.0, gateway_processes: int = 1,
                           plan: Path | None = None) -> dict[str, Any]:
    """Deploy ``path`` (with the plan file ``plan`` applied, as ``flowserve run --plan`` does) with a
    gateway, then every load on both sides in interleaved slices."""
    topology: Topology = load_topology(path)
    planned = load_plan(plan) if plan is not None else None
    if planned is not None:
        topology = apply_plan(topology, planned)
    prepare_to_drive(topology)
    inputs, _ = topology.sampler()(256)
    encoding = encodings(inputs)
    requests = {side: [request_body(x, encoding[side]) for x in inputs] for side in (FS, OTHER)}
    await create_topology_topics(topology, kafka)
    host = ProcessHost(path, topology, kafka, extra_args=["--plan", str(plan)] if plan is not None else [])
    host.start_processes()
    gateway, fs_url = start_gateway(kafka, path, processes=gateway_processes, plans=(plan,) if plan else ())
    sides = {FS: Target(fs_url, topology.name), OTHER: Target(url, model or topology.name)}
    loads: list[dict[str, Any]] = []
    try:
        console.print(f"{topology.name}: {len(topology.nodes)} worker node(s) ({', '.join(topology.nodes)}), "
                      f"gateway at {fs_url} ({gateway_processes} process(es)), against {url} model "
                      f"{sides[OTHER].model}, requests as {encoding[FS]} / {encoding[OTHER]}; waiting…")
        for side, t in sides.items():
            await t.ready(requests[side][0])
        groups = _groups(gateway, host, _port(kafka.bootstrap), _port(url))
        shapes: list[tuple[str, Any]] = [(f"c{c}", c) for c in levels] + [(f"poisson{r:g}", r) for r in rates]
        for j, (label, arg) in enumerate(shapes):

            async def one(side: str, seconds: float, rng: np.random.Generator, label: str = label,
                          arg: Any = arg) -> tuple[Slice, int]:
                if label.startswith("c"):
                    return await closed_slice(sides[side], requests[side], int(arg), seconds)
                return await poisson_slice(sides[side], requests[side], float(arg), seconds, rng)

            if not loads and warm_max_s > 0:
                await _until_compiled(sides, requests, max(levels, default=32), groups["broker"], warm_max_s)
            for side in (FS, OTHER):  # warm-up: connections opened, batches sized, caches filled
                await one(side, min(1.0, slice_s / 2), arrivals(j, rounds))
            comparison = await measure_load(label, j, one, rounds=rounds, slice_s=slice_s,
                                            cpu=lambda: _cpu(groups))
            loads.append(row := comparison.result())
            _print_row(topology.name, row)
    finally:
        for t in sides.values():
            await t.close()
        stop_process(gateway)
        host.stop()
    doc = {} if planned is None else planned.to_json()
    applied = {"file": str(plan), **{k: doc[k] for k in ("partitions", "stages", "fuse", "fusion")}} if doc else None
    return {"topology": topology.name, "nodes": list(topology.nodes), "gateway_processes": gateway_processes,
            "plan": applied, "encoding": encoding, "loads": loads}


def _print_row(name: str, row: dict[str, Any]) -> None:
    fs, other = row[FS], row[OTHER]
    ratio = [float("nan") if x is None else x for x in row.get("throughput_ratio", [None] * 3)]
    p99 = [float("nan") if x is None else x for x in row.get("p99_ratio", [None] * 3)]
    cpu = "  ".join(f"{k} {v:.0f}" for k, v in fs["cpu_us_per_request"].items() if k != "other")
    console.print(f"  {name:<13} {row['load']:<12} flowserve {fs['throughput_rps']:>7.0f} req/s p50 "
                  f"{fs.get('p50_ms', float('nan')):5.1f} p99 {fs.get('p99_ms', float('nan')):6.1f} | other "
                  f"{other['throughput_rps']:>7.0f} req/s p50 {other.get('p50_ms', float('nan')):5.1f} p99 "
                  f"{other.get('p99_ms', float('nan')):6.1f} | ratio {ratio[0]:.2f} [{ratio[1]:.2f}, {ratio[2]:.2f}]"
                  f" p99 ratio {p99[0]:.2f} [{p99[1]:.2f}, {p99[2]:.2f}]")
    console.print(f"      flowserve CPU us/req: {cpu}; other server "
                  f"{other['cpu_us_per_request'].get('other', 0):.0f} us/req (loadgen "
                  f"{other['cpu_us_per_request'].get('loadgen', 0):.0f})")


def _brokers(kafka: KafkaSettings, first_kind: str, kinds: list[str]) -> Generator[tuple[str, KafkaSettings]]:
    """Each broker kind in turn: the one already running when its kind matches, else one started here."""
    from flowserve.kafka.brokers import running_broker

    for kind in kinds:
        if kind == first_kind:
            yield kind, kafka
            continue
        console.print(f"starting the {kind} broker…")
        with running_broker(kind, server_jvm=True) as broker:  # type: ignore[arg-type]
            yield kind, broker.settings()


def _split(raw: str | None, cast: Any, default: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(cast(x) for x in raw.split(",") if x.strip()) if raw else default


def contenders(raw: list[str] | None) -> list[tuple[Path, str | None]]:
    """``--topology FILE[:PLAN]`` values as (file, plan): a plan file, :data:`AUTO` (made at the bench's
    start) or None; :data:`TOPOLOGIES` when none is given."""
    if not raw:
        return list(TOPOLOGIES)
    out: list[tuple[Path, str | None]] = []
    for value in raw:
        path, colon, plan = value.partition(":")
        out.append((Path(path), plan if colon else None))
    return out


async def against_bench(kafka: KafkaSettings, args: argparse.Namespace) -> dict[str, Any]:
    """The ``--against`` comparison, on each broker of ``--brokers`` (default: the one given)."""
    chosen = contenders(args.topology)
    missing = [str(p) for p, plan in chosen if not p.is_file()]
    missing += [plan for _, plan in chosen if plan not in (None, AUTO) and not Path(plan).is_file()]
    if missing:
        raise FlowserveError(f"the gateway bench runs {', '.join(missing)}, not found here: run it from a "
                             "flowserve checkout (its topologies/ folder), or name topologies with --topology "
                             "FILE[:PLAN]")
    names = [load_topology(p).name for p, _ in chosen]
    if len(set(names)) < len(names):
        # one name is one set of topics: a contender deployed after another of its name would find the first's
        # requests on its inputs topic, and a stage with a new consumer group would answer them all again
        raise FlowserveError(f"--topology names the topologies {', '.join(names)}: each must have a name of its own "
                             "(e.g. topologies/digits-planned.yaml is digits.yaml under another name, for a plan)")
    levels = _split(args.levels, int, LEVELS)
    rates = _split(args.rates, float, ())
    first = None if args.broker else args.broker_kind
    kinds = list(_split(args.brokers, str, (first or "given",)))
    runs: dict[str, list[dict[str, Any]]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="flowserve-against-") as folder:
        plans = {p: (auto_plan(p, Path(folder)) if plan == AUTO else Path(plan) if plan else None)
                 for p, plan in chosen}
        with contextlib.closing(_brokers(kafka, first or "given", kinds)) as brokers:
            for kind, settings in brokers:
                console.print(f"[bold]broker: {kind}[/]")
                runs[kind] = [await compare_topology(settings, p, args.against, args.against_model, levels=levels,
                                                     rates=rates, slice_s=args.slice_seconds or 2.0,
                                                     rounds=args.rounds, gateway_processes=args.gateway_processes,
                                                     warm_max_s=args.warm_max_seconds, plan=plans[p])
                              for p, _ in chosen]
                for run, (_, plan) in zip(runs[kind], chosen, strict=True):
                    if plan == AUTO:  # its file is gone with the bench; how it was made stays
                        run["plan"]["made"] = {"trace": AUTO_TRACE, "slo_ms": AUTO_SLO_MS, "hop_ms": AUTO_HOP_MS,
                                               "overhead_ms": AUTO_OVERHEAD_MS}
    return {"workload": "gateway-against", "against": args.against, "slice_seconds": args.slice_seconds or 2.0,
            "rounds": args.rounds, "arrival_seed": ARRIVAL_SEED, "seconds": round(time.perf_counter() - started, 1),
            "brokers": runs, "targets": targets(runs)}
