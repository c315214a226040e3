"""``flowserve bench parity``: coded redundancy (ParM) against no redundancy and replication, at equal resources.

The digits topology (pre -> model -> post) is deployed for each contender in turn (each worker its own
process; one deployment at a time, in balanced order over ``rounds`` blocks, see :mod:`paired`), and
each deployment runs one open-loop slice of every scenario:

- ``none``: the model node with ``N`` workers;
- ``replicas``: ``N + N/k`` workers of the model (the extra workers as replicas of the base);
- ``parity``: ``N`` model workers plus ``N/k`` workers of the parity model (``parity: {k}``).

With ``stage="emulated"`` (``--stage emulated``) the protected stage is instead an emulated accelerator
(``flowserve.builtin:Accelerator``, resnet50 on the ``cpu`` table: 32 ms a batch of one) between the
normalizer and the classifier, and its ``stalls`` are the issue's: 10x its batch time, on ~3% of batches.

Stragglers are injected from this process into every worker that serves the protected stage: the base
workers, replication's extra replicas and parity's parity-model workers alike, by one seeded schedule
(:func:`stall_schedule`) that gives worker slot ``j`` of deployment ``i`` the same stalls whichever
contender is deployed, so no contender's extra worker is spared what another's meets:

- ``clean``: none (the throughput-overhead scenario: CPU seconds per request of every worker);
- ``stalls``: each worker, on its own, is SIGSTOPped for ``stall_ms`` (``10x`` a digits batch plus its
  Kafka hop) at random moments ``stall_every_ms`` apart on average;
- ``stopped``: once per slice, one of the stage's workers is SIGSTOPped for ``stop_s`` seconds at a random
  moment.

A reply that is an error (or a call that fails) is a miss: it counts as the call's whole timeout in the
latencies and as wrong in the accuracy, never as a fast answer.

Reported per scenario and contender: p50, p99, p99.9, the p99.9 - p50 gap, misses, accuracy, replies
rebuilt from parity; the gap ratio parity / replicas and the p50 ratio parity / none with bootstrap
intervals over deployments; and the parity model's degraded-mode accuracy (k = 2, 3, 4) from training.
Targets are decided on an interval's conservative (upper) end. The last line printed is JSON with
``targets``, and ``notes`` says why a target was missed where the bench can tell.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from flowserve.client import TopologyClient
from flowserve.client.traffic import prepare_to_drive, wait_ready
from flowserve.component import require
from flowserve.errors import FlowserveError
from flowserve.kafka.replies import Reply
from flowserve.kafka.settings import KafkaSettings
from flowserve.parity import TrainsParity
from flowserve.runtime import hardware as hw
from flowserve.runtime.host import ProcessHost
from flowserve.topology import load_topology
from flowserve.wire.envelope import H_RECONSTRUCTED
from flowserve_bench import graphs
from flowserve_bench.common import console, cpu_seconds, run_id
from flowserve_bench.paired import balanced_order, gap_ratio, percentile_ratio

CONTENDERS = ("none", "replicas", "parity")
SCENARIOS = ("clean", "stalls", "stopped")

#: ``--stage emulated``: the emulated stage's model and hardware kind (``topologies/parity-emulated.yaml``'s
#: accelerator; flowserve.runtime.hardware: 32 ms a batch of one)
EMULATED_MODEL = ("resnet50", "cpu")


def protected_node(stage: str) -> str:
    return "accel" if stage == "emulated" else "model"


def topology_text(name: str, contender: str, n: int, k: int, wait_ms: float, encoder: str = "sum",
                  stage: str = "digits") -> str:
    """``topologies/parity-STAGE.yaml`` under ``name``, its protected stage with ``n`` replicas (``n + n/k``
    for the replicas contender, and ``n/k`` parity replicas over them for the parity contender)."""
    protected = protected_node(stage)
    parity: dict[str, Any] = {"k": k, "wait_ms": wait_ms, "replicas": max(1, n // k)}
    if stage != "emulated":  # the pass-through stage is its own parity model: nothing to lay over it
        parity |= {"encoder": encoder, "params": {"parity_k": k, "parity_encoder": encoder}}
    changes: dict[str, Any] = {f"nodes.{protected}.replicas": n + n // k if contender == "replicas" else n}
    if contender == "parity":
        changes[f"nodes.{protected}.parity"] = parity
    return graphs.text(f"parity-{stage}.yaml", name, changes)


#: a miss (an error reply, a call that failed or timed out) counts as the call's whole timeout: its caller
#: got no answer it could use, so it must weigh on the tail, not vanish from it or count as a fast reply
CALL_TIMEOUT_MS = 60_000


@dataclass(frozen=True)
class Stall:
    """One SIGSTOP: of the stage's worker ``slot`` (base workers first, then the extra ones), ``at_s``
    seconds into a slice, for ``seconds``."""

    at_s: float
    slot: int
    seconds: float


def stall_schedule(scenario: str, seconds: float, slots: int, *, seed: int, deployment: int, stall_ms: float,
                   stall_every_ms: float, stop_s: float) -> list[Stall]:
    """The stalls of one ``seconds``-long slice of ``scenario`` on a stage of ``slots`` workers, in a
    contender's ``deployment``-th deployment.

    Drawn from the seed, the deployment and the scenario (and for ``stalls`` the slot), never from the
    contender: worker slot ``j`` meets the same stalls under every contender that has it, so replication's
    extra replica and parity's parity worker meet the same ones, and ``none``'s two workers those of the
    others' first two.
    """
    out: list[Stall] = []
    if scenario == "stalls":
        for slot in range(slots):  # each worker stalls on its own, as a straggling machine does
            rng = random.Random(f"{seed}/{deployment}/{scenario}/{slot}")
            t = rng.expovariate(1000 / stall_every_ms)
            while t < seconds:
                out.append(Stall(t, slot, stall_ms / 1000))
                t += stall_ms / 1000 + rng.expovariate(1000 / stall_every_ms)
    elif scenario == "stopped":
        rng = random.Random(f"{seed}/{deployment}/{scenario}")
        at = rng.uniform(0, max(0.0, seconds - stop_s) / 2)
        out.append(Stall(at, min(slots - 1, int(rng.random() * slots)), stop_s))
    return sorted(out, key=lambda s: s.at_s)


async def _inject(schedule: Sequence[Stall], procs: Sequence[Any]) -> None:
    """SIGSTOP each scheduled worker at its moment for its time; every worker runs again after."""
    start = time.monotonic()

    async def one(stall: Stall) -> None:
        await asyncio.sleep(max(0.0, start + stall.at_s - time.monotonic()))
        victim = procs[stall.slot]
        victim.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(stall.seconds)
        finally:
            with contextlib.suppress(ProcessLookupError):
                victim.send_signal(signal.SIGCONT)

    try:
        await asyncio.gather(*(one(s) for s in schedule))
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGCONT)


@dataclass
class SliceTally:
    """One slice of one contender: each request's latency in ms (a miss counts as :data:`CALL_TIMEOUT_MS`),
    misses, correct answers and replies rebuilt from parity."""

    latencies: list[float] = field(default_factory=list)
    misses: int = 0
    correct: int = 0
    rebuilt: int = 0

    def add(self, reply: Reply | None, elapsed_ms: float, label: int) -> None:
        """One request's outcome; ``reply`` None: the call itself failed (its send, or its timeout)."""
        if reply is None or reply.error is not None:
            self.misses += 1
            self.latencies.append(float(CALL_TIMEOUT_MS))
            return
        self.latencies.append(elapsed_ms)
        self.correct += int(np.asarray(reply.tensors["label"]).ravel()[0]) == label
        self.rebuilt += H_RECONSTRUCTED in reply.headers


async def _slice(client: TopologyClient, requests: list[dict[str, np.ndarray]], labels: list[int], rate: float,
                 seconds: float, rng: random.Random) -> SliceTally:
    """Open loop at ``rate`` for ``seconds``."""
    tally = SliceTally()
    tasks = []

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        try:
            reply: Reply | None = await client.call(requests[i], timeout_ms=CALL_TIMEOUT_MS)
        except (TimeoutError, FlowserveError):
            reply = None
        tally.add(reply, (time.perf_counter() - t0) * 1000, labels[i])

    start = time.perf_counter()
    sent = 0
    while time.perf_counter() - start < seconds:
        await asyncio.sleep(max(0.0, start + sent / rate - time.perf_counter()))
        tasks.append(asyncio.create_task(one(rng.randrange(len(requests)))))
        sent += 1
    await asyncio.gather(*tasks)
    return tally


def _stats(latencies: Sequence[float]) -> dict[str, float]:
    p50, p99, p999 = np.percentile(np.asarray(latencies), [50, 99, 99.9])
    return {"p50_ms": round(float(p50), 2), "p99_ms": round(float(p99), 2), "p99_9_ms": round(float(p999), 2),
            "gap_ms": round(float(p999 - p50), 2), "n": len(latencies)}


def scenario_figures(tallies: dict[str, list[SliceTally]], cpu_s: dict[str, float]) -> dict[str, Any]:
    """One scenario's figures per contender (``tallies[c][i]``: slice ``i`` of contender ``c``, from its
    ``i``-th deployment) and the ratios, each as ``[point, low, high]`` with a 95% interval over deployments."""
    part: dict[str, Any] = {}
    for c, slices in tallies.items():
        pooled = [x for s in slices for x in s.latencies]
        part[c] = {**_stats(pooled), "misses": sum(s.misses for s in slices),
                   "accuracy": round(sum(s.correct for s in slices) / len(pooled), 4),
                   "rebuilt": sum(s.rebuilt for s in slices),
                   "cpu_ms_per_request": round(1000 * cpu_s.get(c, 0.0) / len(pooled), 3)}
    parity = [s.latencies for s in tallies["parity"]]
    gap = gap_ratio(parity, [s.latencies for s in tallies["replicas"]])
    p50 = percentile_ratio(parity, [s.latencies for s in tallies["none"]], q=50)
    part["gap_ratio_parity_over_replicas"] = [round(x, 3) for x in gap]
    part["p50_ratio_parity_over_none"] = round(p50[0], 3)
    part["p50_ratio_parity_over_none_interval"] = [round(x, 3) for x in p50]
    return part


def decide_targets(scenarios: dict[str, dict[str, Any]], overhead: float, k: int, degraded: dict[int, float],
                   stall_ms: float | None = None) -> tuple[dict[str, bool], list[str]]:
    """The targets, each ratio judged at its interval's upper end (a ratio whose interval straddles the
    line is not met), and a note for each one missed."""
    stragglers = [s for s in scenarios if s != "clean"]
    notes = []
    for s in stragglers:
        point, low, high = scenarios[s]["gap_ratio_parity_over_replicas"]
        if high > 1 / 3:
            notes.append(f"'{s}': parity's tail gap is {point:g}x replication's (95% interval {low:g}-{high:g}); "
                         f"the target, <= 1/3 at the interval's upper end, is not met")
    clean_p50 = scenarios.get("clean", {}).get("parity", {}).get("p50_ms")
    if "stalls" in scenarios and scenarios["stalls"]["gap_ratio_parity_over_replicas"][2] > 1 / 3 \
            and stall_ms is not None and clean_p50 is not None and stall_ms <= clean_p50:
        # a rebuild takes the group's other member, the parity worker and the decoder: no shorter than a
        # reply itself, so it cannot come back much before a stall this short ends
        notes.append(f"'stalls': a stall ({stall_ms:g} ms) is no longer than parity's own p50 without stalls "
                     f"({clean_p50:g} ms), so a rebuilt reply cannot arrive much before the stalled worker resumes: "
                     f"on this stage at this load parity cannot cut the stall tail to a third of replication's")
    for s, part in scenarios.items():
        point, low, high = part["p50_ratio_parity_over_none_interval"]
        if high > 1.1:
            notes.append(f"'{s}': parity's p50 is {point:g}x no redundancy's (95% interval {low:g}-{high:g}); "
                         f"the target, <= 1.1x at the interval's upper end, is not met")
    targets = {
        "gap_le_third_of_replicas": all(scenarios[s]["gap_ratio_parity_over_replicas"][2] <= 1 / 3
                                        for s in stragglers),
        "median_le_1.1x_none": all(p["p50_ratio_parity_over_none_interval"][2] <= 1.1 for p in scenarios.values()),
        "overhead_le_1/k+5%": overhead <= 1 / k + 0.05,
        "degraded_accuracy_k2_ge_0.85": degraded.get(2, 0.0) >= 0.85,
    }
    return targets, notes


async def parity_bench(kafka: KafkaSettings, *, rate: float = 60.0, slice_s: float = 4.0, rounds: int = 4,
                       n: int = 2, k: int = 2, wait_ms: float | None = None, stall_ms: float | None = None,
                       stall_every_ms: float | None = None, stop_s: float = 1.5, seed: int = 0,
                       encoder: str = "sum", stage: str = "digits") -> dict[str, Any]:
    """``stall_every_ms``: the mean time between one worker's stalls (each worker of the stage has its own)."""
    rng = random.Random(seed)
    if stage == "emulated":
        if encoder != "sum":
            raise FlowserveError("--stage emulated protects a pass-through stage, whose parity model decodes "
                                 "only summed queries; use --encoder sum")
        # the stragglers: a worker stalls for 10x its batch time on ~3% of its batches (at this load
        # nearly every batch holds one request, and each of the n base workers takes rate/n a second)
        batch_ms = 1000 * hw.batch_seconds(*EMULATED_MODEL, 1)
        stall_ms = stall_ms if stall_ms is not None else 10 * batch_ms
        stall_every_ms = stall_every_ms if stall_every_ms is not None else 1000 / (0.03 * rate / n)
    else:
        stall_ms = stall_ms if stall_ms is not None else 60.0
        # one stall every ~300 ms over the n base workers, as before every worker had its own schedule
        stall_every_ms = stall_every_ms if stall_every_ms is not None else 300.0 * n
    protected = protected_node(stage)
    # A group needs k requests to arrive within wait_ms; at a moderate rate they are 1/rate apart. The
    # members never wait for it (they go on at once), so a wait of a few interarrival times costs nothing.
    wait_ms = wait_ms if wait_ms is not None else max(20.0, 3 * 1000 / rate)
    workdir = Path(tempfile.mkdtemp(prefix="fs-bench-parity-"))
    tag = run_id()
    topologies = {}
    for c in CONTENDERS:
        path = workdir / f"{c}.yaml"
        path.write_text(topology_text(f"par{c}{tag}", c, n, k, wait_ms, encoder, stage))
        topologies[c] = (path, load_topology(path))
    console.print(f"training the parity models of digits-mlp ({encoder} encoder; k = 2, 3, 4; saving k = {k})")
    trainer = require(topologies["none"][1].nodes["model"].component, TrainsParity, "train a parity model")
    training = trainer.train_parity(k, encoder)
    for _, topology in topologies.values():
        prepare_to_drive(topology)
    requests, labels = topologies["none"][1].sampler()(2000)
    # One contender deployed at a time (a shared machine cannot hold three deployments' workers at once);
    # the contenders take turns in blocks, and each block runs a slice of every scenario.
    slices: dict[str, dict[str, list[SliceTally]]] = {s: {c: [] for c in CONTENDERS} for s in SCENARIOS}
    cpu = {s: dict.fromkeys(CONTENDERS, 0.0) for s in SCENARIOS}
    deployments = dict.fromkeys(CONTENDERS, 0)
    for c in balanced_order(CONTENDERS, rounds):
        path, topology = topologies[c]
        host = ProcessHost(path, topology, kafka)
        try:
            await host.start()
            # every worker serving the stage, base first: replication's extra replica and parity's parity
            # worker take the same slots, hence the same stalls
            stage_procs = host.procs[protected] + host.procs.get(f"{protected}-parity", [])
            async with TopologyClient(topology, kafka) as client:
                await wait_ready(client, requests[0], timeout_s=180)
                await _slice(client, requests, labels, rate, 2.0, rng)  # warm-up: groups form, caches fill
                for scenario in SCENARIOS:
                    procs = [p for ps in host.procs.values() for p in ps]
                    cpu0 = sum(cpu_seconds(p.pid) for p in procs)
                    schedule = stall_schedule(scenario, slice_s, len(stage_procs), seed=seed,
                                              deployment=deployments[c], stall_ms=stall_ms,
                                              stall_every_ms=stall_every_ms, stop_s=stop_s)
                    inject = asyncio.create_task(_inject(schedule, stage_procs))
                    tally = await _slice(client, requests, labels, rate, slice_s, rng)
                    await inject
                    cpu[scenario][c] += sum(cpu_seconds(p.pid) for p in procs) - cpu0
                    slices[scenario][c].append(tally)
            deployments[c] += 1
        finally:
            host.stop()
    results: dict[str, Any] = {}
    for scenario in SCENARIOS:
        results[scenario] = scenario_figures(slices[scenario], cpu[scenario])
        _print(scenario, results[scenario])
    overhead = results["clean"]["parity"]["cpu_ms_per_request"] / results["clean"]["none"]["cpu_ms_per_request"] - 1
    degraded = {int(key): value for key, value in training["degraded_accuracy"].items()}
    targets, notes = decide_targets(results, overhead, k, degraded, stall_ms)
    for note in notes:
        console.print(f"[yellow]{note}[/]")
    return {
        "workload": "parity", "stage": stage, "encoder": encoder, "rate_rps": rate, "slice_s": slice_s,
        "rounds": rounds, "n": n, "k": k, "wait_ms": wait_ms, "seed": seed,
        "stall_ms": stall_ms, "stall_every_ms_per_worker": stall_every_ms, "stop_s": stop_s,
        "miss_counts_as_ms": CALL_TIMEOUT_MS,
        "base_accuracy": training["base_accuracy"], "degraded_accuracy": degraded,
        "cpu_overhead_clean": round(overhead, 3), "scenarios": results, "notes": notes, "targets": targets,
    }


def _print(scenario: str, part: dict[str, Any]) -> None:
    table = Table(title=f"parity bench, scenario '{scenario}'")
    cols = ("contender", "p50 ms", "p99 ms", "p99.9 ms", "gap ms", "misses", "accuracy", "rebuilt", "cpu ms/req", "n")
    for col in cols:
        table.add_column(col, justify="left" if col == "contender" else "right")
    for c in CONTENDERS:
        r = part[c]
        table.add_row(c, *(str(r[key]) for key in ("p50_ms", "p99_ms", "p99_9_ms", "gap_ms", "misses", "accuracy",
                                                   "rebuilt", "cpu_ms_per_request", "n")))
    console.print(table)
    console.print(f"gap ratio parity/replicas {part['gap_ratio_parity_over_replicas']} (point, 95% interval); "
                  f"p50 parity/none {part['p50_ratio_parity_over_none_interval']}")
