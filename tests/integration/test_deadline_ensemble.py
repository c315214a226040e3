"""A deadline-bound ensemble on a real broker: a member that never answers some requests no longer fails
them (each is answered once, ``missing`` naming that member), and a member's record arriving after the
join fired is dropped, counted, and produces no second answer."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from flowserve.client import TopologyClient
from flowserve.client.http import AsyncHttpClient
from flowserve.client.traffic import wait_ready
from flowserve.gateway import Gateway, GatewaySettings
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology

pytestmark = pytest.mark.integration

PORT = "{x: {datatype: FP32, shape: [-1, 10]}}"
ENSEMBLE = f"""
name: NAME
partitions: 2
nodes:
  ma: {{component: flowserve.builtin:Identity, params: {{ports: {PORT}}}, inputs: {{x: input.x}}}}
  mb:
    component: flowserve.builtin:Stall
    params: {{ports: {PORT}, port: x, value: -1}}
    inputs: {{x: input.x}}
  avg:
    component: flowserve_components.ensemble:Average
    params: {{members: [ma, mb]}}
    join: {{type: deadline, fraction: 0.5, window_ms: 3000}}
    inputs: {{ma: ma.x, mb: mb.x}}
outputs: {{probs: avg.probs, missing: avg.missing}}
"""


def request(i: int, *, stall: bool) -> dict[str, np.ndarray]:
    x = np.full((1, 10), 0.1, np.float32)
    x[0, i % 10] = 0.5
    if stall:
        x[0, 9] = -1.0  # mb never answers this one
    return {"x": x}


async def _read_all(kafka: KafkaSettings, topic: str, partitions: int) -> list[Any]:
    """Every record of ``topic`` up to its current end."""
    consumer = AIOKafkaConsumer(group_id=None, fetch_max_wait_ms=5, **kafka.client_kwargs())
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        out: list[Any] = []
        async with asyncio.timeout(60):
            while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    out.extend(records)
        return out
    finally:
        await consumer.stop()


async def _wait_complete(client: TopologyClient) -> None:
    """Until both members answer: while a member's consumer group forms, the join answers without it."""
    async with asyncio.timeout(120):
        while True:
            await wait_ready(client, request(1, stall=False), timeout_s=120)
            reply = await client.call(request(2, stall=False), timeout_ms=30_000)
            if reply.error is None and reply.tensors["missing"].tolist() == [b""]:
                return


async def test_every_request_answered_once_with_the_silent_member_named(kafka, write_topology) -> None:
    topology = load_topology(write_topology(ENSEMBLE))
    stalled = {f"r{i}" for i in range(0, 16, 4)}
    async with InlineHost(topology, kafka) as host, TopologyClient(topology, kafka) as client:
        await _wait_complete(client)
        [avg] = [w for w in host.workers if w.node.id == "avg"]
        partial = avg.counters.join_partial
        replies = await asyncio.gather(*(
            client.call(request(i, stall=f"r{i}" in stalled), request_id=f"r{i}", timeout_ms=30_000)
            for i in range(16)))
        for i, reply in enumerate(replies):
            assert reply.error is None, reply.error
            rid = f"r{i}"
            expected = np.full((1, 10), 0.1, np.float32)
            expected[0, i % 10] = 0.5
            if rid in stalled:
                assert reply.tensors["missing"].tolist() == [b"mb"]
                expected[0, 9] = -1.0  # ma's row alone: what it was sent
            else:
                assert reply.tensors["missing"].tolist() == [b""]
            np.testing.assert_allclose(reply.tensors["probs"], expected)
        assert avg.counters.join_partial - partial == len(stalled)
        # Members answer each partition in order, so the answered requests above come after every warm-up
        # straggler: from here on, only the records below can be late.
        late = avg.counters.join_late

        # Late members: the silent one's record for an answered request, and a duplicate of a real one.
        member_records = {(rec.topic, rec.key): rec for topic in ("ma", "mb")
                          for rec in await _read_all(kafka, topology.nodes[topic].output_topics["x"], 2)}
        ma_topic, mb_topic = topology.nodes["ma"].output_topics["x"], topology.nodes["mb"].output_topics["x"]
        producer = AIOKafkaProducer(**kafka.client_kwargs())
        await producer.start()
        try:
            # r0: the silent member "answers" (ma's record copied onto mb's topic); r1: mb's answer again
            for rec in (member_records[ma_topic, b"r0"], member_records[mb_topic, b"r1"]):
                await producer.send_and_wait(mb_topic, rec.value, key=rec.key, headers=list(rec.headers))
        finally:
            await producer.stop()
        async with asyncio.timeout(60):
            while avg.counters.join_late < late + 2:  # the avg worker has read and dropped both
                await asyncio.sleep(0.05)
        assert avg.counters.join_late == late + 2

    answers = Counter(rec.key for rec in await _read_all(kafka, topology.outputs_topic, 2))
    assert {i: answers[f"r{i}".encode()] for i in range(16)} == dict.fromkeys(range(16), 1)


async def test_the_gateway_caller_sees_which_member_is_missing(kafka, write_topology) -> None:
    topology = load_topology(write_topology(ENSEMBLE))
    gateway = Gateway([topology], kafka, GatewaySettings(port=0))
    async with InlineHost(topology, kafka), TopologyClient(topology, kafka) as client:
        await _wait_complete(client)
        async with gateway, AsyncHttpClient(gateway.url) as http:
            full, partial = await asyncio.gather(*(
                http.infer(topology.name, request(3, stall=stall), parameters={"timeout_ms": 30_000})
                for stall in (False, True)))
    assert (full.status, partial.status) == (200, 200), (full.error, partial.error)
    assert [_text(v) for v in full.outputs()["missing"]] == [""]
    assert [_text(v) for v in partial.outputs()["missing"]] == ["mb"]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
