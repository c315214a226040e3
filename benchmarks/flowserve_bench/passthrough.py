"""Passthrough throughput: raw client loops vs a flowserve identity node, same broker, same records.

Raw aiokafka: (a) consume with ``getmany``, ``send`` each record, commit; (b) the same producing through the
batch API (``create_batch``/``send_batch``). Raw librdkafka (confluent-kafka, on a thread of its own):
(d) ``poll`` one record at a time, ``produce`` it with a delivery report, and every 4096 records (or when
nothing came) wait for the reports and commit; (e) ``consume`` up to 4096 at once, ``produce`` each, wait for
the reports, commit. Every loop commits only what the broker acknowledged, as the worker does. Then a
flowserve identity node on each client: (c) the configured one (``WorkerSettings.client``,
``FLOWSERVE_WORKER_CLIENT``) and (c2) the other.
Each reads the same pre-filled topic with its own consumer group, so all see the same backlog.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import confluent_kafka as ck
import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from flowserve.kafka.admin import ensure_topics
from flowserve.kafka.clients import MAX_IN_FLIGHT
from flowserve.kafka.outbox import Outbox
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.runtime.worker import StageWorker
from flowserve.topology.graph import Topology
from flowserve.wire.envelope import make_headers
from flowserve.wire.tensors import encode_tensors
from flowserve_bench import graphs
from flowserve_bench.common import console, cpu_seconds, run_id

PARTITIONS = 4
VALUE_BYTES = 100
#: records per fetch (and per wait for delivery reports) in every raw loop
FETCH = 4096
#: the target: flowserve's identity node on its default client over the raw librdkafka batch loop (e)
TARGET_OVER_E = 0.7


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


class _Window:
    """Wall and CPU seconds (this process, all threads: librdkafka's and the worker's alike) from a loop's
    first record to its end, so start-up (imports, group joins) counts for no contender."""

    def __init__(self) -> None:
        self.t0: float | None = None
        self.cpu0 = 0.0

    def begin(self) -> None:
        if self.t0 is None:
            self.t0, self.cpu0 = time.perf_counter(), cpu_seconds()

    def end(self) -> tuple[float, float]:
        assert self.t0 is not None
        return time.perf_counter() - self.t0, cpu_seconds() - self.cpu0


async def _raw_loop(kafka: KafkaSettings, src: str, dst: str, records: int, *, batch_api: bool) -> tuple[float, float]:
    consumer = _consumer(kafka, f"bench-raw-{batch_api}-{run_id()}")
    producer = AIOKafkaProducer(linger_ms=0, max_batch_size=1_048_576, acks="all", **kafka.client_kwargs())
    await producer.start()
    await consumer.start()
    consumer.subscribe([src])
    done = 0
    window = _Window()
    try:
        while done < records:
            fetched = await consumer.getmany(timeout_ms=100, max_records=FETCH)
            if not fetched:
                continue
            window.begin()
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
        return window.end()
    finally:
        await consumer.stop()
        await producer.stop()


def _rd_loop(kafka: KafkaSettings, src: str, dst: str, records: int, *, batch: bool) -> tuple[float, float]:
    """A raw librdkafka loop (d: ``poll`` per record; e: ``consume`` in batches); seconds from its first record
    to the commit of its last."""
    common = kafka.librdkafka_config()
    consumer = ck.Consumer({**common, "group.id": f"bench-rd-{batch}-{run_id()}", "enable.auto.commit": False,
                            "auto.offset.reset": "earliest", "fetch.wait.max.ms": kafka.fetch_max_wait_ms,
                            "max.partition.fetch.bytes": 4 * 1_048_576})
    producer = ck.Producer({**common, "linger.ms": 0, "acks": "all", "max.in.flight": MAX_IN_FLIGHT})
    failed: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    consumer.subscribe([src])
    done = 0
    window = _Window()
    messages: list[Any]  # librdkafka's Message types every field optional, which holds only for error events
    try:
        while done < records:
            if batch:
                messages = consumer.consume(FETCH, 0.1)
            else:
                messages = []
                while len(messages) < FETCH and (m := consumer.poll(0 if messages else 0.1)) is not None:
                    messages.append(m)
            messages = [m for m in messages if m.error() is None]
            if not messages:
                continue
            window.begin()
            offsets: dict[tuple[str, int], int] = {}
            for m in messages:
                producer.produce(dst, m.value(), m.key(), m.partition(), on_delivery=report, headers=m.headers())
                offsets[(m.topic(), m.partition())] = m.offset() + 1
            if producer.flush(30) or failed:
                raise RuntimeError(f"raw librdkafka loop: {len(producer)} not delivered, failures {failed[:3]}")
            consumer.commit(offsets=[ck.TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
            done += len(messages)
        return window.end()
    finally:
        consumer.close()


async def _flowserve(kafka: KafkaSettings, records: int, topology: Topology, node: str,
                     client: str) -> tuple[float, float]:
    worker = StageWorker(topology, node, kafka, WorkerSettings(client=client))
    await worker.start()
    task = asyncio.create_task(worker.run())
    window = _Window()
    try:
        while worker.counters.records_in < records or worker.counters.commits == 0:
            await asyncio.sleep(0.002)
            if worker.counters.records_in:
                window.begin()
        # records_in counts what was fetched; wait for the batch in flight to be acknowledged and committed.
        target = worker.counters.commits + 1
        while worker.counters.commits < target and worker.counters.records_out < records:
            await asyncio.sleep(0.001)
        return window.end()
    finally:
        worker.stop()
        await task


async def passthrough(kafka: KafkaSettings, records: int = 200_000) -> dict[str, Any]:
    name = f"bench{run_id()}"
    topology = graphs.load("passthrough.yaml", name, {"partitions": PARTITIONS})
    src = topology.inputs_topic
    await ensure_topics(kafka, [*topology.topics(), *(f"{src}.raw-{x}" for x in "abde")], PARTITIONS)
    console.print(f"filling {src} with {records} records of {VALUE_BYTES} bytes…")
    await _fill(kafka, src, records)
    default = WorkerSettings.from_env().client  # FLOWSERVE_WORKER_CLIENT picks which is (c)
    other = "aiokafka" if default == "librdkafka" else "librdkafka"
    contenders: list[tuple[str, str, Any]] = [
        ("a_raw_send", "(a) raw aiokafka, send per record",
         lambda: _raw_loop(kafka, src, f"{src}.raw-a", records, batch_api=False)),
        ("b_raw_batch", "(b) raw aiokafka, batch API",
         lambda: _raw_loop(kafka, src, f"{src}.raw-b", records, batch_api=True)),
        ("d_rd_poll", "(d) raw librdkafka, poll per record",
         lambda: asyncio.to_thread(_rd_loop, kafka, src, f"{src}.raw-d", records, batch=False)),
        ("e_rd_batch", "(e) raw librdkafka, consume in batches",
         lambda: asyncio.to_thread(_rd_loop, kafka, src, f"{src}.raw-e", records, batch=True)),
        ("c_flowserve", f"(c) flowserve identity node on {default} (the default)",
         lambda: _flowserve(kafka, records, topology, "identity", default)),
        ("c2_flowserve_other", f"(c2) flowserve identity node on {other}",
         lambda: _flowserve(kafka, records, topology, "identity2", other)),
    ]
    rates: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for key, what, run in contenders:
        console.print(f"{what}…")
        seconds, cpu[key] = await run()
        rates[key] = records / seconds
    summary = {"workload": "passthrough", "records": records, "value_bytes": VALUE_BYTES,
               "partitions": PARTITIONS, "client": default, "other_client": other, **account(rates, cpu, records)}
    for key in rates:
        console.print(f"  {key:<19} {rates[key]:>10,.0f} msg/s  {summary['cpu_us_per_record'][key]:6.1f} µs CPU/record")
    console.print(f"  c/b = {summary['c_over_b']:.2f}   c/e = {summary['c_over_e']:.2f}   "
                  f"c2/c = {summary['c2_over_c']:.2f}")
    return summary


def account(rates: dict[str, float], cpu_s: dict[str, float], records: int) -> dict[str, Any]:
    """Rates (records/s per contender) and CPU seconds (this process, per contender) as the result's figures
    and its target: the identity node on the default client at least ``TARGET_OVER_E`` of the raw
    librdkafka batch loop's rate. One run per contender, so the target is decided on the point figure."""
    over_e = rates["c_flowserve"] / rates["e_rd_batch"]
    return {
        **{k: round(v) for k, v in rates.items()},
        "cpu_us_per_record": {k: round(v / records * 1e6, 1) for k, v in cpu_s.items()},
        "c_over_a": round(rates["c_flowserve"] / rates["a_raw_send"], 3),
        "c_over_b": round(rates["c_flowserve"] / rates["b_raw_batch"], 3),
        "c_over_e": round(over_e, 3),
        "c2_over_c": round(rates["c2_flowserve_other"] / rates["c_flowserve"], 3),
        "targets": {f"identity_over_librdkafka_batch_ge_{TARGET_OVER_E}": over_e >= TARGET_OVER_E},
    }
