"""The tuner past the plan's partitions (Apache Kafka): a stage that needs more consumers than there are
partitions grows every topic of the topology, its new consumers take the new partitions, the client
spreads its requests over them, and every request is answered exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from flowserve.capture.inspect import inspect_records
from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.gateway.bridge import KafkaBridge
from flowserve.kafka.admin import describe_partitions
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.topology import load_topology
from flowserve.tuning.plan import Plan, StageConfig, apply_plan, save_plan
from flowserve.tuning.tuner import Action, LocalScaler, tune
from flowserve.wire.envelope import H_REPLY_TO, make_headers
from flowserve.wire.tensors import encode_tensors

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# one emulated stage: batches of 4 take 68 ms on the "cpu" table, ~59 requests/s per consumer
TOPOLOGY = """
name: NAME
partitions: 1
deadline_ms: 120000
nodes:
  m:
    component: flowserve.builtin:Accelerator
    params: {model: resnet50, hardware: cpu, jitter: 0}
    inputs: {x: input.x}
outputs: {x: m.x}
"""


async def _records_per_partition(kafka: object, topic: str, partitions: int) -> list[int]:
    consumer = AIOKafkaConsumer(group_id=None, **kafka.client_kwargs())  # type: ignore[attr-defined]
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = await consumer.end_offsets(tps)
        return [ends[tp] for tp in tps]
    finally:
        await consumer.stop()


async def test_a_stage_scales_past_the_partitions_by_growing_every_topic(
        broker: object, kafka, write_topology, tmp_path: Path) -> None:
    if not broker.supports_create_partitions:  # type: ignore[attr-defined]
        pytest.skip("this broker does not take CreatePartitions; the tuner stays within the plan's partitions")
    path = write_topology(TOPOLOGY)
    base = load_topology(path)
    plan = Plan(base.name, slo_ms=400, partitions=1, hop_ms=5, stages={"m": StageConfig("cpu", 4, 1)})
    plan_path = save_plan(plan, tmp_path / "plan.json")
    topology = apply_plan(base, plan)
    host = ProcessHost(path, topology, kafka, log_dir=tmp_path / "logs", extra_args=["--plan", str(plan_path)])
    await create_topology_topics(topology, kafka)
    host.start_processes()
    actions: list[Action] = []
    scaled_up = asyncio.Event()

    def on_action(action: Action) -> None:
        actions.append(action)
        if action.after > action.before:
            scaled_up.set()

    stop = asyncio.Event()
    futures: dict[str, asyncio.Future] = {}
    sent: dict[str, np.ndarray] = {}
    try:
        async with TopologyClient(topology, kafka) as client:
            await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=120)
            # no scale-down in this test: the hold outlasts it
            tuner = asyncio.create_task(tune(topology, plan, kafka, LocalScaler(host), stop=stop, hold_s=600,
                                             horizon_s=4, interval_s=0.5, max_partitions=4, on_action=on_action))

            async def send(rate: float, until: Callable[[], bool], limit: int) -> None:
                for _ in range(limit):
                    if until():
                        return
                    rid = f"r{len(sent)}"
                    x = np.full((1, 4), len(sent), np.float32)
                    futures[rid] = client.expect(rid)
                    sent[rid] = x
                    await client.send({"x": x}, request_id=rid)
                    await asyncio.sleep(1.0 / rate)  # pacing the traffic, not waiting for a result

            await send(150, scaled_up.is_set, 3000)
            assert scaled_up.is_set(), "no scale-up after 3000 requests at 150/s"
            # the client notices the growth from its producer's metadata (at most 10 s old), then sends on
            await send(150, lambda: client.partitions > 1, 3000)
            await send(150, lambda: False, 300)
            grown = await describe_partitions(kafka, topology.topics())
            peak = max(a.after for a in actions)
            assert peak >= 2 and set(grown.values()) == {min(4, max(2, peak))}, (actions, grown)
            assert client.partitions == grown[topology.inputs_topic]
            assert host.alive()["m"] == peak
            stop.set()
            await tuner
            done, pending = await asyncio.wait(futures.values(), timeout=120)
            assert not pending, f"{len(pending)} of {len(futures)} requests never came back"
            for rid, future in futures.items():
                reply = future.result()
                assert reply.error is None, f"{rid}: {reply.error}"
                np.testing.assert_array_equal(reply.tensors["x"], sent[rid])
            assert client.duplicates == 0
            # a gateway started before the growth follows it too: its reply topic grows, and its requests
            # (one partition per batch, round robin) reach every partition and come back
            bridge = KafkaBridge([topology], kafka, "g" + topology.name)
            await bridge.start()
            try:
                for _ in range(100):
                    if bridge.partitions[topology.name] == grown[topology.inputs_topic]:
                        break
                    await asyncio.sleep(0.2)  # polling for the bridge's metadata refresh, bounded
                assert bridge.partitions[topology.name] == grown[topology.inputs_topic]
                gateway_futures = {}
                for i in range(40):
                    rid = f"g{i}"
                    x = np.full((1, 4), i, np.float32)
                    headers = make_headers(rid, topology=topology.name,
                                           extra={H_REPLY_TO: bridge.reply_topic(topology)})
                    gateway_futures[rid] = (x, bridge.submit(topology, rid, encode_tensors({"x": x}), headers, 120))
                    await asyncio.sleep(0.01)  # one batch per tick: spread over the partitions
                for rid, (x, future) in gateway_futures.items():
                    reply = await future
                    assert reply.error is None, f"{rid}: {reply.error}"
                    np.testing.assert_array_equal(reply.tensors["x"], x)
                replies = await _records_per_partition(kafka, bridge.reply_topic(topology),
                                                       grown[topology.inputs_topic])
                assert all(n > 0 for n in replies), replies
            finally:
                await bridge.stop()
        # the growth is on the actions topic beside the scaling (flowserve ui shows both)
        published = await inspect_records(kafka, f"{topology.name}.actions", last=100, timeout_s=10)
        growths = [r.body["action"]["partitions"] for r in published if "partitions" in r.body["action"]]
        assert growths == [[1, grown[topology.inputs_topic]]], [r.body for r in published]
        # requests went to the new partitions, and their answers came out of the outputs topic's new ones
        per_partition = await _records_per_partition(kafka, topology.outputs_topic, grown[topology.outputs_topic])
        assert all(n > 0 for n in per_partition), per_partition
    finally:
        stop.set()
        host.stop()
