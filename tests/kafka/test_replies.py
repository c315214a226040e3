"""The request-reply engine's bookkeeping, without a broker: matching, dedup, deadlines, failures, decoding.

Reply records are fed to :meth:`ReplyRouter.route` as the read loop would; produce failures come from a
stand-in outbox. The end-to-end paths (gateway, TopologyClient) are in tests/gateway and tests/integration.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from flowserve.errors import BrokerError, DeadlineExceeded, ErrorKind, Failure, FlowserveError, WireError
from flowserve.kafka.replies import ReplyRouter
from flowserve.kafka.settings import KafkaSettings
from flowserve.wire.envelope import H_ERROR, H_ERROR_KIND, H_ID, H_NODE, error_headers
from flowserve.wire.tensors import encode_tensors
from flowserve.wire.v2 import make_response

Y = np.array([[1.0, 2.0]], np.float32)


def record(rid: str | None, value: bytes | None = None, headers: dict[str, bytes] | None = None,
           timestamp: int = 123) -> Any:
    return SimpleNamespace(key=rid.encode() if rid is not None else None,
                           value=encode_tensors({"y": Y}) if value is None else value,
                           headers=list((headers or {}).items()), timestamp=timestamp)


@pytest_asyncio.fixture(loop_scope="function")
async def router() -> AsyncIterator[ReplyRouter]:
    r = ReplyRouter(KafkaSettings(), [("replies", 0)], max_message_bytes=4096, remember=3)
    try:
        yield r
    finally:
        await r.stop()


async def test_a_reply_resolves_its_waiter_once_and_duplicates_are_counted(router: ReplyRouter) -> None:
    future = router.expect("r1", timeout_s=60)
    assert router.has("r1") and router.in_flight() == 1
    router.route([record("r1"), record("r1")])
    reply = await future
    assert (reply.request_id, reply.error, reply.error_kind, reply.failure, reply.timestamp_ms) == \
        ("r1", None, None, None, 123)
    np.testing.assert_array_equal(reply.tensors["y"], Y)
    router.route([record("r1")])
    c = router.counters
    assert (c.replies, c.duplicates, c.unknown, c.late, c.errors) == (1, 2, 0, 0, 0)
    assert router.in_flight() == 0


async def test_a_deadline_fails_the_waiter_and_its_reply_counts_as_late(router: ReplyRouter) -> None:
    future = router.expect("slow", timeout_s=0.001)
    with pytest.raises(DeadlineExceeded, match="request 'slow' got no reply within its deadline"):
        await future
    router.route([record("slow")])
    assert (router.counters.timeouts, router.counters.late, router.counters.replies) == (1, 1, 0)
    router.discard("r2")  # not waited for: nothing happens
    future = router.expect("r2")
    router.discard("r2")
    router.route([record("r2")])
    assert router.counters.late == 2 and not future.done()


async def test_replies_nobody_waits_for_are_dropped_unless_the_owner_keeps_them() -> None:
    plain = ReplyRouter(KafkaSettings(), [("replies", 0)], max_message_bytes=4096)
    keeping = ReplyRouter(KafkaSettings(), [("replies", 0)], max_message_bytes=4096, unclaimed=2)
    try:
        plain.route([record("a"), record("b")])
        assert (plain.counters.unknown, plain.counters.unclaimed) == (2, 0)
        with pytest.raises(FlowserveError, match="keeps no unclaimed replies"):
            await plain.unclaimed()
        keeping.route([record("a"), record("b"), record("c"), record("a")])
        c = keeping.counters
        assert (c.unclaimed, c.dropped, c.duplicates, c.unknown) == (3, 1, 1, 0)
        assert [(await keeping.unclaimed()).request_id for _ in range(2)] == ["a", "b"]
    finally:
        await plain.stop()
        await keeping.stop()


async def test_the_finished_set_is_bounded(router: ReplyRouter) -> None:
    for rid in ("r1", "r2", "r3", "r4"):  # remember=3: r1 is forgotten
        router.expect(rid)
    router.route([record(rid) for rid in ("r1", "r2", "r3", "r4")])
    router.route([record("r1"), record("r4")])
    assert (router.counters.unknown, router.counters.duplicates) == (1, 1)
    assert len(router._finished) == 3


async def test_error_results_carry_kind_reason_and_node(router: ReplyRouter) -> None:
    future = router.expect("bad")
    headers = error_headers(Failure(ErrorKind.JOIN_TIMEOUT, "window closed"), "join")
    router.route([record("bad", b"", headers)])
    reply = await future
    assert (reply.error, reply.error_kind, reply.node, reply.tensors) == \
        ("window closed", ErrorKind.JOIN_TIMEOUT, "join", {})
    assert reply.failure == Failure(ErrorKind.JOIN_TIMEOUT, "window closed")
    assert router.counters.errors == 1
    legacy = router.expect("old")  # an error result written without a kind
    router.route([record("old", b"", {H_ERROR: b"boom"})])
    assert ((await legacy).error_kind, (await legacy).error) == (ErrorKind.UNKNOWN, "boom")
    assert H_ERROR_KIND in headers and H_NODE in headers


async def test_values_decode_as_frames_or_v2_json_and_undecodable_ones_fail_their_request(
        router: ReplyRouter) -> None:
    as_json, broken, keyless = router.expect("j"), router.expect("x"), router.expect("k")
    body = json.dumps(make_response("m", "j", {"y": Y})).encode()
    router.route([record("j", body), record("x", b"FST1\x01"), record(None, headers={H_ID: b"k"})])
    np.testing.assert_array_equal((await as_json).tensors["y"], Y)
    assert (await as_json).tensors["y"].dtype == np.float32
    reply = await broken
    assert reply.error_kind == ErrorKind.UNKNOWN and reply.error.startswith("the reply could not be decoded: ")
    assert (await keyless).request_id == "k"
    assert (router.counters.undecodable, router.counters.errors, router.counters.replies) == (1, 0, 3)


async def test_an_id_is_awaited_once(router: ReplyRouter) -> None:
    router.expect("r1")
    with pytest.raises(WireError, match="request id 'r1' is already awaited"):
        router.expect("r1")
    with pytest.raises(WireError, match="already awaited"):
        router.submit("requests", 0, "r1", b"v", [], 1.0)
    assert router._outbox.count == 0  # nothing queued for the refused request


class FailingOutbox:
    """Stands in for the outbox: the produce fails when handed over, or when the broker answers."""

    def __init__(self, at: str) -> None:
        self.at = at
        self.count = 0

    def add(self, *args: object) -> None:
        self.count += 1

    async def send(self) -> tuple[int, list[asyncio.Future[None]]]:
        sent, self.count = self.count, 0
        if self.at == "send":
            raise ConnectionError("no leader")
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        failed.set_exception(ConnectionError("not acknowledged"))
        return sent, [failed]


@pytest.mark.parametrize("at", ["send", "ack"])
async def test_a_failed_produce_fails_its_waiters_with_broker_error(router: ReplyRouter, at: str) -> None:
    router._outbox = FailingOutbox(at)  # type: ignore[assignment]
    waiting = router.expect("r1", timeout_s=60)
    router.queue("requests", 0, "r1", b"v", [])
    router.queue("requests", 0, "r2", b"v", [])  # queued without a waiter (TopologyClient.queue)
    batch = router.batch
    with pytest.raises(BrokerError, match="Kafka did not accept 2 request"):
        await router.flush()
    with pytest.raises(BrokerError, match="Kafka did not accept the request"):
        await waiting
    assert router.batch == batch + 1 and router.counters.produce_failures == 2 and router.in_flight() == 0
    router.route([record("r1")])  # it may have been written after all: late, not unknown
    assert router.counters.late == 1


async def test_stop_fails_the_callers_still_waiting() -> None:
    router = ReplyRouter(KafkaSettings(), [("replies", 0)], max_message_bytes=4096, label="gateway g1")
    future = router.expect("r1", timeout_s=60)
    await router.stop()
    with pytest.raises(BrokerError, match="gateway g1 is shutting down; request 'r1' got no reply"):
        await future
    assert router.in_flight() == 0
