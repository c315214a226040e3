"""Deadlines, admission, error results from the pipeline, auth, and several gateways at once."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import echo_yaml, running, unique, wait_ready
from fs_topics import read_to_end

from flowserve.client.http import AsyncHttpClient
from flowserve.gateway import Gateway, GatewaySettings
from flowserve.runtime.host import InlineHost

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

X = {"x": np.ones((1, 4), np.float32)}

IDENTITY = """
name: NAME
partitions: 2
deadline_ms: 30000
nodes:
  a: {component: flowserve.builtin:Identity, params: {ports: {x: {datatype: FP32, shape: [-1, 4]}}},
      inputs: {x: input.x}}
outputs: {x: a.x}
"""

FAILING = """
name: NAME
partitions: 2
deadline_ms: 30000
nodes:
  check: {component: flowserve.builtin:Fail, params: {ports: {x: {datatype: FP32, shape: [-1, 4], allow_nan: false}},
          value: -1.0}, inputs: {x: input.x}}
  crash: {component: flowserve.builtin:Fail, params: {ports: {x: {datatype: FP32, shape: [-1, 4]}}, value: -2.0,
          mode: raise}, inputs: {x: check.x}}
outputs: {x: crash.x}
"""


async def test_deadline_is_504_at_the_deadline_and_not_ready_without_workers(broker) -> None:
    kafka = broker.settings()
    topology = unique(IDENTITY)
    async with running(topology, kafka, workers=False, fail_fast=False) as (gateway, client):
        ready = await client.get("/v2/health/ready")
        assert ready.status == 503 and "stage(s) a have no live worker" in ready.error
        model_ready = await client.get(f"/v2/models/{topology.name}/ready")
        assert model_ready.status == 503
        # No worker will ever answer: the 504 must come from the gateway's own deadline timer. The outer
        # timeout only turns a hang into a failure; it asserts nothing about how fast the answer was.
        async with asyncio.timeout(20):
            by_param, by_header = await asyncio.gather(
                client.infer(topology.name, X, parameters={"timeout_ms": 300}),
                client.infer(topology.name, X, headers={"X-Timeout-Ms": "300"}),
            )
        for reply in (by_param, by_header):
            assert (reply.status, reply.json()["kind"]) == (504, "deadline")
            assert "got no reply within its deadline of 300 ms" in reply.error
        assert gateway.bridge.counters.timeouts == 2 and gateway.bridge.in_flight() == 0


async def test_no_worker_is_503_at_once_and_recovers_when_one_joins(broker) -> None:
    """While a stage has no worker the gateway refuses at once (503, kind unavailable), not at the deadline;
    once a worker joins, requests flow again with nothing restarted."""
    kafka = broker.settings()
    topology = unique(IDENTITY)
    async with running(topology, kafka, workers=False, ready_cache_s=0.2) as (gateway, client):
        async with asyncio.timeout(60):
            while True:  # until the gateway's first readiness probe has seen the empty stage
                reply = await client.infer(topology.name, X, parameters={"timeout_ms": 500})
                if reply.status == 503:
                    break
                assert reply.status == 504
        assert reply.json()["kind"] == "unavailable" and reply.headers["retry-after"] == "1"
        assert "stage(s) a have no live worker" in reply.error
        timeouts = gateway.bridge.counters.timeouts
        assert (await client.infer(topology.name, X)).status == 503  # deadline 30 s: a 503 is not a timeout
        assert gateway.bridge.counters.timeouts == timeouts
        async with InlineHost(topology, kafka), asyncio.timeout(90):
            while (reply := await client.infer(topology.name, X, parameters={"timeout_ms": 5000})).status != 200:
                assert reply.status in (503, 504), reply.error
                await asyncio.sleep(0.1)  # polling for recovery, bounded by the timeout above
            np.testing.assert_array_equal(reply.outputs()["x"], X["x"])


async def test_full_gateway_answers_429_with_retry_after(broker) -> None:
    kafka = broker.settings()
    topology = unique(IDENTITY)
    async with running(topology, kafka, workers=False, max_inflight=1, retry_after_s=3,
                       fail_fast=False) as (gateway, client):
        first = asyncio.create_task(client.infer(topology.name, X, parameters={"timeout_ms": 3000}))
        while gateway.bridge.in_flight() < 1:  # wait until the first request holds the only slot
            await asyncio.sleep(0.01)
        async with AsyncHttpClient(gateway.url) as other:
            second = await other.infer(topology.name, X)
        assert second.status == 429 and second.headers["retry-after"] == "3"
        assert "requests in flight" in second.error
        assert (await first).status == 504


async def test_error_results_map_to_400_and_500(broker) -> None:
    kafka = broker.settings()
    topology = unique(FAILING)
    async with running(topology, kafka) as (gateway, client):
        await wait_ready(client)
        name = topology.name
        ok, refused, crashed, nan = await asyncio.gather(
            client.infer(name, X),
            client.infer(name, {"x": np.array([[1, -1, 2, 3]], np.float32)}),
            client.infer(name, {"x": np.array([[1, -2, 2, 3]], np.float32)}),
            client.infer(name, {"x": np.array([[1, np.nan, 2, 3]], np.float32)}),
        )
        assert ok.status == 200
        np.testing.assert_array_equal(ok.outputs()["x"], X["x"])
        # (fs-node names the node that wrote the error result, which is the last one it passed through)
        # The status follows the failure's kind, carried from the worker's process in a header; the text is
        # for people.
        assert (refused.status, refused.json()["kind"]) == (400, "invalid_input")
        assert "Fail: row 0 holds -1.0 on 'x'" in refused.error
        assert (crashed.status, crashed.json()["kind"]) == (500, "component_failure")
        assert "at node 'crash'" in crashed.error and "process failed" in crashed.error
        assert (nan.status, nan.json()["kind"]) == (400, "invalid_input")  # checked by the gateway itself
        assert "does not accept NaN" in nan.error
        assert gateway.bridge.counters.errors == 2


async def test_auth(broker) -> None:
    kafka = broker.settings()
    topology = unique(IDENTITY)
    async with running(topology, kafka, token="s3cret", tokens=("other", "s3cret")) as (gateway, client):
        assert "s3cret" not in repr(gateway.settings)
        await wait_ready(client)
        ok = await client.infer(topology.name, X)
        assert ok.status == 200
        async with AsyncHttpClient(gateway.url) as anonymous, AsyncHttpClient(gateway.url, token="wrong") as wrong:
            for c in (anonymous, wrong):
                denied = await c.infer(topology.name, X)
                assert denied.status == 401 and "bearer token" in denied.error
                assert denied.headers["www-authenticate"].startswith("Bearer")
                assert (await c.get(f"/v2/models/{topology.name}")).status == 401
                assert (await c.get("/v2")).status == 401
                # health stays open so that probes need no secret
                assert (await c.get("/v2/health/live")).status == 200
                assert (await c.get("/v2/health/ready")).status == 200


async def test_two_gateways_never_see_each_others_replies(broker) -> None:
    kafka = broker.settings()
    topology = unique(echo_yaml())
    from test_endpoints import TENSORS

    gateways = [Gateway([topology], kafka, GatewaySettings(port=0, delete_reply_topics=False)) for _ in range(2)]
    async with InlineHost(topology, kafka), gateways[0], gateways[1], \
            AsyncHttpClient(gateways[0].url) as c0, AsyncHttpClient(gateways[1].url) as c1:
        await wait_ready(c0)
        n = 25
        calls = [c.infer(topology.name, TENSORS, request_id=f"gw{i}-{k}")
                 for k in range(n) for i, c in enumerate((c0, c1))]
        replies = await asyncio.gather(*calls)
        assert [r.status for r in replies] == [200] * (2 * n)
        assert sorted(r.json()["id"] for r in replies) == sorted(f"gw{i}-{k}" for k in range(n) for i in (0, 1))
        for i, gateway in enumerate(gateways):
            topic = topology.reply_topic(gateway.settings.instance)
            keys = [r.key.decode() for r in await read_to_end(kafka, topic, topology.spec.partitions, timeout_s=30)]
            assert sorted(keys) == sorted(f"gw{i}-{k}" for k in range(n))
            counters = gateway.bridge.counters
            assert (counters.sent, counters.replies, counters.unknown, counters.duplicates) == (n, n, 0, 0)
