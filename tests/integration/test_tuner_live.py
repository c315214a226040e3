"""The tuner on a real broker: a stage gains a consumer when the rate steps up and loses it after the hold,
and (Apache Kafka) scales past the partitions by growing every topic, with every request answered once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from fs_testkit import ONE_EMULATED_STAGE

from flowserve.capture.inspect import inspect_records
from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.gateway.bridge import KafkaBridge
from flowserve.kafka.admin import describe_partitions
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.topology import Topology, load_topology
from flowserve.tuning.partitions import PartitionGrowth
from flowserve.tuning.plan import Plan, apply_plan, save_plan
from flowserve.tuning.scalers import LocalScaler
from flowserve.tuning.stages import StageConfig
from flowserve.tuning.tuner import Action, tune
from flowserve.wire.envelope import H_REPLY_TO, make_headers
from flowserve.wire.tensors import encode_tensors

pytestmark = pytest.mark.slow



def _pacer(client: TopologyClient, futures: dict[str, asyncio.Future], sent: dict[str, np.ndarray]
           ) -> Callable[[float, Callable[[], bool], int], Awaitable[None]]:
    """``send(rate, until, limit)``: requests open-loop at ``rate`` until ``until()`` (or ``limit`` of them:
    the test then fails), each one's future in ``futures`` and its input in ``sent``."""

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

    return send


async def _answered_once(client: TopologyClient, futures: dict[str, asyncio.Future],
                         sent: dict[str, np.ndarray]) -> None:
    """Every request ``_pacer`` sent came back, without an error, with its own input, and only once."""
    _, pending = await asyncio.wait(futures.values(), timeout=120)
    assert not pending, f"{len(pending)} of {len(futures)} requests never came back"
    for rid, future in futures.items():
        reply = future.result()
        assert reply.error is None, f"{rid}: {reply.error}"
        np.testing.assert_array_equal(reply.tensors["x"], sent[rid])
    assert client.duplicates == 0


async def _deployed(kafka: object, write_topology: Callable[[str], Path], tmp_path: Path, *, partitions: int
                    ) -> tuple[Topology, Plan, ProcessHost]:
    """The one-stage topology on ``partitions``, planned at one consumer with batches of 4, its worker started."""
    path = write_topology(ONE_EMULATED_STAGE.replace("PARTITIONS", str(partitions)))
    base = load_topology(path)
    plan = Plan(base.name, slo_ms=400, partitions=partitions, hop_ms=5, stages={"m": StageConfig("cpu", 4, 1)})
    plan_path = save_plan(plan, tmp_path / "plan.json")
    topology = apply_plan(base, plan)
    host = ProcessHost(path, topology, kafka, log_dir=tmp_path / "logs",  # type: ignore[arg-type]
                       extra_args=["--plan", str(plan_path)])
    await create_topology_topics(topology, kafka)  # type: ignore[arg-type]
    host.start_processes()
    return topology, plan, host


async def test_tuner_adds_a_consumer_on_a_step_and_removes_it_after_the_hold(
        kafka, write_topology, tmp_path: Path) -> None:
    topology, plan, host = await _deployed(kafka, write_topology, tmp_path, partitions=4)
    actions: list[Action] = []
    scaled_up, back_to_one = asyncio.Event(), asyncio.Event()

    def on_action(action: Action) -> None:
        actions.append(action)
        if action.after > action.before:
            scaled_up.set()
        if action.after == 1:
            back_to_one.set()

    stop = asyncio.Event()
    futures: dict[str, asyncio.Future] = {}
    sent: dict[str, np.ndarray] = {}
    try:
        async with TopologyClient(topology, kafka) as client:
            await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=120)
            tuner = asyncio.create_task(tune(topology, plan, kafka, LocalScaler(host), stop=stop, hold_s=3,
                                             hysteresis=0.25, horizon_s=4, interval_s=0.5, on_action=on_action))
            send = _pacer(client, futures, sent)
            await send(15, lambda: False, 30)  # steady and low: no action
            assert actions == []
            await send(150, scaled_up.is_set, 3000)  # the step: the tuner must add consumers
            assert scaled_up.is_set(), "no scale-up after 3000 requests at 150/s"
            await send(150, lambda: False, 150)  # the high rate goes on, now with more consumers
            peak = max(a.after for a in actions)
            assert peak >= 2 and all(a.after > a.before for a in actions), actions
            await send(15, back_to_one.is_set, 1000)  # back down: after the horizon and the hold, it removes them
            assert back_to_one.is_set(), f"not back to one consumer after 1000 requests at 15/s: {actions}"
            downs = actions[[a.after < a.before for a in actions].index(True):]
            assert all(a.after < a.before for a in downs) and downs[0].before == peak
            assert "below for" in downs[0].reason
            assert host.alive() == {"m": 1}
            stop.set()
            await tuner
            await _answered_once(client, futures, sent)
        # every action is on the topology's actions topic too (flowserve ui shows them)
        published = await inspect_records(kafka, f"{topology.name}.actions", last=100, timeout_s=10)
        assert [(r.body["node"], r.body["action"]["consumers"]) for r in published] == \
            [(a.stage, [a.before, a.after]) for a in actions]
        assert {r.body["source"] for r in published} == {"tuner"}
    finally:
        stop.set()
        host.stop()


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
    topology, plan, host = await _deployed(kafka, write_topology, tmp_path, partitions=1)
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

            send = _pacer(client, futures, sent)
            await send(150, scaled_up.is_set, 3000)
            assert scaled_up.is_set(), "no scale-up after 3000 requests at 150/s"
            # the client notices the growth from its producer's metadata (at most 10 s old), then sends on
            await send(150, lambda: client.partitions > 1, 3000)
            await send(150, lambda: False, 300)
            # a later growth (2 -> 4 when a third consumer is wanted) reaches the client the same way
            inputs = (await describe_partitions(kafka, [topology.inputs_topic]))[topology.inputs_topic]
            await send(150, lambda: client.partitions == inputs, 3000)
            grown = await describe_partitions(kafka, topology.topics())
            peak = max(a.after for a in actions)
            # the count the tuner's growth rule gives for these actions (each growth at least doubles)
            replayed = PartitionGrowth(topology, kafka, partitions=1, limit=4)  # type: ignore[arg-type]
            growths_replayed: list[list[int]] = []
            for action in actions:
                if action.after > replayed.partitions:
                    before, replayed.partitions = replayed.partitions, replayed.target(action.after)
                    growths_replayed.append([before, replayed.partitions])
            assert peak >= 2 and set(grown.values()) == {replayed.partitions}, (actions, grown)
            assert client.partitions == grown[topology.inputs_topic]
            assert host.alive()["m"] == peak
            stop.set()
            await tuner
            await _answered_once(client, futures, sent)
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
        # one growth, or two (1 -> 2 -> 4) where the consumers were added one action at a time
        assert growths == growths_replayed, [r.body for r in published]
        # requests went to the new partitions, and their answers came out of the outputs topic's new ones
        per_partition = await _records_per_partition(kafka, topology.outputs_topic, grown[topology.outputs_topic])
        assert all(n > 0 for n in per_partition), per_partition
    finally:
        stop.set()
        host.stop()
