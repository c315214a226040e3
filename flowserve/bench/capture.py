"""The cost of capture: the digits topology at saturation with capture off, at 10% and at 100%
(captured requests get lineage records and OpenTelemetry spans), and the effect of a drift detector
(a side branch in its own process) on the critical path's p99 at a steady request rate.

Every configuration runs in this process on the same broker, one after the other, in one run::

    flowserve bench capture [--records N] [--rate R] [--seconds S]
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
from flowserve.bench.latency import _open_loop
from flowserve.client import TopologyClient
from flowserve.client.kafka import new_request_id
from flowserve.runtime.host import InlineHost, ProcessHost, create_topology_topics
from flowserve.runtime.settings import KafkaSettings
from flowserve.runtime.traffic import wait_ready
from flowserve.topology.graph import Topology, load_topology_text

DIGITS = """
name: {name}
partitions: 4
nodes:
  pre: {{component: components.digits:Normalize, inputs: {{pixels: input.pixels}}}}
  model: {{component: components.torch_stage:TorchClassifier, params: {{model: digits-mlp}}, inputs: {{x: pre.x}}}}
  post: {{component: components.postprocess:ArgMax, inputs: {{logits: model.logits}}}}
{extra}
outputs: {{label: post.label, probs: post.probs}}
{capture}
"""
DETECTOR = """  input_drift:
    component: components.drift:FeatureDrift
    params: {window: 100, reference: "components.drift:digits_reference"}
    inputs: {x: pre.x}"""
CONCURRENCY = 64
ROUNDS = 3


def _topology(sample: float | None, extra: str = "") -> tuple[str, Topology]:
    capture = "" if sample is None else f"capture: {{sample: {sample}, lineage: true, tracing: true}}"
    text = DIGITS.format(name=f"cap{run_id()}", extra=extra, capture=capture)
    return text, load_topology_text(text, source="bench")


def _inputs(n: int) -> list[dict[str, np.ndarray]]:
    from components.digits import sample

    requests, _ = sample(n, seed=0)
    return requests


async def _saturate(kafka: KafkaSettings, sample: float | None, requests: int) -> dict[str, float]:
    """Closed loop with CONCURRENCY requests in flight: throughput and latency percentiles."""
    _, topology = _topology(sample)
    inputs = _inputs(requests)
    async with InlineHost(topology, kafka), TopologyClient(topology, kafka) as client:
        await wait_ready(client, inputs[0])
        for x in inputs[:200]:  # warm up (batch policy, caches)
            await client.call(x, timeout_ms=30_000)
        latencies: list[float] = []
        started: dict[str, float] = {}
        inflight: set[asyncio.Future[Any]] = set()
        sent = 0
        t0 = time.perf_counter()
        while sent < len(inputs) or inflight:
            while sent < len(inputs) and len(inflight) < CONCURRENCY:  # keep CONCURRENCY in flight
                rid = new_request_id()
                inflight.add(client.expect(rid))
                started[rid] = time.perf_counter()
                await client.queue(inputs[sent], request_id=rid, timeout_ms=60_000)
                sent += 1
            await client.flush()  # one produce for everything queued this round
            done, inflight = await asyncio.wait(inflight, timeout=60, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                raise TimeoutError(f"no reply within 60 s ({len(inflight)} in flight)")
            now = time.perf_counter()
            for future in done:
                reply = future.result()
                assert reply.error is None, reply.error
                latencies.append((now - started.pop(reply.request_id)) * 1000)
        seconds = time.perf_counter() - t0
    return {"throughput_rps": len(inputs) / seconds, "p50_ms": float(np.percentile(latencies, 50)),
            "p99_ms": float(np.percentile(latencies, 99)), "n": len(latencies)}


async def _steady(kafka: KafkaSettings, detector: bool, rate: float, seconds: float) -> dict[str, float]:
    """Open loop at ``rate``: p99 of the critical path, with or without a detector process on pre.x."""
    text, topology = _topology(None, DETECTOR if detector else "")
    inputs = _inputs(int(rate * seconds) + 400)
    critical = [n for n in topology.nodes if n != "input_drift"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.yaml"
        path.write_text(text)
        procs = ProcessHost(path, topology, kafka)
        await create_topology_topics(topology, kafka)
        if detector:
            procs.spawn("input_drift")
        host = InlineHost(_critical_only(topology, critical), kafka)
        try:
            async with host, TopologyClient(topology, kafka) as client:
                await wait_ready(client, inputs[0])
                for x in inputs[:200]:
                    await client.call(x, timeout_ms=30_000)
                if detector:  # measure with the detector up and reporting, not while it imports
                    await _first_report(kafka, topology)
                it = iter(inputs[200:])
                lock = asyncio.Lock()

                async def send(_: int) -> None:
                    rid = new_request_id()
                    future = client.expect(rid)
                    async with lock:
                        await client.send(next(it), request_id=rid, timeout_ms=30_000)
                    reply = await asyncio.wait_for(future, 30)
                    assert reply.error is None, reply.error

                latencies = await _open_loop(send, rate, seconds)
        finally:
            procs.stop()
    return {"p50_ms": float(np.percentile(latencies, 50)), "p99_ms": float(np.percentile(latencies, 99)),
            "n": len(latencies)}


def _critical_only(topology: Topology, keep: list[str]) -> Topology:
    from dataclasses import replace

    return replace(topology, nodes={n: topology.nodes[n] for n in keep})


async def _first_report(kafka: KafkaSettings, topology: Topology, timeout_s: float = 120.0) -> None:
    from flowserve.capture.drift import drift_state

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if await drift_state(kafka, topology.name, prefix=topology.spec.prefix, timeout_s=10):
                return
        await asyncio.sleep(0.5)
    raise TimeoutError("the drift detector did not report within the timeout")


async def capture_bench(kafka: KafkaSettings, requests: int = 3000, rate: float = 100.0,
                        seconds: float = 15.0) -> dict[str, Any]:
    _, probe = _topology(None)
    for node in probe.nodes.values():
        node.component.prepare()  # train the model once if it is not cached
    results: dict[str, Any] = {}
    runs: dict[str, list[dict[str, float]]] = {"off": [], "10pct": [], "100pct": []}
    for round_ in range(ROUNDS):  # interleaved rounds, medians: the machine is shared and noisy
        for label, sample in (("off", None), ("10pct", 0.1), ("100pct", 1.0)):
            console.print(f"[bold]capture {label}[/] (round {round_ + 1}/{ROUNDS}): {requests} requests, "
                          f"{CONCURRENCY} in flight")
            runs[label].append(await _saturate(kafka, sample, requests))
            console.print(f"  {runs[label][-1]['throughput_rps']:.0f} req/s  p99 {runs[label][-1]['p99_ms']:.1f} ms")
    for label, values in runs.items():
        results[label] = {k: float(np.median([v[k] for v in values])) for k in values[0]}
    for label, detector in (("no_detector", False), ("detector", True)):
        console.print(f"[bold]{label}[/]: {rate:.0f} req/s for {seconds:.0f} s")
        results[label] = await _steady(kafka, detector, rate, seconds)
        console.print(f"  p50 {results[label]['p50_ms']:.1f} ms  p99 {results[label]['p99_ms']:.1f} ms")
    off = results["off"]
    results["ratios"] = {
        "throughput_10pct_vs_off": results["10pct"]["throughput_rps"] / off["throughput_rps"],
        "throughput_100pct_vs_off": results["100pct"]["throughput_rps"] / off["throughput_rps"],
        "p99_10pct_vs_off": results["10pct"]["p99_ms"] / off["p99_ms"],
        "p99_100pct_vs_off": results["100pct"]["p99_ms"] / off["p99_ms"],
        "p99_detector_vs_none": results["detector"]["p99_ms"] / results["no_detector"]["p99_ms"],
    }
    for name, value in results["ratios"].items():
        console.print(f"{name}: {value:.3f}")
    return {"workload": "capture", **results}

