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

Stragglers are injected from this process into the protected node's workers (never into the parity model's):

- ``clean``: none (the throughput-overhead scenario: CPU seconds per request of every worker);
- ``stalls``: at random moments (``stall_every_ms`` apart on average) one model worker is SIGSTOPped
  for ``stall_ms`` (``10x`` a digits batch plus its Kafka hop);
- ``stopped``: once per slice, one model worker is SIGSTOPped for ``stop_s`` seconds at a random moment.

Reported per scenario and contender: p50, p99, p99.9, the p99.9 - p50 gap, accuracy, replies rebuilt from
parity; the gap ratio parity / replicas with a bootstrap interval over slices; and the parity model's
degraded-mode accuracy (k = 2, 3, 4) from training. The last line printed is JSON with ``targets``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.bench.common import console, cpu_seconds, run_id
from flowserve.bench.paired import balanced_order, gap_ratio
from flowserve.client import TopologyClient
from flowserve.client.traffic import prepare_to_drive, wait_ready
from flowserve.errors import FlowserveError
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime import hardware as hw
from flowserve.runtime.host import ProcessHost
from flowserve.topology import load_topology
from flowserve.wire.envelope import H_RECONSTRUCTED

CONTENDERS = ("none", "replicas", "parity")
SCENARIOS = ("clean", "stalls", "stopped")

# The digits pipeline; ``{protected}`` is the emulated stage's block (``--stage emulated``) or empty, and
# ``{model_extra}`` the classifier's replicas and parity when it is the protected stage itself.
TEMPLATE = """
name: {name}
partitions: 4
deadline_ms: 60000
nodes:
  pre:
    component: flowserve_components.digits:Normalize
    inputs: {{pixels: input.pixels}}
{protected}  model:
    component: flowserve_components.torch_stage:TorchClassifier
    params: {{model: digits-mlp, threads: 1}}
    inputs: {{x: {source}.x}}
{model_extra}  post:
    component: flowserve_components.postprocess:ArgMax
    inputs: {{logits: model.logits}}
outputs:
  label: post.label
sample: flowserve_components.digits:sample
"""

#: ``--stage emulated``: an emulated accelerator (``flowserve.builtin:Accelerator``, the planner's tables)
#: between the normalizer and the classifier is the protected stage. It passes rows through, so the
#: parity model (the same stage) answers a summed query with the sum and decoding is exact.
ACCELERATOR = """  accel:
    component: flowserve.builtin:Accelerator
    params: {{model: {model}, hardware: {hardware}, ports: {{x: {{datatype: FP32, shape: [-1, 64]}}}}}}
    inputs: {{x: pre.x}}
{extra}"""
#: the emulated stage's model and hardware kind (flowserve.runtime.hardware: 32 ms a batch of one)
EMULATED_MODEL = ("resnet50", "cpu")


def protected_node(stage: str) -> str:
    return "accel" if stage == "emulated" else "model"


def topology_text(name: str, contender: str, n: int, k: int, wait_ms: float, encoder: str = "sum",
                  stage: str = "digits") -> str:
    replicas = n + n // k if contender == "replicas" else n
    parity = f"    parity: {{k: {k}, wait_ms: {wait_ms}, replicas: {max(1, n // k)}"
    if stage == "emulated":  # the pass-through stage is its own parity model: nothing to lay over it
        parity += "}"
    else:
        parity += f", encoder: {encoder}, params: {{parity_k: {k}, parity_encoder: {encoder}}}}}"
    extra = f"    replicas: {replicas}\n" + (f"{parity}\n" if contender == "parity" else "")
    if stage == "emulated":
        model, hardware = EMULATED_MODEL
        accel = ACCELERATOR.format(model=model, hardware=hardware, extra=extra)
        return TEMPLATE.format(name=name, protected=accel, source="accel", model_extra="")
    return TEMPLATE.format(name=name, protected="", source="pre", model_extra=extra)


async def _inject(scenario: str, procs: Sequence[Any], seconds: float, rng: random.Random, *, stall_ms: float,
                  stall_every_ms: float, stop_s: float) -> None:
    """Stall the model node's workers as ``scenario`` says, for ``seconds``; every worker runs again after."""
    end = time.monotonic() + seconds
    try:
        if scenario == "stalls":
            while (left := end - time.monotonic()) > 0:
                await asyncio.sleep(min(left, rng.expovariate(1000 / stall_every_ms)))
                victim = rng.choice(procs)
                victim.send_signal(signal.SIGSTOP)
                await asyncio.sleep(stall_ms / 1000)
                victim.send_signal(signal.SIGCONT)
        elif scenario == "stopped":
            await asyncio.sleep(rng.uniform(0, max(0.0, seconds - stop_s) / 2))
            victim = rng.choice(procs)
            victim.send_signal(signal.SIGSTOP)
            await asyncio.sleep(stop_s)
            victim.send_signal(signal.SIGCONT)
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGCONT)


async def _slice(client: TopologyClient, requests: list[dict[str, np.ndarray]], labels: list[int], rate: float,
                 seconds: float, rng: random.Random) -> tuple[list[float], int, int]:
    """Open loop at ``rate`` for ``seconds``: latencies (ms), correct answers, answers rebuilt from parity."""
    latencies: list[float] = []
    correct = rebuilt = 0
    tasks = []

    async def one(i: int) -> None:
        nonlocal correct, rebuilt
        t0 = time.perf_counter()
        reply = await client.call(requests[i], timeout_ms=60_000)
        latencies.append((time.perf_counter() - t0) * 1000)
        if reply.error is None:
            correct += int(np.asarray(reply.tensors["label"]).ravel()[0]) == labels[i]
            rebuilt += H_RECONSTRUCTED in reply.headers

    start = time.perf_counter()
    sent = 0
    while time.perf_counter() - start < seconds:
        await asyncio.sleep(max(0.0, start + sent / rate - time.perf_counter()))
        tasks.append(asyncio.create_task(one(rng.randrange(len(requests)))))
        sent += 1
    await asyncio.gather(*tasks)
    return latencies, correct, rebuilt


def _stats(latencies: Sequence[float]) -> dict[str, float]:
    p50, p99, p999 = np.percentile(np.asarray(latencies), [50, 99, 99.9])
    return {"p50_ms": round(float(p50), 2), "p99_ms": round(float(p99), 2), "p99_9_ms": round(float(p999), 2),
            "gap_ms": round(float(p999 - p50), 2), "n": len(latencies)}


async def parity_bench(kafka: KafkaSettings, *, rate: float = 60.0, slice_s: float = 4.0, rounds: int = 4,
                       n: int = 2, k: int = 2, wait_ms: float | None = None, stall_ms: float | None = None,
                       stall_every_ms: float | None = None, stop_s: float = 1.5, seed: int = 0,
                       encoder: str = "sum", stage: str = "digits") -> dict[str, Any]:
    rng = random.Random(seed)
    if stage == "emulated":
        if encoder != "sum":
            raise FlowserveError("--stage emulated protects a pass-through stage, whose parity model decodes "
                                 "only summed queries; use --encoder sum")
        # the stragglers: a worker stalls for 10x its batch time on ~3% of batches (at this load
        # nearly every batch holds one request, so ~3% of requests meet a stall's start)
        batch_ms = 1000 * hw.batch_seconds(*EMULATED_MODEL, 1)
        stall_ms = stall_ms if stall_ms is not None else 10 * batch_ms
        stall_every_ms = stall_every_ms if stall_every_ms is not None else 1000 / (0.03 * rate)
    else:
        stall_ms = stall_ms if stall_ms is not None else 60.0
        stall_every_ms = stall_every_ms if stall_every_ms is not None else 300.0
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
    training = topologies["none"][1].nodes["model"].component.train_parity(k, encoder)
    for _, topology in topologies.values():
        prepare_to_drive(topology)
    requests, labels = topologies["none"][1].sampler()(2000)
    # One contender deployed at a time (a shared machine cannot hold three deployments' workers at once);
    # the contenders take turns in blocks, and each block runs a slice of every scenario.
    slices: dict[str, dict[str, list[list[float]]]] = {s: {c: [] for c in CONTENDERS} for s in SCENARIOS}
    tally = {s: {c: {"correct": 0, "rebuilt": 0, "cpu_s": 0.0} for c in CONTENDERS} for s in SCENARIOS}
    for c in balanced_order(CONTENDERS, rounds):
        path, topology = topologies[c]
        host = ProcessHost(path, topology, kafka)
        try:
            await host.start()
            async with TopologyClient(topology, kafka) as client:
                await wait_ready(client, requests[0], timeout_s=180)
                await _slice(client, requests, labels, rate, 2.0, rng)  # warm-up: groups form, caches fill
                for scenario in SCENARIOS:
                    procs = [p for ps in host.procs.values() for p in ps]
                    cpu0 = sum(cpu_seconds(p.pid) for p in procs)
                    inject = asyncio.create_task(_inject(scenario, host.procs[protected], slice_s, rng,
                                                         stall_ms=stall_ms,
                                                         stall_every_ms=stall_every_ms, stop_s=stop_s))
                    lat, correct, rebuilt = await _slice(client, requests, labels, rate, slice_s, rng)
                    await inject
                    t = tally[scenario][c]
                    t["cpu_s"] += sum(cpu_seconds(p.pid) for p in procs) - cpu0
                    t["correct"] += correct
                    t["rebuilt"] += rebuilt
                    slices[scenario][c].append(lat)
        finally:
            host.stop()
    results: dict[str, Any] = {}
    for scenario in SCENARIOS:
        part: dict[str, Any] = {}
        for c in CONTENDERS:
            pooled = [x for s in slices[scenario][c] for x in s]
            t = tally[scenario][c]
            part[c] = {**_stats(pooled), "accuracy": round(t["correct"] / len(pooled), 4), "rebuilt": t["rebuilt"],
                       "cpu_ms_per_request": round(1000 * t["cpu_s"] / len(pooled), 3)}
        point, low, high = gap_ratio(slices[scenario]["parity"], slices[scenario]["replicas"])
        part["gap_ratio_parity_over_replicas"] = [round(point, 3), round(low, 3), round(high, 3)]
        part["p50_ratio_parity_over_none"] = round(part["parity"]["p50_ms"] / part["none"]["p50_ms"], 3)
        results[scenario] = part
        _print(scenario, part)
    overhead = results["clean"]["parity"]["cpu_ms_per_request"] / results["clean"]["none"]["cpu_ms_per_request"] - 1
    stragglers = [s for s in SCENARIOS if s != "clean"]
    degraded = {int(key): value for key, value in training["degraded_accuracy"].items()}
    return {
        "workload": "parity", "stage": stage, "encoder": encoder, "rate_rps": rate, "slice_s": slice_s,
        "rounds": rounds, "n": n, "k": k, "wait_ms": wait_ms,
        "stall_ms": stall_ms, "stall_every_ms": stall_every_ms, "stop_s": stop_s,
        "base_accuracy": training["base_accuracy"], "degraded_accuracy": degraded,
        "cpu_overhead_clean": round(overhead, 3), "scenarios": results,
        "targets": {
            "gap_le_third_of_replicas": all(results[s]["gap_ratio_parity_over_replicas"][0] <= 1 / 3
                                            for s in stragglers),
            "median_le_1.1x_none": all(results[s]["p50_ratio_parity_over_none"] <= 1.1 for s in SCENARIOS),
            "overhead_le_1/k+5%": overhead <= 1 / k + 0.05,
            "degraded_accuracy_k2_ge_0.85": degraded.get(2, 0.0) >= 0.85,
        },
    }


def _print(scenario: str, part: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"parity bench, scenario '{scenario}'")
    for col in ("contender", "p50 ms", "p99 ms", "p99.9 ms", "gap ms", "accuracy", "rebuilt", "cpu ms/req", "n"):
        table.add_column(col, justify="left" if col == "contender" else "right")
    for c in CONTENDERS:
        r = part[c]
        table.add_row(c, *(str(r[key]) for key in ("p50_ms", "p99_ms", "p99_9_ms", "gap_ms", "accuracy", "rebuilt",
                                                   "cpu_ms_per_request", "n")))
    console.print(table)
    console.print(f"gap ratio parity/replicas {part['gap_ratio_parity_over_replicas']} (point, 95% interval); "
                  f"p50 parity/none {part['p50_ratio_parity_over_none']}")
