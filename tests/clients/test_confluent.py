"""confluent-kafka (librdkafka) produces requests and reads their answers, JSON and binary frames, and
writes a feedback record (flowserve.wire.feedback's format) that reads back as written."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import numpy as np
import pytest
from fs_clients import Served, answer_of, v2_request

from flowserve.wire.feedback import decode_feedback, encode_feedback
from flowserve.wire.tensors import decode_tensors, encode_tensors

ck = pytest.importorskip("confluent_kafka")

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def _produce(served: Served, topic: str, key: bytes | None, value: bytes,
             headers: list[tuple[str, bytes]] | None = None) -> None:
    producer = ck.Producer({"bootstrap.servers": served.kafka.bootstrap})
    errors: list[Any] = []
    producer.produce(topic, value, key, headers=headers or [], on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(60) == 0, "not delivered within 60 s"
    assert errors == [None], errors


def _consume(served: Served, topic: str, key: str, timeout_s: float = 90.0) -> Any:
    """The first record keyed ``key`` in ``topic``, read from the beginning by a fresh consumer group."""
    consumer = ck.Consumer({"bootstrap.servers": served.kafka.bootstrap, "group.id": f"ck-{uuid.uuid4().hex[:8]}",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    try:
        for _ in range(int(timeout_s / 0.5)):
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            if msg.key() == key.encode():
                return msg
    finally:
        consumer.close()
    raise AssertionError(f"no record keyed {key} in {topic}")


async def test_confluent_json_request_and_answer(served: Served) -> None:
    rid = f"ck-json-{uuid.uuid4().hex[:8]}"
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    await asyncio.to_thread(_produce, served, served.topology.inputs_topic, rid.encode(), v2_request(rid, x))
    msg = await asyncio.to_thread(_consume, served, served.topology.outputs_topic, rid)
    np.testing.assert_array_equal(answer_of(msg.value()), x + 1)


async def test_confluent_binary_frame_and_headers(served: Served) -> None:
    rid = f"ck-bin-{uuid.uuid4().hex[:8]}"
    x = np.full((2, 4), 2.5, np.float32)
    await asyncio.to_thread(_produce, served, served.topology.inputs_topic, rid.encode(),
                            encode_tensors({"x": x}), [("x-client", b"confluent")])
    msg = await asyncio.to_thread(_consume, served, served.topology.outputs_topic, rid)
    np.testing.assert_array_equal(decode_tensors(msg.value())["y"], x + 1)
    assert ("x-client", b"confluent") in (msg.headers() or []), "a request's own headers travel to its answer"


async def test_confluent_writes_feedback_that_reads_back(served: Served) -> None:
    rid = f"ck-fb-{uuid.uuid4().hex[:8]}"
    truth = {"y": np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)}
    key, value, headers = encode_feedback(rid, truth, context="tenant-7")
    await asyncio.to_thread(_produce, served, served.feedback_topic, key, value, headers)
    msg = await asyncio.to_thread(_consume, served, served.feedback_topic, rid)
    feedback = decode_feedback(msg.key(), msg.value(), msg.timestamp()[1])
    assert (feedback.request_id, feedback.context) == (rid, "tenant-7")
    np.testing.assert_array_equal(feedback.outputs["y"], truth["y"])
