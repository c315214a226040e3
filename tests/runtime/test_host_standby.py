"""Warm spares: a ProcessHost keeps standby workers outside the group, a spawn promotes one (the same
process, not a new one), it then serves like any worker, and stop ends the spares too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from fs_testkit import ONE_EMULATED_STAGE

from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.gateway.health import ReadinessProbe
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.runtime.process import standby_supported
from flowserve.topology import load_topology

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not standby_supported(), reason="standby needs sigtimedwait (Linux)")]


async def test_a_promoted_spare_joins_the_stage_and_serves(kafka, write_topology, tmp_path: Path) -> None:
    path = write_topology(ONE_EMULATED_STAGE.replace("PARTITIONS", "2"))
    topology = load_topology(path)
    host = ProcessHost(path, topology, kafka, log_dir=tmp_path / "logs")  # type: ignore[arg-type]
    await create_topology_topics(topology, kafka)  # type: ignore[arg-type]
    host.start_processes()
    host.prepare("m", 2)
    spares = list(host.standby["m"])
    try:
        assert host.alive() == {"m": 1} and all(p.poll() is None for p in spares)
        promoted = host.spawn("m")
        assert promoted is spares[0] and host.standby["m"] == spares[1:]
        assert host.alive() == {"m": 2}
        async with TopologyClient(topology, kafka) as client:
            await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=120)
            # both consumers in the group: the promoted spare joined (where the broker describes groups)
            probe = ReadinessProbe([topology], kafka, cache_s=0)  # type: ignore[arg-type]
            for _ in range(300):
                readiness = (await probe.check())[topology.name]
                if not readiness.groups_checked or readiness.members.get("m", 0) == 2:
                    break
                await asyncio.sleep(0.2)  # polling the group's membership, bounded
            assert not readiness.groups_checked or readiness.members.get("m", 0) == 2, readiness.members
            for i in range(20):
                x = np.full((1, 4), i, np.float32)
                reply = await client.call({"x": x}, timeout_ms=60_000)
                assert reply.error is None, reply.error
                np.testing.assert_array_equal(reply.tensors["x"], x)
        assert "Traceback" not in (tmp_path / "logs" / "m-1-standby.log").read_text()
        assert promoted.poll() is None
    finally:
        host.stop()
    assert all(p.poll() is not None for p in [promoted, *spares])
