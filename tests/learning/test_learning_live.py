"""Continual learning on a real broker: learn from feedback and captured inputs, shadow, promote, rollback."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer

pytest.importorskip("torch")

from flowserve.capture import capture_hooks  # noqa: E402
from flowserve.capture.lineage import expand  # noqa: E402
from flowserve.capture.reader import Reader  # noqa: E402
from flowserve.client import TopologyClient  # noqa: E402
from flowserve.client.traffic import wait_ready  # noqa: E402
from flowserve.kafka.admin import ensure_topics  # noqa: E402
from flowserve.learning import (  # noqa: E402
    BASE,
    Registry,
    compare,
    retrain,
    send_version,
    shadow_topics,
    shadow_worker,
    training_set,
    version_hooks,
)
from flowserve.runtime.hooks import chain  # noqa: E402
from flowserve.runtime.host import InlineHost  # noqa: E402
from flowserve.topology import load_topology, names  # noqa: E402
from flowserve.topology.graph import Topology  # noqa: E402
from flowserve.wire.envelope import H_MODEL_VERSION, make_headers, now_ms  # noqa: E402
from flowserve.wire.feedback import encode_feedback  # noqa: E402
from flowserve.wire.tensors import encode_tensors  # noqa: E402
from flowserve_components.digits import sample  # noqa: E402

# broker-backed: tests/conftest.py marks these integration, the one marked slow below slow

TOPOLOGY = """
name: NAME
partitions: 2
deadline_ms: 120000
nodes:
  pre: {component: flowserve_components.digits:Normalize, inputs: {pixels: input.pixels}}
  model:
    component: flowserve_components.torch_stage:TorchClassifier
    params: {model: digits-mlp, threads: 1}
    inputs: {x: pre.x}
  post: {component: flowserve_components.postprocess:ArgMax, inputs: {logits: model.logits}}
outputs: {label: post.label, probs: post.probs}
capture: {sample: 1.0, lineage: true, tracing: false}
"""


async def _send(client: TopologyClient, n: int, seed: int, prefix: str) -> tuple[dict[str, Any], dict[str, int]]:
    """``n`` drifted digits; returns their replies and true labels by request id."""
    requests, labels = sample(n, seed=seed, split="train", shift="brightness", amount=6.0)
    ids = [f"{prefix}{i}" for i in range(n)]
    futures = [client.expect(rid, 60) for rid in ids]
    for rid, req in zip(ids, requests, strict=True):
        await client.queue(req, request_id=rid)
    await client.flush()
    replies = await asyncio.gather(*futures)
    return dict(zip(ids, replies, strict=True)), dict(zip(ids, labels, strict=True))


async def _feedback(topology: Topology, kafka: Any, labels: dict[str, int]) -> None:
    producer = AIOKafkaProducer(**kafka.client_kwargs())
    await producer.start()
    try:
        topic = names.feedback_topic(topology.base)
        await ensure_topics(kafka, [topic], topology.spec.partitions)
        for rid, label in labels.items():
            key, value, headers = encode_feedback(rid, {"label": np.array([label], np.int64)})
            await producer.send(topic, value, key=key, headers=headers)
        await producer.flush()
    finally:
        await producer.stop()


def _hooks(kafka: Any) -> Any:
    return chain(capture_hooks, version_hooks(kafka))


async def test_learn_from_feedback_and_captured_inputs_registers_a_version(kafka, write_topology, cache: Path) -> None:
    topology = load_topology(write_topology(TOPOLOGY))
    async with InlineHost(topology, kafka, hooks=_hooks(kafka)), TopologyClient(topology, kafka) as client:
        await wait_ready(client, sample(1)[0][0])
        replies, labels = await _send(client, 120, seed=1, prefix="a")
        assert all(r.error is None for r in replies.values())
        await _feedback(topology, kafka, {**labels, "not-a-request": 3})
        async with Reader(kafka) as reader:
            data = await training_set(topology, "model", reader)
    assert data.size == 120 and data.missing == 1 and data.inputs["x"].shape == (120, 64)
    assert sorted(data.request_ids) == sorted(labels)
    manifest = retrain(topology, "model", data)
    reg = Registry(topology.name, "model")
    assert [m.version for m in reg.versions()] == ["v1"] and manifest.parent == BASE
    assert manifest.training_size == 120 and manifest.metrics["fit_accuracy_after"] > manifest.metrics[
        "fit_accuracy_before"]
    assert reg.live() == BASE  # registered, not promoted


async def _register_from(topology: Topology, kafka: Any, client: TopologyClient) -> None:
    """Register v1 trained on 80 drifted requests answered by the live model."""
    _, labels = await _send(client, 80, seed=2, prefix="t")
    await _feedback(topology, kafka, labels)
    async with Reader(kafka) as reader:
        data = await training_set(topology, "model", reader)
    await asyncio.to_thread(retrain, topology, "model", data)


async def _past_deadline_input(topology: Topology, kafka: Any) -> None:
    """A model input whose deadline passed before anyone read it (as a replayed, retained input has)."""
    producer = AIOKafkaProducer(**kafka.client_kwargs())
    await producer.start()
    try:
        headers = make_headers("late", topology=topology.name, deadline_ms=now_ms() - 60_000)
        await producer.send_and_wait(names.edge_topic(topology.base, "pre", "x"),
                                     encode_tensors({"x": np.zeros((1, 64), np.float32)}), key=b"late",
                                     headers=headers, partition=0)
    finally:
        await producer.stop()


async def test_shadow_outputs_never_reach_callers(kafka, write_topology, cache: Path) -> None:
    topology = load_topology(write_topology(TOPOLOGY))
    async with InlineHost(topology, kafka, hooks=_hooks(kafka)), TopologyClient(topology, kafka) as client:
        await wait_ready(client, sample(1)[0][0])
        await _register_from(topology, kafka, client)
        await _past_deadline_input(topology, kafka)
        await ensure_topics(kafka, shadow_topics(topology, "model"), topology.spec.partitions)
        shadow = shadow_worker(topology, "model", "v1", kafka)
        await shadow.start()
        task = asyncio.create_task(shadow.run())
        try:
            replies, labels = await _send(client, 60, seed=3, prefix="s")
            await _feedback(topology, kafka, labels)
            async with Reader(kafka) as reader:
                shadowed = {r.key for r in await reader.read(shadow_topics(topology, "model"))}
                for _ in range(1000):  # the shadow works off its copy at its own pace
                    if {*labels, "late"} <= shadowed:
                        break
                    shadowed |= {r.key for r in await reader.read(shadow_topics(topology, "model")) if r.tensors}
                late = [r for r in await reader.read([topology.outputs_topic]) if r.key == "late"]
                outputs = [r.key for r in await reader.read([topology.outputs_topic])]
                rows = await compare(topology, "model", reader)
        finally:
            shadow.stop()
            await task
    # every caller got one answer, from the live version; the shadow's went to its own topic only
    assert {r.headers[H_MODEL_VERSION] for r in replies.values()} == {b"model=base"}
    assert sorted(k for k in outputs if k in labels) == sorted(labels) and client.duplicates == 0
    # the live path fails an input past its deadline; the shadow, answering nobody, computes it
    assert [r.headers.get("fs-error-kind") for r in late] == ["deadline"] and "late" in shadowed
    by_role = {(r.role, r.version): r for r in rows}
    assert set(by_role) == {("live", BASE), ("shadow", "v1")}
    # a shadow's group starts from the retained inputs: it also replays the 80 requests v1 learnt from
    assert by_role["shadow", "v1"].requests == 140 and by_role["live", BASE].requests == 140
    assert by_role["shadow", "v1"].accuracy is not None and by_role["live", BASE].accuracy is not None


async def _until_version(client: TopologyClient, version: bytes, prefix: str, answered: dict[str, Any]) -> None:
    """Keep traffic flowing (rounds of 20) until a reply comes from ``version``; bounded, not timed."""
    for round_ in range(200):
        replies, _ = await _send(client, 20, seed=round_, prefix=f"{prefix}{round_}-")
        answered.update(replies)
        if any(r.headers.get(H_MODEL_VERSION) == version for r in replies.values()):
            return
    raise AssertionError(f"no reply from {version!r} after 200 rounds")


@pytest.mark.slow
async def test_promote_and_rollback_under_traffic_lose_no_request(kafka, write_topology, cache: Path) -> None:
    topology = load_topology(write_topology(TOPOLOGY))
    registry = Registry(topology.name, "model")
    answered: dict[str, Any] = {}
    async with InlineHost(topology, kafka, hooks=_hooks(kafka)), TopologyClient(topology, kafka) as client:
        await wait_ready(client, sample(1)[0][0])
        await _register_from(topology, kafka, client)
        # traffic keeps flowing while the version switches: a background sender plus the rounds below
        stop = asyncio.Event()

        async def background() -> None:
            i = 0
            while not stop.is_set():
                replies, _ = await _send(client, 10, seed=1000 + i, prefix=f"bg{i}-")
                answered.update(replies)
                i += 1

        sender = asyncio.create_task(background())
        registry.promote("v1")
        await send_version(topology, kafka, "model", "v1")
        await _until_version(client, b"model=v1", "p", answered)
        before, after = registry.rollback()
        assert (before, after) == ("v1", BASE)
        await send_version(topology, kafka, "model", BASE)
        await _until_version(client, b"model=base", "r", answered)
        stop.set()
        await sender
    async with Reader(kafka) as reader:  # the workers stopped: the lineage they held back is written
        outputs = [r.key for r in await reader.read([topology.outputs_topic])]
        lineage = [e for r in await reader.read([topology.lineage_topic]) if isinstance(r.body, dict)
                   for e in expand(r.body) if e["node"] == "model"]
    # every request answered exactly once, without error
    assert all(r.error is None for r in answered.values())
    counts: dict[str, int] = {}
    for key in outputs:
        counts[key] = counts.get(key, 0) + 1
    assert {rid: counts.get(rid) for rid in answered} == dict.fromkeys(answered, 1)
    # by the version the reply names, which is the version lineage recorded for it
    said = {rid: r.headers[H_MODEL_VERSION].decode().partition("=")[2] for rid, r in answered.items()}
    recorded = {e["request_id"]: e["model_version"] or BASE for e in lineage if e["request_id"] in answered}
    assert recorded == said
    assert {"v1", BASE} <= set(said.values())
    v1_hash = {e["weights_hash"] for e in lineage if e["model_version"] == "v1"}
    assert v1_hash == {registry.manifest("v1").weights_sha256}


async def test_a_drift_alarm_runs_learn(kafka, write_topology, cache: Path) -> None:
    from flowserve.cli.learning import follow_drift

    topology = load_topology(write_topology(TOPOLOGY))
    drift_topic = names.side_topic(topology.base, "drift")
    positioned, stop = asyncio.Event(), asyncio.Event()
    learned: list[Any] = []
    async with InlineHost(topology, kafka, hooks=_hooks(kafka)), TopologyClient(topology, kafka) as client:
        await wait_ready(client, sample(1)[0][0])
        _, labels = await _send(client, 40, seed=4, prefix="d")
        await _feedback(topology, kafka, labels)
        follower = asyncio.create_task(follow_drift(
            topology, "model", kafka, last=None, cooldown_s=300.0, stop=stop,
            ready=lambda topic: positioned.set(), learned=lambda m: (learned.append(m), stop.set())))
        await asyncio.wait_for(positioned.wait(), 60)
        producer = AIOKafkaProducer(**kafka.client_kwargs())
        await producer.start()
        try:
            await producer.send_and_wait(drift_topic, b'{"detector":"input_drift","is_drift":false}', key=b"a")
            await producer.send_and_wait(drift_topic, b'{"detector":"input_drift","is_drift":true}', key=b"a")
        finally:
            await producer.stop()
        await asyncio.wait_for(follower, 120)
    assert [m.version for m in learned] == ["v1"] and learned[0].training_size == 40
