"""Scale-out by consumers: one stage's throughput as more consumers share its partitions.

Two halves, each with every deployment of it running the whole time (one worker process per consumer,
:class:`~flowserve.runtime.host.ProcessHost`) and this process as a closed-loop load generator:

- **CPU stage**: a node that burns pure-Python CPU per row, with 1 and 2 consumers (this machine has
  two cores). Target: 2 consumers >= 1.7x one.
- **Emulated-accelerator stage**: :class:`flowserve.builtin.Accelerator` holding its emulated device for
  the service time of its table (``nmt`` on ``gpu-small``, :mod:`flowserve.runtime.hardware`, which cites
  the tables' sources), with 1, 2, 4 and 8 consumers over 8 partitions. Each consumer stands for one more
  accelerator, so the stage, not this machine's cores, is the bottleneck. Target: 8 consumers >= 6x one.

Within a half the deployments take turns in short slices (balanced order, see
:mod:`flowserve_bench.paired`), so the machine's drifting speed falls on all alike; each ratio over one
consumer comes with a bootstrap interval. The CPU seconds of each deployment's workers during its own
slices show whether the consumers had the cores they needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from flowserve.client import TopologyClient, new_request_id
from flowserve.client.traffic import wait_ready
from flowserve.component import Batch, Component, Port
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.topology import load_topology
from flowserve_bench import graphs
from flowserve_bench.common import console, run_id
from flowserve_bench.paired import Slice, balanced_order, summary, throughput_ratio
from flowserve_bench.procs import cpu_of

CONCURRENCY = 64
CPU_TARGET = 1.7  # the issue's: two consumers of a CPU-bound stage on two cores, at least 1.7x one
EMULATED_TARGET = 6.0  # eight consumers of an emulated-accelerator stage, at least 6x one
EMULATED_CONSUMERS = (1, 2, 4, 8)

#: the two halves' topologies (in flowserve_bench/topologies/), deployed with 1, 2, ... replicas
CPU_TOPOLOGY, EMULATED_TOPOLOGY = "scale-cpu.yaml", "scale-emulated.yaml"


class Burn(Component):
    """Spends a fixed amount of pure-Python CPU per row (one core, whatever the BLAS threads), then passes
    the row through: a stand-in for a CPU-bound model."""

    inputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 4])}
    outputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 4])}
    max_batch: ClassVar[int] = 16
    # ~15 ms per row here: the stage, not the broker or the load generator, must be what limits throughput
    loops: ClassVar[int] = 250_000

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        x = batch["x"]
        for _ in range(len(x)):
            acc = 0
            for i in range(self.loops):
                acc ^= i
        return {"x": x}


@dataclass
class _Deployment:
    host: ProcessHost
    client: TopologyClient
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    slices: list[Slice] = field(default_factory=list)
    cpu_s: float = 0.0  # its workers' CPU seconds during its own measured slices


async def _slice(client: TopologyClient, wake: asyncio.Event, seconds: float) -> Slice:
    """A closed loop of ``CONCURRENCY`` lanes for ``seconds``: requests answered and the time taken."""
    row = {"x": np.ones((1, 4), np.float32)}
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def lane() -> None:
        while time.perf_counter() < stop_at:
            rid = new_request_id()
            fut = client.expect(rid)
            t0 = time.perf_counter()
            await client.queue(row, request_id=rid)
            wake.set()
            reply = await fut
            if reply.error is None:
                latencies.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(CONCURRENCY)))
    return Slice(len(latencies), time.perf_counter() - t0, latencies)


async def _interleaved(kafka: KafkaSettings, template: str, consumers: tuple[int, ...], *, what: str,
                       slice_s: float, rounds: int) -> dict[int, _Deployment]:
    """Deploy ``template`` once per consumer count, all at once, and measure them in turns."""
    suffix = run_id()
    deployments: dict[int, _Deployment] = {}
    flushers: list[asyncio.Task[None]] = []
    with tempfile.TemporaryDirectory(prefix="flowserve-scale-") as tmp:
        try:
            for n in consumers:
                path = Path(tmp) / f"c{n}.yaml"
                path.write_text(graphs.text(template, f"scale-{what}-c{n}-{suffix}", {"nodes.stage.replicas": n}))
                topology = load_topology(path)
                await create_topology_topics(topology, kafka)
                host = ProcessHost(path, topology, kafka)
                host.start_processes()
                client = TopologyClient(topology, kafka)
                deployments[n] = d = _Deployment(host, client)
                await client.start()
                flushers.append(asyncio.create_task(_flush(client, d.wake)))
            console.print(f"scale: waiting for the {what} stage with {', '.join(map(str, consumers))} consumers…")
            for d in deployments.values():
                await wait_ready(d.client, {"x": np.ones((1, 4), np.float32)}, timeout_s=120)
            for d in deployments.values():  # warm-up, discarded
                await _slice(d.client, d.wake, slice_s)
            for n in balanced_order(list(consumers), rounds):
                d = deployments[n]
                pids = [p.pid for ps in d.host.procs.values() for p in ps]
                before = cpu_of(pids)
                s = await _slice(d.client, d.wake, slice_s)
                d.cpu_s += cpu_of(pids) - before
                d.slices.append(s)
                console.print(f"  {what} c{n}: {s.requests / s.seconds:7.1f} req/s")
        finally:
            for task in flushers:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for d in deployments.values():
                await d.client.stop()
                d.host.stop()
    return deployments


def _report(deployments: dict[int, _Deployment], what: str) -> dict[str, Any]:
    """Per consumer count: throughput, latency, the workers' cores busy, and the ratio over one consumer."""
    base = deployments[min(deployments)]
    out: dict[str, Any] = {}
    for n, d in deployments.items():
        row: dict[str, Any] = dict(summary(d.slices))
        seconds = sum(s.seconds for s in d.slices)
        row["worker_cores"] = round(d.cpu_s / seconds, 3) if seconds else 0.0
        if d is not base:
            ratio, low, high = throughput_ratio(d.slices, base.slices)
            row["ratio_over_1"] = {"point": round(ratio, 3), "low": round(low, 3), "high": round(high, 3)}
        out[f"consumers_{n}"] = row
        console.print(f"{what} stage, {n} consumer(s): {row['throughput_rps']:.1f} req/s, workers busy "
                      f"{row['worker_cores']:.2f} cores" + (
                          f", {row['ratio_over_1']['point']:.2f}x one ({row['ratio_over_1']['low']:.2f}-"
                          f"{row['ratio_over_1']['high']:.2f})" if "ratio_over_1" in row else ""))
    return out


async def scale_bench(kafka: KafkaSettings, *, slice_s: float = 3.0, rounds: int = 6) -> dict[str, Any]:
    """Both halves, one after the other (only one half's deployments run at a time)."""
    cpu = _report(await _interleaved(kafka, CPU_TOPOLOGY, (1, 2), what="cpu", slice_s=slice_s, rounds=rounds),
                  "CPU")
    emulated = _report(await _interleaved(kafka, EMULATED_TOPOLOGY, EMULATED_CONSUMERS, what="emulated",
                                          slice_s=slice_s, rounds=rounds), "emulated")
    # targets are decided on the interval's lower end, not the point estimate
    cpu_ratio = cpu["consumers_2"]["ratio_over_1"]["low"]
    emulated_ratio = emulated[f"consumers_{max(EMULATED_CONSUMERS)}"]["ratio_over_1"]["low"]
    console.print(f"targets (interval's lower end): CPU 2/1 {cpu_ratio:.2f} (>= {CPU_TARGET}); emulated 8/1 "
                  f"{emulated_ratio:.2f} (>= {EMULATED_TARGET})")
    return {"workload": "scale", "slice_seconds": slice_s, "slices": rounds, "concurrency": CONCURRENCY,
            "cpu": cpu, "emulated": {"model": "nmt", "hardware": "gpu-small", "max_batch": 2, **emulated},
            "targets": {"cpu_2_consumers_ge_1.7x": cpu_ratio >= CPU_TARGET,
                        "emulated_8_consumers_ge_6x": emulated_ratio >= EMULATED_TARGET}}


async def _flush(client: TopologyClient, wake: asyncio.Event) -> None:
    """One flush per wake-up for all lanes: TopologyClient's outbox is shared, so lanes only queue."""
    while True:
        await wake.wait()
        wake.clear()
        await client.flush()
