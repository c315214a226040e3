"""Scale-out of one CPU-heavy stage: its throughput with 1 and with 2 consumers sharing its partitions.

Layout (this machine): the broker; two deployments of a one-node topology whose node burns CPU per row,
``scale-c1`` with one consumer and ``scale-c2`` with two (:class:`~flowserve.runtime.host.ProcessHost`,
one process per consumer), both running the whole time; this process as a closed-loop load generator.
The two take turns in short slices (balanced order, see :mod:`flowserve.bench.paired`), so the machine's
drifting speed falls on both alike; the ratio c2/c1 of throughput comes with a bootstrap interval.

The emulated-accelerator half of the issue's bench (1, 2, 4, 8 consumers over 8 partitions) waits for
the emulated-accelerator component.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from flowserve.bench.common import console, run_id
from flowserve.bench.paired import Slice, balanced_order, summary, throughput_ratio
from flowserve.client import TopologyClient, new_request_id
from flowserve.client.traffic import wait_ready
from flowserve.component import Batch, Component, Port
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.topology import load_topology

CONCURRENCY = 64
TARGET = 1.7  # the issue's: two consumers of a CPU-bound stage on two cores, at least 1.7x one

_TOPOLOGY = """
name: {name}
partitions: 8
deadline_ms: 120000
nodes:
  burn: {{component: flowserve.bench.scale:Burn, inputs: {{x: input.x}}, replicas: {replicas}, max_batch: 16}}
outputs: {{y: burn.x}}
"""


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


async def scale_bench(kafka: KafkaSettings, *, slice_s: float = 3.0, rounds: int = 6) -> dict[str, Any]:
    """Throughput of the CPU stage with 2 consumers over 1, in ``rounds`` slices each (after one warm-up)."""
    suffix = run_id()
    labels = ("c1", "c2")
    hosts: list[ProcessHost] = []
    with tempfile.TemporaryDirectory(prefix="flowserve-scale-") as tmp:
        clients: dict[str, TopologyClient] = {}
        wakes: dict[str, asyncio.Event] = {}
        flushers: list[asyncio.Task[None]] = []
        try:
            for label, replicas in zip(labels, (1, 2), strict=True):
                path = Path(tmp) / f"{label}.yaml"
                path.write_text(_TOPOLOGY.format(name=f"scale-{label}-{suffix}", replicas=replicas))
                topology = load_topology(path)
                await create_topology_topics(topology, kafka)
                host = ProcessHost(path, topology, kafka)
                host.start_processes()
                hosts.append(host)
                client = TopologyClient(topology, kafka)
                await client.start()
                clients[label] = client
                wakes[label] = asyncio.Event()
                flushers.append(asyncio.create_task(_flush(client, wakes[label])))
            console.print("scale: waiting for both deployments (1 and 2 consumers of the CPU stage)…")
            for label in labels:
                await wait_ready(clients[label], {"x": np.ones((1, 4), np.float32)})
            slices: dict[str, list[Slice]] = {label: [] for label in labels}
            for label in labels:  # warm-up, discarded
                await _slice(clients[label], wakes[label], slice_s)
            for label in balanced_order(labels, rounds):
                s = await _slice(clients[label], wakes[label], slice_s)
                slices[label].append(s)
                console.print(f"  {label}: {s.requests / s.seconds:7.1f} req/s")
        finally:
            for task in flushers:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for client in clients.values():
                await client.stop()
            for host in hosts:
                host.stop()
    ratio, low, high = throughput_ratio(slices["c2"], slices["c1"])
    c1, c2 = summary(slices["c1"]), summary(slices["c2"])
    console.print(f"CPU stage: 1 consumer {c1['throughput_rps']:.1f} req/s, 2 consumers {c2['throughput_rps']:.1f}"
                  f" req/s: ratio {ratio:.2f} (95% CI {low:.2f}-{high:.2f}; target >= {TARGET})")
    return {"workload": "scale", "slice_seconds": slice_s, "slices": rounds, "concurrency": CONCURRENCY,
            "cpu": {"consumers_1": c1, "consumers_2": c2,
                    "ratio_2_over_1": {"point": round(ratio, 3), "low": round(low, 3), "high": round(high, 3)}},
            "not_measured": ["emulated-accelerator stage with 1, 2, 4, 8 consumers (its component is not built yet)"],
            "targets": {"cpu_2_consumers_ge_1.7x": ratio >= TARGET}}


async def _flush(client: TopologyClient, wake: asyncio.Event) -> None:
    """One flush per wake-up for all lanes: TopologyClient's outbox is shared, so lanes only queue."""
    while True:
        await wake.wait()
        wake.clear()
        await client.flush()
