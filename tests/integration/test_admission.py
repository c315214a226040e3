"""Deadline-aware admission on a real broker: hopeless requests are refused at once, feasible ones served."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.errors import ErrorKind
from flowserve.runtime.host import InlineHost
from flowserve.runtime.metrics import read_snapshots
from flowserve.runtime.profiles import ExecProfile, profile_path, save_profiles
from flowserve.topology import load_topology

pytestmark = pytest.mark.integration

TOPOLOGY = """
name: NAME
partitions: 2
nodes:
  slow: {component: fs_testkit:AddOne, inputs: {x: input.x}, max_batch: 16}
outputs: {y: slow.x}
"""


async def test_impossible_deadlines_are_refused_and_feasible_ones_served(kafka, write_topology) -> None:
    path = write_topology(TOPOLOGY)
    # The profile says a batch of one takes 2 s here: a 300 ms deadline cannot be met, a 60 s one can.
    save_profiles(profile_path(path), {"slow": ExecProfile({1: 2.0, 16: 2.5}).to_dict()},
                  topology=path.stem, device="cpu")
    topology = load_topology(path)
    x = np.ones((1, 4), np.float32)
    async with InlineHost(topology, kafka) as host, TopologyClient(topology, kafka) as client:
        worker = host.workers[0]
        assert worker.profile.seed == {1: 2.0, 16: 2.5}  # loaded from beside the topology at start
        await wait_ready(client, {"x": x})

        tight = [client.expect(f"tight-{i}") for i in range(5)]  # registered before any reply can arrive
        for i in range(5):
            await client.send({"x": x}, request_id=f"tight-{i}", timeout_ms=300)
        replies = await asyncio.wait_for(asyncio.gather(*tight), 30)
        for reply in replies:
            assert reply.error is not None and reply.error_kind == ErrorKind.REFUSED
            assert "refused by node 'slow'" in reply.error and "cannot finish before its deadline" in reply.error
        assert worker.counters.refused == 5

        feasible = {f"ok-{i}": client.expect(f"ok-{i}") for i in range(20)}
        for i, rid in enumerate(feasible):
            await client.queue({"x": np.full((1, 4), i, np.float32)}, request_id=rid, timeout_ms=60_000)
        await client.flush()
        served = await asyncio.wait_for(asyncio.gather(*feasible.values()), 60)
        for i, reply in enumerate(served):
            assert reply.error is None, reply.error
            np.testing.assert_array_equal(reply.tensors["y"], np.full((1, 4), i + 1, np.float32))
        assert worker.counters.refused == 5
        assert worker.counters.requests_ok == 20 + 1  # and the readiness probe

    # Each worker published a last snapshot when it stopped: `flowserve stats` sees the refusals.
    snaps = await read_snapshots(topology, kafka)
    assert [s["node"] for s in snaps] == ["slow"]
    assert snaps[0]["counters"]["refused"] == 5
    assert snaps[0]["metrics"]["requests.refused"] == 5
    assert snaps[0]["metrics"]["batch.size"]["count"] >= 1


async def test_a_request_doomed_by_the_queue_ahead_gets_a_deadline_error_at_once(kafka, write_topology) -> None:
    """Clockwork's early drop: the profile says a batch of b takes 5b s. Behind 4 requests, one due in 15 s
    finishes at 25 s at best, so it is answered now with kind ``deadline``; alone (5 s) it would have made
    it, so it is not refused. The 4 ahead, due in 5 minutes, are served."""
    path = write_topology(TOPOLOGY.replace("partitions: 2", "partitions: 1"))
    save_profiles(profile_path(path), {"slow": ExecProfile({1: 5.0, 16: 80.0}).to_dict()},
                  topology=path.stem, device="cpu")
    topology = load_topology(path)
    x = np.ones((1, 4), np.float32)
    async with InlineHost(topology, kafka) as host, TopologyClient(topology, kafka) as client:
        worker = host.workers[0]
        await wait_ready(client, {"x": x})
        rids = [f"head-{i}" for i in range(4)] + ["doomed"]
        waiting = {rid: client.expect(rid) for rid in rids}
        for rid in rids:  # one produce request on one partition: the worker fetches all five together
            await client.queue({"x": x}, request_id=rid, timeout_ms=15_000 if rid == "doomed" else 300_000)
        await client.flush()
        replies = dict(zip(waiting, await asyncio.wait_for(asyncio.gather(*waiting.values()), 60), strict=True))
        doomed = replies.pop("doomed")
        assert doomed.error_kind == ErrorKind.DEADLINE and doomed.error is not None
        assert "dropped by node 'slow'" in doomed.error and "4 requests ahead" in doomed.error
        assert all(r.error is None for r in replies.values())
        assert (worker.counters.doomed, worker.counters.refused) == (1, 0)
