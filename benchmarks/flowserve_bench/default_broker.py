"""The default broker against Apache Kafka as its start script runs it, and against Tansu (the old default).

Three brokers on this machine at once: the default (:func:`~flowserve.kafka.brokers.start_default`:
Apache Kafka under :data:`~flowserve.kafka.brokers.DEV_JVM` where Java and its jars are here), Apache Kafka
under :data:`~flowserve.kafka.brokers.SERVER_JVM` (the baseline; what ``flowserve bench`` starts for
``--broker-kind kafka``), and the embedded Tansu broker. Each carries its own deployment of
``digits-fused`` (its worker process and a gateway process). For each concurrency level the three take
turns in short slices of closed-loop HTTP load (:func:`~flowserve_bench.paired.balanced_order`), so the
machine's drift falls on all of them alike; per slice, the requests answered, their latencies and the
broker process's CPU seconds. Ratios of throughput to the baseline come with 95% bootstrap intervals over
slices. Also each broker's start-up (wall seconds, and the CPU seconds its process spent to get there)
and its resident memory at the end.

Last, each broker's history cost (:func:`_history`): one-record round trips (produce, then fetch by an
assigned consumer) on a fresh topic, then ``HISTORY`` more one-record batches written to it, then the
round trips again: latency and broker CPU per record, before and after.

The broker ``flowserve bench`` hands in is not used: this bench starts the three it compares.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.client.http import AsyncHttpClient
from flowserve.client.traffic import prepare_to_drive
from flowserve.kafka.admin import ensure_topics
from flowserve.kafka.brokers import Broker, start_broker
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.topology import load_topology
from flowserve.wire.v2 import build_request
from flowserve_bench.common import console, cpu_seconds
from flowserve_bench.gateway import start_gateway
from flowserve_bench.graphs import EXAMPLES
from flowserve_bench.load import closed_lanes
from flowserve_bench.paired import Slice, balanced_order, summary, throughput_ratio

LEVELS = (1, 8, 32, 128)
TOPOLOGY = EXAMPLES / "digits-fused.yaml"
#: label -> broker kind, and the baseline label. ``kafka`` is started with the server JVM below.
KINDS = {"default": "default", "kafka": "kafka", "tansu": "embedded"}
BASELINE = "kafka"
TARGET_RATIO = 0.8
#: one-record batches written between the two rounds of :func:`_history`, and round trips per round
HISTORY = 10_000
ROUND_TRIPS = 300
ROUND_TRIPS_BUDGET_S = 120.0


@dataclass
class _Side:
    """One broker with its deployment of the topology."""

    broker: Broker
    start_s: float
    start_cpu_s: float
    host: ProcessHost | None = None
    gateway: subprocess.Popen[str] | None = None
    http: AsyncHttpClient | None = None
    slices: dict[int, list[Slice]] = field(default_factory=dict)
    failed: dict[int, int] = field(default_factory=dict)
    cpu: dict[int, float] = field(default_factory=dict)

    def broker_cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.broker.pids)

    def rss_mb(self) -> float:
        total = 0
        for pid in self.broker.pids:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        return round(total / 1024, 1)


def _start(label: str) -> _Side:
    t0 = time.perf_counter()
    broker = start_broker(KINDS[label], server_jvm=label == BASELINE)  # type: ignore[arg-type]
    side = _Side(broker, time.perf_counter() - t0, 0.0)
    side.start_cpu_s = side.broker_cpu()
    console.print(f"{label}: {broker.name} at {broker.bootstrap}, ready in {side.start_s:.1f} s "
                  f"({side.start_cpu_s:.1f} CPU s)")
    return side


async def _ready(http: AsyncHttpClient, infer: str, body: bytes, timeout_s: float = 600.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        with contextlib.suppress(OSError):
            if (await http.request("POST", infer, body, {"Content-Type": "application/json"})).status == 200:
                return
        await asyncio.sleep(0.2)
    raise RuntimeError("the gateway did not answer in time")


async def _round_trips(side: _Side, producer: Any, consumer: Any, topic: str, n: int,
                       budget_s: float = ROUND_TRIPS_BUDGET_S) -> dict[str, float | None]:
    """``n`` round trips, or as many as fit in ``budget_s`` (a broker slowed by its history may not finish)."""
    latencies: list[float] = []
    cpu0 = side.broker_cpu()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(budget_s):
            for _ in range(n):
                t0 = time.perf_counter()
                await producer.send_and_wait(topic, b"x" * 100)
                await consumer.getone()
                latencies.append((time.perf_counter() - t0) * 1000)
    out: dict[str, float | None] = {
        "done": len(latencies), "of": n, "p50_ms": None, "p99_ms": None,  # None, not NaN: JSON has no NaN
        "broker_cpu_us_per_record": round((side.broker_cpu() - cpu0) / max(len(latencies), 1) * 1e6)}
    if latencies:
        p50, p99 = np.percentile(latencies, [50, 99])
        out |= {"p50_ms": round(float(p50), 2), "p99_ms": round(float(p99), 2)}
    return out


async def _history(side: _Side, history: int = HISTORY, n: int = ROUND_TRIPS) -> dict[str, Any]:
    """Round trips on a fresh one-partition topic before and after ``history`` one-record batches."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    settings = side.broker.settings()
    topic = f"fs-bench-history-{uuid.uuid4().hex[:8]}"
    await ensure_topics(settings, [topic], 1)
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, linger_ms=0)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, enable_auto_commit=False,
                                fetch_max_wait_ms=settings.fetch_max_wait_ms)
    await producer.start()
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        before = await _round_trips(side, producer, consumer, topic, n)
        consumer.pause(tp)  # the history is written, not read
        for _ in range(history):
            await producer.send_and_wait(topic, b"y" * 100)  # one batch each: nothing else is in flight
        await consumer.seek_to_end(tp)
        consumer.resume(tp)
        after = await _round_trips(side, producer, consumer, topic, n)
    finally:
        await producer.stop()
        await consumer.stop()
    return {"history_batches": history, "before": before, "after": after}


def _caller(http: AsyncHttpClient, infer: str, bodies: list[bytes]) -> Callable[[int], Awaitable[bool]]:
    async def call(i: int) -> bool:
        try:
            reply = await http.request("POST", infer, bodies[i], {"Content-Type": "application/json"})
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            return False  # a failed request, counted; the gateway may close keep-alive connections it idled
        return reply.status == 200

    return call


async def broker_bench(slice_s: float = 2.0, rounds: int = 4, levels: tuple[int, ...] = LEVELS,
                       path: Path = TOPOLOGY, warm_s: float = 10.0) -> dict[str, Any]:
    """Run the comparison; see the module docstring. Each side first takes ``warm_s`` of load at
    concurrency 32: a JVM compiles its hot code under load, and a slice taken before that would measure
    the compiler."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run the bench from a flowserve checkout")
    topology = load_topology(path)
    prepare_to_drive(topology)
    inputs, _ = topology.sampler()(256)
    bodies = [build_request(x)[0] for x in inputs]
    infer = f"/v2/models/{topology.name}/infer"
    sides: dict[str, _Side] = {}
    try:
        for label in KINDS:
            sides[label] = _start(label)
        for side in sides.values():
            settings = side.broker.settings()
            await create_topology_topics(topology, settings)
            side.host = ProcessHost(path, topology, settings)
            side.host.start_processes()
            side.gateway, url = start_gateway(side.broker.settings(), path)
            side.http = AsyncHttpClient(url)
        for label, side in sides.items():
            assert side.http is not None
            await _ready(side.http, infer, bodies[0])
            await closed_lanes(_caller(side.http, infer, bodies), len(bodies), 32, warm_s)
            console.print(f"{label}: {topology.name} answers through its gateway; warmed for {warm_s:.0f} s")
        for level in levels:
            for label in balanced_order(list(sides), rounds):
                side = sides[label]
                assert side.http is not None
                call = _caller(side.http, infer, bodies)
                if level not in side.slices:  # warm this level once: batch sizes, fetch sessions, JIT
                    await closed_lanes(call, len(bodies), level, min(1.0, slice_s))
                    side.slices[level], side.cpu[level], side.failed[level] = [], 0.0, 0
                before = side.broker_cpu()
                done, failed = await closed_lanes(call, len(bodies), level, slice_s)
                side.cpu[level] += side.broker_cpu() - before
                side.slices[level].append(done)
                side.failed[level] += failed
            line = [f"c={level:<4}"]
            for label, side in sides.items():
                s = summary(side.slices[level])
                line.append(f"{label} {s['throughput_rps']:6.0f} req/s p99 {s['p99_ms']:6.1f} ms")
            console.print("  ".join(line))
        histories = {}
        for label, side in sides.items():
            histories[label] = await _history(side)
            console.print(f"{label}: round trips before/after {HISTORY:,} one-record batches: {histories[label]}")
        out = _report(sides, levels, slice_s, rounds)
        for label, history in histories.items():
            out["brokers"][label]["history"] = history
        return out
    finally:
        for side in sides.values():
            if side.http is not None:
                await side.http.close()
            if side.gateway is not None:
                side.gateway.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    side.gateway.wait(10)
                if side.gateway.poll() is None:
                    side.gateway.kill()
            if side.host is not None:
                side.host.stop()
            side.broker.stop()


def _report(sides: dict[str, _Side], levels: tuple[int, ...], slice_s: float, rounds: int) -> dict[str, Any]:
    base = sides[BASELINE]
    out: dict[str, Any] = {"workload": "broker", "topology": "digits-fused", "slice_seconds": slice_s,
                           "rounds": rounds, "brokers": {}}
    ratios: dict[str, dict[str, list[float]]] = {}
    for label, side in sides.items():
        per_level = {}
        for level in levels:
            s = summary(side.slices[level])
            requests = sum(x.requests for x in side.slices[level])
            per_level[str(level)] = {
                "rps": round(s["throughput_rps"], 1), "p50_ms": round(s["p50_ms"], 2), "p99_ms": round(s["p99_ms"], 2),
                "broker_cpu_us_per_request": round(side.cpu[level] / max(requests, 1) * 1e6),
                "failed": side.failed[level],
            }
        out["brokers"][label] = {"kind": side.broker.name, "start_s": round(side.start_s, 2),
                                 "start_cpu_s": round(side.start_cpu_s, 2), "rss_mb_at_end": side.rss_mb(),
                                 "levels": per_level}
        if label != BASELINE:
            ratios[label] = {str(level): [round(x, 3) for x in throughput_ratio(side.slices[level], base.slices[level])]
                             for level in levels}
    out["throughput_over_kafka"] = ratios
    default = ratios["default"]
    # each level's ratio is (point, low, high): decided on the interval's lower end
    out["targets"] = {"default_ge_0_8x_kafka": all(default[str(level)][1] >= TARGET_RATIO for level in levels)}
    _print(out, levels)
    return out


def _print(out: dict[str, Any], levels: tuple[int, ...]) -> None:
    brokers = out["brokers"]
    console.print("| concurrency | " + " | ".join(f"{label} req/s (p99 ms)" for label in brokers)
                  + " | default/kafka [95%] | tansu/kafka [95%] | broker CPU µs/request " + "/".join(brokers) + " |")
    for level in levels:
        key = str(level)
        cells = [f"{b['levels'][key]['rps']:,.0f} ({b['levels'][key]['p99_ms']:.1f})" for b in brokers.values()]
        ratios = [f"{r[key][0]:.2f} [{r[key][1]:.2f}, {r[key][2]:.2f}]" for r in out["throughput_over_kafka"].values()]
        cpu = "/".join(str(b["levels"][key]["broker_cpu_us_per_request"]) for b in brokers.values())
        console.print(f"| {level} | " + " | ".join(cells + ratios) + f" | {cpu} |")
    for label, b in brokers.items():
        console.print(f"{label}: start {b['start_s']} s ({b['start_cpu_s']} CPU s), RSS at end {b['rss_mb_at_end']} MB")
