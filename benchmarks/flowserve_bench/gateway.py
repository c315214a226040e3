"""The V2 HTTP gateway vs the async Kafka path, closed loop, on the digits pipeline deployed two ways.

Layout (all on this machine, each in its own process): the broker; the topology's workers
(:class:`~flowserve.runtime.host.ProcessHost`, one process per node); the gateway
(``flowserve gateway``, its own process); this process as the load generator. For each concurrency
level, ``C`` lanes each send a request and wait for its answer, for ``seconds``: first over HTTP through
the gateway, then straight to Kafka with :class:`~flowserve.client.TopologyClient` (the async path).
Throughput and latency p50/p99 per level, and the ratio gateway/async.

Two topologies, one after the other: ``digits`` (three worker processes, four Kafka crossings per
request) and ``digits-fused`` (the same three components fused into one worker: two crossings).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.client import TopologyClient, new_request_id
from flowserve.client.http import AsyncHttpClient
from flowserve.client.traffic import prepare_to_drive, wait_ready
from flowserve.errors import FlowserveError
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.topology import load_topology
from flowserve.wire.v2 import build_request
from flowserve_bench.common import console
from flowserve_bench.graphs import EXAMPLES
from flowserve_bench.load import closed_lanes

LEVELS = (1, 8, 32, 128)
#: the digits pipeline as three worker processes, and the same pipeline fused into one (``fuse:``), as
#: found in a flowserve checkout's ``topologies/`` (run the bench from the checkout).
TOPOLOGIES = (EXAMPLES / "digits.yaml", EXAMPLES / "digits-fused.yaml")


def _stats(latencies: list[float], seconds: float, errors: int) -> dict[str, float]:
    arr = np.asarray(latencies) if latencies else np.asarray([float("nan")])
    return {"rps": round(len(latencies) / seconds, 1), "p50_ms": round(float(np.percentile(arr, 50)), 2),
            "p99_ms": round(float(np.percentile(arr, 99)), 2), "n": len(latencies), "errors": errors}


async def _closed_loop(call: Any, concurrency: int, seconds: float, n_inputs: int) -> dict[str, float]:
    done, errors = await closed_lanes(call, n_inputs, concurrency, seconds)
    return _stats(done.latencies, done.seconds, errors)


def start_gateway(kafka: KafkaSettings, *paths: Path, processes: int = 1,
                  plans: tuple[Path, ...] = ()) -> tuple[subprocess.Popen[str], str]:
    """``flowserve gateway`` serving ``paths`` (with the plan files ``plans``) in its own process (``processes``
    > 1: that many on one port); its URL."""
    # The gateway reads its connection from --broker and FLOWSERVE_* variables, as the workers do: the
    # embedded broker answers a fetch only when its wait ends, so the gateway must get that broker's wait.
    env = {**os.environ, "FLOWSERVE_FETCH_MAX_WAIT_MS": str(kafka.fetch_max_wait_ms)}
    cmd = [sys.executable, "-m", "flowserve", "gateway", *map(str, paths), "--broker", kafka.bootstrap, "--port", "0"]
    if processes > 1:
        cmd += ["--processes", str(processes)]
    for plan in plans:
        cmd += ["--plan", str(plan)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http://"):
        proc.kill()
        raise RuntimeError(f"the gateway did not start (printed {url!r})")
    return proc, url


async def wait_http_ready(client: AsyncHttpClient, infer: str, body: bytes, timeout_s: float = 120.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        ready = await client.get("/v2/health/ready")
        if ready.status == 200:
            reply = await client.request("POST", infer, body)
            if reply.status == 200:
                return
        await asyncio.sleep(0.2)
    raise RuntimeError("the gateway did not become ready")


async def gateway_bench(kafka: KafkaSettings, seconds: float = 5.0, levels: tuple[int, ...] = LEVELS,
                        topologies: tuple[Path, ...] = TOPOLOGIES) -> dict[str, Any]:
    """Each topology in turn: its workers, a gateway, then every level over HTTP and over Kafka."""
    missing = [str(p) for p in topologies if not p.is_file()]
    if missing:
        raise FlowserveError(f"the gateway bench runs {', '.join(missing)}, not found here: run it from a "
                             "flowserve checkout (its topologies/ folder)")
    runs: dict[str, Any] = {}
    for path in topologies:
        runs[path.stem] = await _bench_topology(kafka, path, seconds, levels)
    for name, run in runs.items():
        for lvl, r in run["gateway_over_async"].items():
            console.print(f"  {name:<13} c={lvl:<4} gateway {run['gateway'][lvl]['rps']:>6.0f} req/s"
                          f" p99 {run['gateway'][lvl]['p99_ms']:5.1f} ms  gateway/async {r:.2f}")
    return {"workload": "gateway", "workers": "processes", "seconds_per_level": seconds, "topologies": runs}


async def _bench_topology(kafka: KafkaSettings, path: Path, seconds: float,
                          levels: tuple[int, ...]) -> dict[str, Any]:
    topology = load_topology(path)
    prepare_to_drive(topology)
    inputs, _ = topology.sampler()(256)
    bodies = [build_request(x)[0] for x in inputs]
    infer = f"/v2/models/{topology.name}/infer"
    await create_topology_topics(topology, kafka)
    host = ProcessHost(path, topology, kafka)
    host.start_processes()
    gateway, url = start_gateway(kafka, path)
    results: dict[str, dict[str, dict[str, float]]] = {"gateway": {}, "async": {}}
    try:
        async with AsyncHttpClient(url) as http, TopologyClient(topology, kafka) as client:
            console.print(f"{topology.name}: {len(topology.nodes)} worker process(es), gateway at {url}; waiting…")
            await wait_http_ready(http, infer, bodies[0])
            await wait_ready(client, inputs[0])

            async def via_http(i: int) -> bool:
                reply = await http.request("POST", infer, bodies[i], {"Content-Type": "application/json"})
                return reply.status == 200

            # TopologyClient.call flushes its shared outbox per call, which is not safe with concurrent
            # callers; the async path here queues per request and flushes once per event-loop tick, as the
            # gateway does, so both sides batch alike.
            wake = asyncio.Event()

            async def flusher() -> None:
                while True:
                    await wake.wait()
                    wake.clear()
                    await client.flush()

            flush_task = asyncio.create_task(flusher())

            async def via_kafka(i: int) -> bool:
                rid = new_request_id()
                fut = client.expect(rid)
                await client.queue(inputs[i], request_id=rid)
                wake.set()
                try:
                    reply = await asyncio.wait_for(fut, topology.spec.deadline_ms / 1000)
                except TimeoutError:
                    return False
                return reply.error is None

            for level in levels:
                for name, call in (("gateway", via_http), ("async", via_kafka)):
                    await _closed_loop(call, level, min(1.0, seconds / 4), len(bodies))  # warm-up
                    stats = await _closed_loop(call, level, seconds, len(bodies))
                    results[name][str(level)] = stats
                    console.print(f"  {name:<8} c={level:<4} {stats['rps']:>8.0f} req/s  p50 {stats['p50_ms']:6.1f} ms"
                                  f"  p99 {stats['p99_ms']:6.1f} ms  errors {stats['errors']}")
            flush_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flush_task
    finally:
        gateway.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            gateway.wait(10)
        if gateway.poll() is None:
            gateway.kill()
        host.stop()
    ratio = {lvl: round(results["gateway"][lvl]["rps"] / max(results["async"][lvl]["rps"], 1e-9), 3)
             for lvl in results["gateway"]}
    return {"topology": topology.name, "nodes": list(topology.nodes), **results, "gateway_over_async": ratio}
