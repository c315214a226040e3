"""CPU per request with capture off and at 100%, every stage in one process, and the part spent in capture.

Far less sensitive to this machine's drifting speed than throughput (though not immune: a slow stretch
makes every instruction dearer): ``flowserve bench capture --only cpu``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowserve.capture import capture_hooks
from flowserve.capture.tracing import flush
from flowserve.client import TopologyClient
from flowserve.client.kafka import new_request_id
from flowserve.component import Component
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.runtime.hooks import BatchOutcome, StageContext, StageHooks
from flowserve.runtime.host import InlineHost
from flowserve.topology.graph import Node, Topology
from flowserve_bench.capture import CONCURRENCY, sample_inputs, topology, warm
from flowserve_bench.common import console, cpu_seconds


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


async def capture_cpu(kafka: KafkaSettings, requests: int = 3000, rounds: int = 3,
                      broker_pid: int | None = None) -> dict[str, Any]:
    """CPU per request, capture off vs 100% (lineage and tracing on), every stage in this process.

    Far less sensitive to a noisy machine than throughput: the digits topology runs in an
    :class:`~flowserve.runtime.host.InlineHost` with the closed-loop load (``CONCURRENCY`` in flight) in
    the same event loop; per configuration, the process's CPU seconds per request (workers and load
    together), the broker's (when ``broker_pid`` is given), and the part spent inside
    capture's ``begin``/``end`` hooks (capture's own cost, all stages together). Medians over rounds.
    """
    spent = [0.0]

    class Timed(StageHooks):
        """Capture's hooks, with the thread CPU spent in ``begin`` and ``end`` added up."""

        def __init__(self, inner: StageHooks) -> None:
            self.inner = inner

        def start(self, stage: StageContext) -> None:
            self.inner.start(stage)

        def begin(self, items: Sequence[Any]) -> Any:
            t = time.thread_time()
            try:
                return self.inner.begin(items)
            finally:
                spent[0] += time.thread_time() - t

        def end(self, token: Any, outcome: BatchOutcome) -> None:
            t = time.thread_time()
            try:
                self.inner.end(token, outcome)
            finally:
                spent[0] += time.thread_time() - t

        def after_step(self, *, force: bool) -> bool:
            return self.inner.after_step(force=force)

        def close(self) -> None:
            self.inner.close()

    def timed_capture(graph: Topology, node: Node, component: Component) -> list[StageHooks]:
        return [Timed(h) for h in capture_hooks(graph, node, component)]

    inputs = sample_inputs(1000)
    _, probe = topology(None)
    for node in probe.nodes.values():
        node.component.prepare()
    runs: dict[str, list[dict[str, float]]] = {"off": [], "100pct": []}
    for round_ in range(rounds):
        for label, sample in (("off", None), ("100pct", 1.0)):
            _, deployed = topology(sample)
            async with InlineHost(deployed, kafka, WorkerSettings(metrics_interval_s=0), hooks=timed_capture), \
                    TopologyClient(deployed, kafka) as client:
                await warm(client, inputs)
                spent[0] = 0.0
                c0, b0, t0 = cpu_seconds(), cpu_seconds(broker_pid) if broker_pid else 0.0, time.perf_counter()
                done = await _closed_loop(client, inputs, requests)
                if sample is not None:
                    flush()
                c1, b1, t1 = cpu_seconds(), cpu_seconds(broker_pid) if broker_pid else 0.0, time.perf_counter()
            result = {"process_us": (c1 - c0) / done * 1e6, "broker_us": (b1 - b0) / done * 1e6,
                      "capture_us": spent[0] / done * 1e6, "throughput_rps": done / (t1 - t0)}
            runs[label].append(result)
            console.print(f"round {round_ + 1}/{rounds} capture {label:>6}: process {result['process_us']:.0f} "
                          f"us/req, in capture {result['capture_us']:.1f} us/req, broker "
                          f"{result['broker_us']:.0f} us/req, {result['throughput_rps']:.0f} req/s")
    off, full = _median(runs["off"]), _median(runs["100pct"])
    ratio = (off["process_us"] + off["broker_us"]) / (full["process_us"] + full["broker_us"])
    console.print(f"capture's own CPU: {full['capture_us']:.1f} us/req; CPU per request off / 100%: {ratio:.3f}")
    return {"workload": "capture-cpu", "requests": requests, "rounds": rounds, "off": off, "100pct": full,
            "cpu_ratio_off_vs_100pct": ratio, "per_round": runs}


async def _closed_loop(client: TopologyClient, inputs: list[dict[str, np.ndarray]], n: int) -> int:
    """``n`` requests with ``CONCURRENCY`` in flight; returns how many were answered."""
    inflight: set[asyncio.Future[Any]] = set()
    sent = done = 0
    while done < n:
        while sent < n and len(inflight) < CONCURRENCY:
            rid = new_request_id()
            inflight.add(client.expect(rid))
            await client.queue(inputs[sent % len(inputs)], request_id=rid, timeout_ms=60_000)
            sent += 1
        await client.flush()
        finished, inflight = await asyncio.wait(inflight, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if not finished:
            raise TimeoutError(f"no reply within 60 s ({len(inflight)} in flight)")
        for future in finished:
            assert future.result().error is None
            done += 1
    return done
