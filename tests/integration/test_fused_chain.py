"""A fused chain on a real broker answers as the same stages unfused: results, failures, routing."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from flowserve.client import TopologyClient
from flowserve.client.kafka import Reply
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import InlineHost
from flowserve.topology import Topology, load_topology_text
from flowserve.topology.fuse import Chain

pytestmark = pytest.mark.integration

# pre doubles, check rejects 14 (an input of 7), route sends 50 and more to `slow` (+100), the rest straight
# on; final takes whichever branch a request came down.
TOPOLOGY = """
name: NAME
nodes:
  pre: {component: fs_testkit:Affine, params: {mul: 2}, inputs: {x: input.x}}
  check: {component: fs_testkit:Reject, params: {value: 14}, inputs: {x: pre.x}}
  route: {component: fs_testkit:Split, params: {value: 50}, inputs: {x: check.x}}
  slow: {component: fs_testkit:Affine, params: {add: 100}, inputs: {x: route.hi}}
  final: {component: fs_testkit:Affine, inputs: {x: [route.lo, slow.x]}, join: {type: any}}
outputs: {y: final.x}
"""

# request -> first column of each row; the other columns are 1, 2, 3.
REQUESTS = {
    "plain": [1.0],
    "rows": [2.0, 3.0],
    "failed": [7.0],
    "failed-row": [4.0, 7.0, 5.0],
    "routed": [30.0],
    "routed-rows": [40.0, 45.0],
}
FAILED = {"failed", "failed-row"}


def tensor(firsts: list[float]) -> np.ndarray:
    return np.array([[v, 1.0, 2.0, 3.0] for v in firsts], dtype=np.float32)


def expected(name: str) -> np.ndarray:
    """Doubled, and 100 added on the `slow` branch."""
    return tensor(REQUESTS[name]) * 2 + (100 if name.startswith("routed") else 0)


async def replies(topology: Topology, kafka: KafkaSettings) -> dict[str, Reply]:
    """Every request sent at once (so that they share batches), each request's reply."""
    async with InlineHost(topology, kafka), TopologyClient(topology, kafka) as client:
        futures = {}
        for name, firsts in REQUESTS.items():
            rid = f"{topology.name}-{name}"
            futures[name] = client.expect(rid)
            await client.queue({"x": tensor(firsts)}, request_id=rid, timeout_ms=60_000)
        await client.flush()
        await asyncio.wait_for(asyncio.gather(*futures.values()), 90)
    return {name: f.result() for name, f in futures.items()}


async def test_fused_chain_answers_as_unfused(kafka: KafkaSettings, unique_name: str) -> None:
    plain = load_topology_text(TOPOLOGY.replace("NAME", unique_name))
    fused = load_topology_text(TOPOLOGY.replace("NAME", f"{unique_name}-fused") + "fuse: {chain: [pre, check, route]}")
    assert list(fused.nodes) == ["chain", "slow", "final"]
    assert isinstance(fused.nodes["chain"].component, Chain)
    assert not any(".pre." in t or ".check." in t or ".route." in t for t in fused.topics())

    want, got = await replies(plain, kafka), await replies(fused, kafka)
    for name in REQUESTS:
        if name not in FAILED:
            assert want[name].error is None and got[name].error is None, (name, got[name].error)
            np.testing.assert_array_equal(want[name].tensors["y"], expected(name))
            np.testing.assert_array_equal(got[name].tensors["y"], want[name].tensors["y"])
        else:
            assert want[name].error is not None and "rejects 14" in want[name].error
            assert got[name].error is not None and "node 'check': rejects 14" in got[name].error, got[name].error
