"""Exp4 on a real broker: feedback written straight to the feedback topic by a plain Kafka client (the
asynchronous path) reweights an ensemble's members per context; an unreadable record is counted, not fatal."""

from __future__ import annotations

import asyncio
import json
import uuid

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer

from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import InlineHost
from flowserve.selection import selection_hooks
from flowserve.topology.graph import load_topology_text

pytestmark = [pytest.mark.integration]

# member 0 puts 0.9 on class 0, member 1 is unsure, member 2 puts 0.8 on class 1; the truth is class 0
YAML = """
name: NAME
nodes:
  m0: {component: selection_kit:Probs, params: {probs: [0.9, 0.1]}, inputs: {x: input.x}}
  m1: {component: selection_kit:Probs, params: {probs: [0.5, 0.5]}, inputs: {x: input.x}}
  m2: {component: selection_kit:Probs, params: {probs: [0.2, 0.8]}, inputs: {x: input.x}}
  ens:
    component: flowserve_components.selection:Exp4Ensemble
    params: {gamma: 0.1, eta: 0.5, context_header: X-Tenant}
    inputs: {p0: m0.probs, p1: m1.probs, p2: m2.probs}
outputs:
  label: ens.label
  probs: ens.probs
"""


async def test_feedback_from_any_kafka_client_reweights_the_ensemble_per_context(kafka: KafkaSettings) -> None:
    topology = load_topology_text(YAML.replace("NAME", "ens" + uuid.uuid4().hex[:8]))
    host = InlineHost(topology, kafka, hooks=selection_hooks(kafka))
    await host.start()
    worker = next(w for w in host.workers if w.node.id == "ens")
    ensemble = worker.component
    producer = AIOKafkaProducer(**kafka.client_kwargs())
    await producer.start()
    try:
        async with TopologyClient(topology, kafka) as client:
            x = {"x": np.zeros((1, 2), np.float32)}
            await wait_ready(client, x, timeout_s=120)
            ids = [f"t1-{i}" for i in range(10)]
            for rid in ids:
                reply = await client.call(x, request_id=rid, headers={"X-Tenant": "t1"}, timeout_ms=60_000)
                assert reply.error is None, reply.error
            await producer.send_and_wait(topology.feedback_topic, b"not json", key=b"junk")
            for rid in ids:  # what `kcat -P -t <base>.feedback -k <id>` would write
                value = json.dumps({"id": rid, "parameters": {"context": "t1"}, "outputs": [
                    {"name": "label", "datatype": "INT64", "shape": [1], "data": [0]}]}).encode()
                await producer.send_and_wait(topology.feedback_topic, value, key=rid.encode())
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 90
            while ensemble.rewards < len(ids) and loop.time() < deadline:
                await asyncio.sleep(0.1)  # polling period, not synchronisation
            assert ensemble.rewards == len(ids), "the ensemble did not learn from every feedback record"
            # each record: log w += 0.5 * [0.9, 0.5, 0.2], ten times
            w = np.exp(5.0 * np.array([0.9, 0.5, 0.2]) - 4.5)
            np.testing.assert_allclose(ensemble.member_weights("t1"), 0.9 * w / w.sum() + 0.1 / 3, rtol=1e-6)
            np.testing.assert_allclose(ensemble.member_weights("t2"), [1 / 3] * 3)
            counters = {k: v for hook in worker.hooks for k, v in hook.counters().items()}
            assert counters["feedback_unreadable"] == 1 and counters["feedback_learned"] == len(ids)
    finally:
        await producer.stop()
        await host.stop()
