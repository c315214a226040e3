"""Bad input never kills a worker and never loses other messages: it is dead-lettered with the reason,
the caller gets an error result, and delivered + dead-lettered = sent."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.errors import ErrorKind
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology
from flowserve.wire.envelope import H_ERROR, H_ERROR_KIND, H_NODE
from flowserve.wire.tensors import encode_tensors

pytestmark = pytest.mark.integration

TOPOLOGY = """
name: NAME
partitions: 2
max_message_bytes: 4096
deadline_ms: 60000
nodes:
  check: {component: fs_testkit:Checked, inputs: {x: input.x}}
  add: {component: fs_testkit:AddOne, inputs: {x: check.x}}
outputs: {y: add.x}
"""

GOOD = np.ones((1, 4), np.float32)
BAD = {
    "malformed": (b"\x00garbage that is no frame", "not a flowserve tensor frame", ErrorKind.INVALID_INPUT),
    "truncated": (encode_tensors({"x": GOOD})[:-3], "runs past the frame", ErrorKind.INVALID_INPUT),
    "datatype": (encode_tensors({"x": np.ones((1, 4), np.int32)}), "takes FP32, got int32", ErrorKind.INVALID_INPUT),
    "shape": (encode_tensors({"x": np.ones((1, 5), np.float32)}), "takes shape [-1, 4], got [1, 5]",
              ErrorKind.INVALID_INPUT),
    "rank": (encode_tensors({"x": np.ones((4,), np.float32)}), "takes shape [-1, 4], got [4]",
             ErrorKind.INVALID_INPUT),
    "name": (encode_tensors({"pixels": GOOD}), "no tensor 'x'", ErrorKind.INVALID_INPUT),
    "nan": (encode_tensors({"x": np.array([[1, np.nan, 3, 4]], np.float32)}), "does not accept NaN",
            ErrorKind.INVALID_INPUT),
    "oversize": (encode_tensors({"x": np.ones((300, 4), np.float32)}), "exceeds max_message_bytes 4096",
                 ErrorKind.OVERSIZE),
    "json": (b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2]}]}',
             "needs 4 values", ErrorKind.INVALID_INPUT),
}


async def _dead_letters(kafka, topic: str, expect: int) -> dict[str, tuple[str, str, ErrorKind]]:
    consumer = AIOKafkaConsumer(topic, group_id=None, auto_offset_reset="earliest", fetch_max_wait_ms=5,
                                **kafka.client_kwargs())
    await consumer.start()
    out: dict[str, tuple[str, str, ErrorKind]] = {}
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while len(out) < expect and asyncio.get_running_loop().time() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for rec in records:
                    h = dict(rec.headers)
                    kind = ErrorKind(h[H_ERROR_KIND].decode())
                    out[rec.key.decode()] = (h[H_ERROR].decode(), h[H_NODE].decode(), kind)
    finally:
        await consumer.stop()
    return out


async def test_bad_records_are_dead_lettered_and_the_rest_flow(kafka, write_topology) -> None:
    topology = load_topology(write_topology(TOPOLOGY))
    async with InlineHost(topology, kafka) as host, TopologyClient(topology, kafka) as client:
        await wait_ready(client, {"x": GOOD}, timeout_s=120)
        futures = {}
        sent = 0
        # Interleave good and bad records in the same batches.
        for round_ in range(3):
            for kind, (value, _, _) in BAD.items():
                for rid, raw in ((f"good-{round_}-{kind}", None), (f"bad-{round_}-{kind}", value)):
                    futures[rid] = client.expect(rid)
                    await client.queue({"x": GOOD * sent}, request_id=rid, raw_value=raw)
                    sent += 1
        await client.flush()
        await asyncio.wait_for(asyncio.gather(*futures.values()), 60)

        delivered = {rid for rid, f in futures.items() if f.result().error is None}
        failed = {rid: f.result().error for rid, f in futures.items() if f.result().error is not None}
        assert delivered == {rid for rid in futures if rid.startswith("good-")}
        for rid, fut in futures.items():
            if rid.startswith("good-"):
                np.testing.assert_array_equal(fut.result().tensors["y"], GOOD * list(futures).index(rid) + 1)

        letters = await _dead_letters(kafka, topology.deadletter_topic, len(failed))
        assert set(letters) == set(failed)
        assert len(delivered) + len(letters) == sent
        for rid, (reason, node, error_kind) in letters.items():
            kind = rid.split("-", 2)[2]
            assert BAD[kind][1] in reason, (rid, reason)
            assert error_kind == BAD[kind][2], (rid, error_kind)
            assert node == "check"
            assert BAD[kind][1] in failed[rid]  # the caller's error result says the same

        check = next(w for w in host.workers if w.node.id == "check")
        assert check.counters.dead_lettered == len(letters)
        assert check.counters.dead_letter_reasons == {"invalid_input": len(letters) - 3, "oversize": 3}
        assert all(not t.done() for t in host._tasks)  # every worker still running

        # And it keeps going after all that.
        reply = await client.call({"x": GOOD}, timeout_ms=30_000)
        assert reply.error is None


BROKEN = """
name: NAME
nodes:
  short: {component: fs_testkit:ShortMask, params: {value: 7}, inputs: {x: input.x}}
outputs: {y: short.x}
"""


async def test_a_result_that_breaks_the_declaration_fails_its_request_only(kafka, write_topology) -> None:
    topology = load_topology(write_topology(BROKEN))
    async with InlineHost(topology, kafka) as host, TopologyClient(topology, kafka) as client:
        await wait_ready(client, {"x": GOOD}, timeout_s=120)
        futures = {}
        for i in range(10):  # one batch, most likely: it fails as a whole, then each request runs alone
            rid = f"r{i}"
            futures[rid] = client.expect(rid)
            await client.queue({"x": np.full((1, 4), i, np.float32)}, request_id=rid)
        await client.flush()
        replies = {rid: r for rid, r in zip(futures, await asyncio.wait_for(asyncio.gather(*futures.values()), 60),
                                            strict=True)}
        assert {rid for rid, r in replies.items() if r.error is not None} == {"r7"}
        assert replies["r7"].error_kind == ErrorKind.COMPONENT_FAILURE
        assert "mask of 'x' has shape [0], expected [1]" in str(replies["r7"].error)
        letters = await _dead_letters(kafka, topology.deadletter_topic, 1)
        assert set(letters) == {"r7"} and letters["r7"][1:] == ("short", ErrorKind.COMPONENT_FAILURE)
        assert all(not t.done() for t in host._tasks)  # the worker survived it
