"""Passthrough throughput: raw aiokafka loops vs a flowserve identity node, same broker, same records.

(a) consume with ``getmany``, ``send`` each record, commit; (b) the same producing through the batch API
(``create_batch``/``send_batch``); (c) a flowserve identity node. Each reads the same pre-filled topic
with its own consumer group, so all three see the same backlog.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from flowserve.bench.common import console, run_id
from flowserve.kafka.admin import ensure_topics
from flowserve.kafka.outbox import Outbox
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.runtime.worker import StageWorker
from flowserve.topology.graph import load_topology_text
from flowserve.wire.envelope import make_headers
from flowserve.wire.tensors import encode_tensors

PARTITIONS = 4
VALUE_BYTES = 100


def _value() -> bytes:
    # A frame of one UINT8 tensor sized so the whole record value is exactly VALUE_BYTES.
    probe = len(encode_tensors({"x": np.zeros((1, 0), np.uint8)}))
    value = encode_tensors({"x": np.arange(VALUE_BYTES - probe, dtype=np.uint8).reshape(1, -1)})
    assert len(value) == VALUE_BYTES
    return value


async def _fill(kafka: KafkaSettings, topic: str, records: int) -> None:
    producer = AIOKafkaProducer(linger_ms=5, max_batch_size=1_048_576, acks=1, **kafka.client_kwargs())
    await producer.start()
    try:
        outbox = Outbox(producer)
        value = _value()
        for i in range(records):
            rid = f"r{i}"
            outbox.add(topic, i % PARTITIONS, rid.encode(), value,
                             make_headers(rid, topology="bench", deadline_ms=None))
            if outbox.count >= 20_000:
                await outbox.flush()
        await outbox.flush()
    finally:
        await producer.stop()


def _consumer(kafka: KafkaSettings, group: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(group_id=group, enable_auto_commit=False, auto_offset_reset="earliest",
                            fetch_max_wait_ms=kafka.fetch_max_wait_ms, max_partition_fetch_bytes=4 * 1_048_576,
                            session_timeout_ms=10_000, heartbeat_interval_ms=1000, **kafka.client_kwargs())


async def _raw_loop(kafka: KafkaSettings, src: str, dst: str, records: int, *, batch_api: bool) -> float:
    consumer = _consumer(kafka, f"bench-raw-{batch_api}-{run_id()}")
    producer = AIOKafkaProducer(linger_ms=0, max_batch_size=1_048_576, acks="all", **kafka.client_kwargs())
    await producer.start()
    await consumer.start()
    consumer.subscribe([src])
    done = 0
    t0: float | None = None
    try:
        while done < records:
            fetched = await consumer.getmany(timeout_ms=100, max_records=4096)
            if not fetched:
                continue
            if t0 is None:
                t0 = time.perf_counter()
            futures: list[Any] = []
            offsets = {}
            for tp, recs in fetched.items():
                if batch_api:
                    batch = producer.create_batch()
                    for r in recs:
                        if batch.append(key=r.key, value=r.value, timestamp=None, headers=list(r.headers)) is None:
                            futures.append(await producer.send_batch(batch, dst, partition=tp.partition))
                            batch = producer.create_batch()
                            batch.append(key=r.key, value=r.value, timestamp=None, headers=list(r.headers))
                    futures.append(await producer.send_batch(batch, dst, partition=tp.partition))
                else:
                    for r in recs:
                        futures.append(await producer.send(dst, r.value, key=r.key, partition=tp.partition,
                                                           headers=list(r.headers)))
                offsets[TopicPartition(tp.topic, tp.partition)] = recs[-1].offset + 1
                done += len(recs)
            await asyncio.gather(*futures)
            await consumer.commit(offsets)
        assert t0 is not None
        return time.perf_counter() - t0
    finally:
        await consumer.stop()
        await producer.stop()


async def _flowserve(kafka: KafkaSettings, records: int, yaml_text: str) -> float:
    topology = load_topology_text(yaml_text.replace("GROUP", run_id()), source="bench")
    worker = StageWorker(topology, "identity", kafka, WorkerSettings())
    # Same input topic as the raw loops: point the node's group at the pre-filled topic.
    await worker.start()
    task = asyncio.create_task(worker.run())
    t0: float | None = None
    try:
        while worker.counters.records_in < records or worker.counters.commits == 0:
            await asyncio.sleep(0.002)
            if t0 is None and worker.counters.records_in:
                t0 = time.perf_counter()
        # records_in counts what was fetched; wait for the batch in flight to be acknowledged and committed.
        target = worker.counters.commits + 1
        while worker.counters.commits < target and worker.counters.records_out < records:
            await asyncio.sleep(0.001)
        assert t0 is not None
        return time.perf_counter() - t0
    finally:
        worker.stop()
        await task


async def passthrough(kafka: KafkaSettings, records: int = 200_000) -> dict[str, Any]:
    name = f"bench{run_id()}"
    yaml_text = f"""
name: {name}
partitions: {PARTITIONS}
nodes:
  identity: {{component: flowserve.bench.common:Identity, inputs: {{x: input.x}}}}
outputs: {{x: identity.x}}
"""
    topology = load_topology_text(yaml_text, source="bench")
    src = topology.inputs_topic
    await ensure_topics(kafka, [*topology.topics(), f"{src}.raw-a", f"{src}.raw-b"], PARTITIONS)
    console.print(f"filling {src} with {records} records of {VALUE_BYTES} bytes…")
    await _fill(kafka, src, records)
    results: dict[str, float] = {}
    console.print("(a) raw aiokafka, send per record…")
    results["a_raw_send"] = records / await _raw_loop(kafka, src, f"{src}.raw-a", records, batch_api=False)
    console.print("(b) raw aiokafka, batch API…")
    results["b_raw_batch"] = records / await _raw_loop(kafka, src, f"{src}.raw-b", records, batch_api=True)
    console.print("(c) flowserve identity node…")
    results["c_flowserve"] = records / await _flowserve(kafka, records, yaml_text)
    summary = {
        "workload": "passthrough",
        "records": records,
        "value_bytes": VALUE_BYTES,
        "partitions": PARTITIONS,
        **{k: round(v) for k, v in results.items()},
        "c_over_a": round(results["c_flowserve"] / results["a_raw_send"], 3),
        "c_over_b": round(results["c_flowserve"] / results["b_raw_batch"], 3),
    }
    for key in ("a_raw_send", "b_raw_batch", "c_flowserve"):
        console.print(f"  {key:<12} {results[key]:>10,.0f} msg/s")
    console.print(f"  c/a = {summary['c_over_a']:.2f}   c/b = {summary['c_over_b']:.2f}")
    return summary
