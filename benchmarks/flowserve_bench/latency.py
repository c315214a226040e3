"""Per-hop latency: a 3-node identity topology vs a hand-written 3-hop aiokafka chain, open loop.

Both run in this process on the same broker at the same request rate. A request crosses four topics
(inputs → a → b → c → outputs), so per-hop latency is end-to-end latency divided by four.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.kafka.admin import ensure_topics
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import InlineHost
from flowserve_bench import graphs
from flowserve_bench.common import console, run_id

HOPS = 4
PARTITIONS = 4


def _stats(latencies_ms: list[float]) -> dict[str, float]:
    arr = np.asarray(latencies_ms)
    return {"e2e_p50_ms": float(np.percentile(arr, 50)), "e2e_p99_ms": float(np.percentile(arr, 99)),
            "hop_p50_ms": float(np.percentile(arr, 50)) / HOPS, "hop_p99_ms": float(np.percentile(arr, 99)) / HOPS,
            "n": len(latencies_ms)}


async def open_loop(send: Callable[[int], Awaitable[None]], rate: float, seconds: float) -> list[float]:
    """Start a request (``send(i)``, the i-th) every 1/rate seconds regardless of replies, for ``seconds``;
    returns latencies in ms."""
    latencies: list[float] = []
    tasks = []
    period = 1.0 / rate
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < seconds:
        target = start + i * period
        await asyncio.sleep(max(0.0, target - time.perf_counter()))

        async def one(k: int) -> None:
            t0 = time.perf_counter()
            await send(k)
            latencies.append((time.perf_counter() - t0) * 1000)

        tasks.append(asyncio.create_task(one(i)))
        i += 1
    await asyncio.gather(*tasks)
    return latencies


async def _flowserve(kafka: KafkaSettings, rate: float, seconds: float) -> dict[str, float]:
    name = f"lat{run_id()}"
    topology = graphs.load("latency.yaml", name, {"partitions": PARTITIONS})
    x = np.zeros((1, 66), np.uint8)
    async with InlineHost(topology, kafka), TopologyClient(topology, kafka) as client:
        await wait_ready(client, {"x": x})

        async def send(_: int) -> None:
            reply = await client.call({"x": x}, timeout_ms=30_000)
            assert reply.error is None, reply.error

        return _stats(await open_loop(send, rate, seconds))


async def _raw_chain(kafka: KafkaSettings, rate: float, seconds: float) -> dict[str, float]:
    """The baseline: three consume→send→commit loops, each a plain aiokafka consumer and producer."""
    base = f"raw{run_id()}"
    topics = [f"{base}.{i}" for i in range(HOPS + 1)]
    await ensure_topics(kafka, topics, PARTITIONS)
    producer = AIOKafkaProducer(linger_ms=0, acks="all", **kafka.client_kwargs())
    await producer.start()
    stages = []

    async def stage(src: str, dst: str) -> None:
        consumer = AIOKafkaConsumer(src, group_id=f"{src}.g", enable_auto_commit=False,
                                    auto_offset_reset="earliest", fetch_max_wait_ms=kafka.fetch_max_wait_ms,
                                    session_timeout_ms=10_000, heartbeat_interval_ms=1000, **kafka.client_kwargs())
        await consumer.start()
        try:
            while True:
                fetched = await consumer.getmany(timeout_ms=100)
                futures = [await producer.send(dst, r.value, key=r.key, partition=tp.partition)
                           for tp, recs in fetched.items() for r in recs]
                await asyncio.gather(*futures)
                if fetched:
                    await consumer.commit({TopicPartition(tp.topic, tp.partition): recs[-1].offset + 1
                                           for tp, recs in fetched.items()})
        finally:
            await consumer.stop()

    for i in range(HOPS - 1):
        stages.append(asyncio.create_task(stage(topics[i], topics[i + 1])))
    waiters: dict[bytes, asyncio.Future[None]] = {}
    reader = AIOKafkaConsumer(group_id=None, fetch_max_wait_ms=kafka.fetch_max_wait_ms, **kafka.client_kwargs())
    await reader.start()
    tps = [TopicPartition(topics[HOPS - 1], p) for p in range(PARTITIONS)]
    reader.assign(tps)
    await reader.seek_to_end(*tps)

    async def read() -> None:
        while True:
            for recs in (await reader.getmany(timeout_ms=100)).values():
                for r in recs:
                    fut = waiters.pop(r.key, None)
                    if fut is not None and not fut.done():
                        fut.set_result(None)

    reading = asyncio.create_task(read())
    value = bytes(100)

    async def send(k: int) -> None:
        key = f"{base}-{k}".encode()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters[key] = fut
        await producer.send(topics[0], value, key=key, partition=k % PARTITIONS)
        await asyncio.wait_for(fut, 60)

    try:
        # Warm up until the chain answers (its consumer groups form first).
        deadline = time.perf_counter() + 120
        while time.perf_counter() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(send(-1), 10)
                break
        return _stats(await open_loop(send, rate, seconds))
    finally:
        for t in [*stages, reading]:
            t.cancel()
        await asyncio.gather(*stages, reading, return_exceptions=True)
        await reader.stop()
        await producer.stop()


async def latency(kafka: KafkaSettings, rate: float = 50.0, seconds: float = 20.0) -> dict[str, Any]:
    console.print(f"baseline: raw aiokafka 3-stage chain at {rate:.0f} req/s for {seconds:.0f} s…")
    raw = await _raw_chain(kafka, rate, seconds)
    console.print(f"flowserve: 3-node identity topology at {rate:.0f} req/s for {seconds:.0f} s…")
    fs = await _flowserve(kafka, rate, seconds)
    for label, s in (("raw aiokafka", raw), ("flowserve", fs)):
        console.print(f"  {label:<13} per hop p50 {s['hop_p50_ms']:.2f} ms  p99 {s['hop_p99_ms']:.2f} ms   "
                      f"(end to end p50 {s['e2e_p50_ms']:.1f} ms, p99 {s['e2e_p99_ms']:.1f} ms, n={s['n']})")
    ratio_p50 = fs["hop_p50_ms"] / raw["hop_p50_ms"]
    ratio_p99 = fs["hop_p99_ms"] / raw["hop_p99_ms"]
    console.print(f"  flowserve/raw: p50 {ratio_p50:.2f}x  p99 {ratio_p99:.2f}x")
    return {"workload": "latency", "rate": rate, "seconds": seconds,
            **{f"flowserve_{k}": round(v, 3) for k, v in fs.items()},
            **{f"raw_{k}": round(v, 3) for k, v in raw.items()},
            "hop_p50_ratio": round(ratio_p50, 3), "hop_p99_ratio": round(ratio_p99, 3)}
