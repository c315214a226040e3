"""The prediction cache on a real broker: a node with ``cache:`` and the gateway's response cache answer a
repeated request as the first time, from the cache, and the component sees it once."""

from __future__ import annotations

import asyncio
from typing import ClassVar, cast

import numpy as np
import pytest
from pydantic import BaseModel

from flowserve.cache import CacheHooks, cache_hooks
from flowserve.client import TopologyClient
from flowserve.client.http import AsyncHttpClient
from flowserve.client.traffic import wait_ready
from flowserve.component import Batch, Component, Port, Result
from flowserve.gateway import Gateway, GatewaySettings
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology

pytestmark = pytest.mark.integration

ROW = Port("FP32", [-1, 4])
PROBE = np.full((1, 4), -1, np.float32)
A = np.array([[1, 2, 3, 4]], np.float32)
B = np.array([[5, 6, 7, 8]], np.float32)
BAD = np.array([[9, 0, 0, 0]], np.float32)


class Seen(Component):
    """Adds one; remembers every row it processed; fails a row whose first value is 9."""

    inputs: ClassVar[dict[str, Port]] = {"x": ROW}
    outputs: ClassVar[dict[str, Port]] = {"y": ROW}

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        self.rows: list[tuple[float, ...]] = []

    def process(self, batch: Batch) -> Result:
        x = batch["x"]
        self.rows.extend(tuple(float(v) for v in r) for r in x)
        return Result({"y": x + 1}, errors={int(i): "rejects 9" for i in np.flatnonzero(x[:, 0] == 9)})

    def times(self, row: np.ndarray) -> int:
        return self.rows.count(tuple(float(v) for v in row[0]))


NODE_CACHE = """
name: NAME
partitions: 2
deadline_ms: 60000
nodes:
  m: {component: "tests.integration.test_prediction_cache:Seen", inputs: {x: input.x}, cache: {max_mb: 1}}
outputs: {y: m.y}
"""


async def test_a_node_cache_answers_a_repeated_request_without_process(kafka, write_topology) -> None:
    topology = load_topology(write_topology(NODE_CACHE))
    component = cast(Seen, topology.nodes["m"].component)
    assert type(component).__name__ == "Seen"  # imported by its dotted name: another module object
    async with InlineHost(topology, kafka, hooks=cache_hooks) as host, TopologyClient(topology, kafka) as client:
        await wait_ready(client, {"x": PROBE}, timeout_s=120)
        worker = host.workers[0]
        (cache,) = [h for h in worker.hooks if isinstance(h, CacheHooks)]  # attached by its hook factory
        before = cache.counters()["cache_hits"]
        first = await client.call({"x": A}, timeout_ms=30_000)
        second = await client.call({"x": A}, timeout_ms=30_000)
        assert first.error is None and second.error is None
        np.testing.assert_array_equal(first.tensors["y"], A + 1)
        np.testing.assert_array_equal(second.tensors["y"], first.tensors["y"])
        assert second.request_id != first.request_id
        assert component.times(A) == 1
        assert cache.counters()["cache_hits"] == before + 1

        # One batch of hits and misses (queued together): answers in place, only the misses processed.
        futures = {}
        for rid, x in (("h1", A), ("m1", B), ("f1", BAD), ("h2", A)):
            futures[rid] = client.expect(rid)
            await client.queue({"x": x}, request_id=rid)
        await client.flush()
        replies = dict(zip(futures, await asyncio.wait_for(asyncio.gather(*futures.values()), 60), strict=True))
        np.testing.assert_array_equal(replies["h1"].tensors["y"], A + 1)
        np.testing.assert_array_equal(replies["h2"].tensors["y"], A + 1)
        np.testing.assert_array_equal(replies["m1"].tensors["y"], B + 1)
        assert "rejects 9" in str(replies["f1"].error)
        assert component.times(A) == 1 and component.times(B) == 1

        # A failure is never cached: the same bad input reaches the component again.
        again = await client.call({"x": BAD}, timeout_ms=30_000)
        assert again.error is not None and component.times(BAD) == 2
        assert worker.metrics is not None  # the metrics snapshot (metrics topic, stats, ui) carries the counters
        counters = worker.metrics.snapshot()["counters"]
        assert counters["cache_hits"] == before + 3 and counters["cache_bytes"] > 0

        # A new version (a reload or promote changes the declared weights hash) is not answered from the old.
        component.weights_hash = "sha256:retrained"
        renewed = await client.call({"x": A}, timeout_ms=30_000)
        np.testing.assert_array_equal(renewed.tensors["y"], A + 1)
        assert component.times(A) == 2
        assert worker.metrics.snapshot()["counters"]["cache_invalidations"] == 1


GATEWAY_CACHE = """
name: NAME
partitions: 2
deadline_ms: 60000
cache: {max_mb: 1, ttl_s: 3600, vary: [X-User]}
nodes:
  m: {component: "tests.integration.test_prediction_cache:Seen", inputs: {x: input.x}}
outputs: {y: m.y}
"""


async def test_the_gateway_answers_a_repeated_request_from_its_cache(kafka, write_topology) -> None:
    topology = load_topology(write_topology(GATEWAY_CACHE))
    component = cast(Seen, topology.nodes["m"].component)
    assert type(component).__name__ == "Seen"  # imported by its dotted name: another module object
    async with InlineHost(topology, kafka), Gateway([topology], kafka, GatewaySettings(port=0)) as gateway, \
            AsyncHttpClient(gateway.url) as http:
        deadline = asyncio.get_running_loop().time() + 120
        while (await http.infer(topology.name, {"x": PROBE})).status != 200:  # groups still forming
            assert asyncio.get_running_loop().time() < deadline, "the gateway did not answer within 120 s"
        first = await http.infer(topology.name, {"x": A}, headers={"X-Request-Id": "one"})
        second = await http.infer(topology.name, {"x": A}, headers={"X-Request-Id": "two"})
        assert (first.status, second.status) == (200, 200)
        assert first.headers["x-flowserve-cache"] == "miss" and second.headers["x-flowserve-cache"] == "hit"
        assert (first.json()["id"], second.json()["id"]) == ("one", "two")
        assert second.headers["x-request-id"] == "two"
        np.testing.assert_array_equal(second.outputs()["y"], first.outputs()["y"])
        np.testing.assert_array_equal(first.outputs()["y"], A + 1)
        assert component.times(A) == 1
        binary = await http.infer(topology.name, {"x": A}, binary_outputs=True)  # same key, other encoding
        assert binary.headers["x-flowserve-cache"] == "hit"
        np.testing.assert_array_equal(binary.outputs()["y"], A + 1)

        # A header the answers vary by is part of the key: another user's request is not answered for ann.
        ann = await http.infer(topology.name, {"x": B}, headers={"X-User": "ann"})
        bob = await http.infer(topology.name, {"x": B}, headers={"X-User": "bob"})
        ann2 = await http.infer(topology.name, {"x": B}, headers={"X-User": "ann"})
        assert [r.headers["x-flowserve-cache"] for r in (ann, bob, ann2)] == ["miss", "miss", "hit"]
        assert component.times(B) == 2

        for _ in range(2):  # an error result is never cached
            bad = await http.infer(topology.name, {"x": BAD})
            assert bad.status == 400 and "x-flowserve-cache" not in bad.headers
        assert component.times(BAD) == 2
        counters = gateway.stats()["cache"][topology.name]
        assert counters["hits"] == 3 and counters["bytes"] > 0
        stats = (await http.get("/v2/gateway/stats")).json()
        assert stats["cache"][topology.name]["hits"] == 3
