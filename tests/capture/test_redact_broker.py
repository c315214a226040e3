"""Redaction and retention of captured ports on a real broker: a dropped or hashed port's plaintext is
nowhere in its capture topic's raw records, the hashes are the HMAC of the input under the test's key,
``inspect`` shows the redacted ports as such, and the capture topics carry the configured retention."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from typing import ClassVar

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from flowserve import Batch, Component, Port
from flowserve.capture import capture_hooks
from flowserve.capture.inspect import format_record, inspect_records
from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.kafka.admin import describe_partitions
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import InlineHost, create_topology_topics
from flowserve.topology import load_topology_text
from flowserve.wire.tensors import decode_tensors

KEY = "redact-test-key-7f3a"
ENV = "FS_TEST_CAPTURE_KEY"


class Tag(Component):
    """Passes ``x`` on and files three side ports that capture keeps: a user, an embedding and a note."""

    inputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 4])}
    outputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 4]), "user": Port("BYTES", [-1]),
                                          "emb": Port("FP32", [-1, 4]), "note": Port("BYTES", [-1])}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        x = batch["x"]
        return {"x": x, "user": np.array([user(v) for v in x[:, 0]], dtype=object), "emb": embedding(x),
                "note": np.array([note(v) for v in x[:, 0]], dtype=object)}


def user(v: float) -> bytes:
    return f"alice-{int(v)}@example.com".encode()


def note(v: float) -> bytes:
    return f"diagnosis-{int(v)}-confidential".encode()


def embedding(x: np.ndarray) -> np.ndarray:
    return (x * np.float32(3.25) + np.float32(1000.5)).astype(np.float32)


TOPOLOGY = f"""
name: NAME
partitions: 2
nodes:
  tag: {{component: "{__name__}:Tag", inputs: {{x: input.x}}}}
outputs: {{y: tag.x}}
capture:
  ports: [tag.user, tag.emb, tag.note]
  lineage: false
  tracing: false
  redact: {{tag.user: hash, tag.emb: hash, tag.note: drop}}
  hash_key: {{env: {ENV}}}
  retention_ms: 7200000
  retention_bytes: 52428800
"""


def _hmac(data: bytes) -> bytes:
    return hmac.new(KEY.encode(), data, hashlib.sha256).hexdigest().encode()


async def _raw(kafka: KafkaSettings, topic: str) -> list:  # noqa: ANN401
    """Every record of ``topic`` as the broker holds it, read with a plain consumer (no flowserve decoding)."""
    consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                                **kafka.client_kwargs())
    await consumer.start()
    try:
        # the admin's answer: a fresh consumer's metadata can lag the topic's creation
        count = (await describe_partitions(kafka, [topic])).get(topic, 0)
        assert count, f"{topic} has no partitions"
        parts = [TopicPartition(topic, p) for p in range(count)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        records = []
        while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
            for batch in (await consumer.getmany(*parts, timeout_ms=1000)).values():
                records.extend(batch)
        return records
    finally:
        await consumer.stop()


async def test_redacted_ports_never_reach_the_capture_topics_in_the_clear(kafka, unique_name,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, KEY)
    topology = load_topology_text(TOPOLOGY.replace("NAME", unique_name))
    base = f"fs.{unique_name}.tag"
    assert topology.nodes["tag"].capture_topics == {p: f"{base}.{p}" for p in ("emb", "note", "user")}
    xs = {f"r-{i}": np.array([[100 + i, i, 2 * i, 7]] * (1 + i % 2), np.float32) for i in range(8)}
    async with InlineHost(topology, kafka, hooks=capture_hooks), TopologyClient(topology, kafka) as client:
        await wait_ready(client, {"x": np.zeros((1, 4), np.float32)})
        futures = [client.expect(rid) for rid in xs]
        for rid, x in xs.items():
            await client.queue({"x": x}, request_id=rid)
        await client.flush()
        replies = await asyncio.wait_for(asyncio.gather(*futures), 60)
    assert [r.error for r in replies] == [None] * len(xs)

    raw = {port: [r for r in await _raw(kafka, f"{base}.{port}") if r.key.decode() in xs]
           for port in ("user", "emb", "note")}
    assert {port: sorted(r.key.decode() for r in recs) for port, recs in raw.items()} == \
        {port: sorted(xs) for port in raw}  # one record per request and port: lineage by request id still works
    everything = b"".join(r.value + b"".join(v for _, v in r.headers) for recs in raw.values() for r in recs)
    for x in xs.values():
        for v in x[:, 0]:
            assert user(v) not in everything and note(v) not in everything
        for row in embedding(x):
            assert row.tobytes() not in everything
    assert b"@example.com" not in everything and b"confidential" not in everything

    for rec in raw["user"]:
        x = xs[rec.key.decode()]
        assert (("fs-redact", b"user=hmac-sha256") in rec.headers)
        assert decode_tensors(rec.value)["user"].tolist() == [_hmac(user(v)) for v in x[:, 0]]
    for rec in raw["emb"]:
        x = xs[rec.key.decode()]
        assert decode_tensors(rec.value)["emb"].tolist() == [_hmac(row.astype("<f4").tobytes())
                                                             for row in embedding(x)]
    for rec in raw["note"]:
        assert ("fs-redact", b"note=drop") in rec.headers and decode_tensors(rec.value) == {}

    shown = await inspect_records(kafka, unique_name + ".tag", request_id="r-3")
    text = "\n".join(format_record(r) for r in shown)
    assert "  note: <dropped>" in text
    assert f"  user: <hmac-sha256> [2] [<hmac-sha256:{_hmac(user(103)).decode()[:12]}…>" in text
    assert "  emb: <hmac-sha256> [2] [<hmac-sha256:" in text and "undecodable" not in text


async def test_capture_topics_carry_the_configured_retention(broker, kafka, unique_name,
                                                             request: pytest.FixtureRequest) -> None:
    if request.node.callspec.params.get("broker") == "embedded":
        pytest.skip("the embedded broker has no DescribeConfigs")
    topology = load_topology_text(TOPOLOGY.replace("NAME", unique_name))  # validation needs no key
    await create_topology_topics(topology, kafka)
    topics = [f"fs.{unique_name}.tag.{p}" for p in ("user", "emb", "note")]
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    await admin.start()
    try:
        [response] = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t, {"retention.ms": None, "retention.bytes": None})
             for t in [*topics, f"fs.{unique_name}.inputs"]])
    finally:
        await admin.close()
    found = {name: dict((e[0], e[1]) for e in entries) for _, _, _, name, entries in response.resources}
    for topic in topics:
        assert found[topic] == {"retention.ms": "7200000", "retention.bytes": "52428800"}, topic
    assert found[f"fs.{unique_name}.inputs"]["retention.ms"] != "7200000"  # the request log keeps its own
