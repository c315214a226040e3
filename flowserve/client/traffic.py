"""Sample traffic: send a topology's sample requests, collect replies, report accuracy and latency."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowserve.client.kafka import Reply, TopologyClient
from flowserve.errors import FlowserveError
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.heap import settle
from flowserve.topology.graph import Topology


def prepare_to_drive(topology: Topology) -> None:
    """In a process that will send the topology traffic: run each component's one-time preparation (e.g.
    train a missing model), then freeze the heap. Preparing imports torch here too, and unfrozen, each of
    this process's full collections (~100 ms) would stall every request in flight."""
    for node in topology.nodes.values():
        node.component.prepare()
    settle()


@dataclass
class SampleReport:
    sent: int
    ok: int
    errors: int
    timeouts: int
    correct: int
    labelled: int
    latencies_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0
    predictions: list[tuple[str, Any, Any]] = field(default_factory=list)  # (id, predicted, label)
    error_samples: list[str] = field(default_factory=list)

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.labelled if self.labelled else None

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {"sent": self.sent, "ok": self.ok, "errors": self.errors, "timeouts": self.timeouts,
                "accuracy": self.accuracy, "p50_ms": self.percentile(50), "p99_ms": self.percentile(99),
                "throughput_rps": self.ok / self.seconds if self.seconds else 0.0}


async def wait_ready(client: TopologyClient, example: dict[str, np.ndarray], timeout_s: float = 120.0) -> float:
    """Send a probe until one comes back: the first may wait for consumer groups to form."""
    t0 = time.perf_counter()
    deadline = t0 + timeout_s
    last_error = "no reply"
    while time.perf_counter() < deadline:
        try:
            reply = await client.call(example, timeout_ms=int(min(30.0, deadline - time.perf_counter()) * 1000))
        except TimeoutError:
            continue
        if reply.error is None:
            return time.perf_counter() - t0
        # While stages are still joining their groups, joins can time out and deadlines pass: retry.
        last_error = reply.error
    raise FlowserveError(f"topology '{client.topology.name}' did not answer within {timeout_s:.0f} s "
                         f"(last: {last_error})")


def _prediction(reply: Reply) -> Any:
    for name in ("label", "labels", "class", "prediction"):
        if name in reply.tensors:
            arr = reply.tensors[name]
            return arr.reshape(-1)[0].item() if arr.size == 1 else arr.tolist()
    name, arr = next(iter(reply.tensors.items()), ("", np.zeros(0)))
    return arr.tolist()


async def run_sample(topology: Topology, kafka: KafkaSettings, n: int, *, concurrency: int = 4,
                     timeout_ms: int | None = None, sampler_kwargs: dict[str, Any] | None = None,
                     progress: Callable[[int], None] | None = None) -> SampleReport:
    sampler = topology.sampler()
    inputs, labels = sampler(n, **(sampler_kwargs or {}))
    report = SampleReport(sent=0, ok=0, errors=0, timeouts=0, correct=0, labelled=0)
    async with TopologyClient(topology, kafka) as client:
        await wait_ready(client, inputs[0])
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(inputs)):
            queue.put_nowait(i)

        async def lane() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                t0 = time.perf_counter()
                report.sent += 1
                try:
                    reply = await client.call(inputs[i], timeout_ms=timeout_ms)
                except TimeoutError:
                    report.timeouts += 1
                    continue
                if reply.error is not None:
                    report.errors += 1
                    if len(report.error_samples) < 5:
                        report.error_samples.append(reply.error)
                    continue
                report.latencies_ms.append((time.perf_counter() - t0) * 1000)
                report.ok += 1
                predicted = _prediction(reply)
                label = labels[i] if i < len(labels) else None
                if label is not None:
                    report.labelled += 1
                    report.correct += int(predicted == label)
                if len(report.predictions) < 10:
                    report.predictions.append((reply.request_id, predicted, label))
                if progress:
                    progress(report.ok + report.errors + report.timeouts)

        t0 = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(max(1, concurrency))))
        report.seconds = time.perf_counter() - t0
    return report
