"""A drift detector's open window survives its worker's death: the rows it had not yet tested are not
committed, so the restarted worker reads them again and the next report covers the whole window."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from flowserve.capture.drift import drift_state
from flowserve.client import TopologyClient
from flowserve.runtime.host import ProcessHost
from flowserve.runtime.metrics import read_snapshots
from flowserve.topology import load_topology

pytest.importorskip("alibi_detect")
pytestmark = pytest.mark.slow

WINDOW = 20
BEFORE = 12  # requests the first detector worker files into its window before it is killed

TOPOLOGY = """
name: NAME
partitions: 1
deadline_ms: 300000
nodes:
  a: {component: fs_testkit:AddOne, inputs: {x: input.x}}
  drift:
    component: flowserve_components.drift:FeatureDrift
    params: {method: ks, window: WINDOW_ROWS, reference: REFERENCE}
    inputs: {x: a.x}
outputs: {y: a.x}
"""


async def _send(client: TopologyClient, rows: np.ndarray, first: int) -> None:
    futures = [client.expect(f"r{first + i}") for i in range(len(rows))]
    for i, row in enumerate(rows):
        await client.queue({"x": row.reshape(1, 4)}, request_id=f"r{first + i}", timeout_ms=300_000)
    await client.flush()
    for reply in await asyncio.wait_for(asyncio.gather(*futures), 180):
        assert reply.error is None, reply.error


async def _wait_filed(topology, kafka, node: str, count: int) -> None:  # noqa: ANN001
    """Until the detector's worker reports (metrics snapshot) that it has read ``count`` records."""
    for _ in range(120):
        snaps = [s for s in await read_snapshots(topology, kafka, timeout_s=5) if s.get("node") == node]
        if any(s.get("counters", {}).get("records_in", 0) >= count for s in snaps):
            return
        await asyncio.sleep(1)  # metrics are published every 2 s; this only paces the polling
    raise AssertionError(f"node {node} never reported {count} records read")


async def _wait_report(kafka, name: str) -> dict:  # noqa: ANN001
    """Until the drift topic holds a report (the restarted worker first loads alibi-detect and joins)."""
    for _ in range(180):
        state = await drift_state(kafka, name, timeout_s=10)
        if state:
            return state
        await asyncio.sleep(1)  # only paces the polling
    raise AssertionError("no drift report: the window's rows read before the kill were lost")


async def test_killed_detector_rebuilds_its_open_window(kafka, write_topology, tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    np.save(tmp_path / "ref.npy", rng.normal(1.0, 1.0, (400, 4)).astype(np.float32))  # AddOne shifts by 1
    path = write_topology(TOPOLOGY.replace("WINDOW_ROWS", str(WINDOW)).replace("REFERENCE", str(tmp_path / "ref.npy")))
    topology = load_topology(path)
    host = ProcessHost(path, topology, kafka, log_dir=tmp_path / "logs")
    await host.start()
    try:
        rows = rng.normal(0.0, 1.0, (WINDOW, 4)).astype(np.float32)
        async with TopologyClient(topology, kafka) as client:
            await _send(client, rows[:BEFORE], 0)
            await _wait_filed(topology, kafka, "drift", BEFORE)
            host.kill("drift")  # SIGKILL, mid-window: BEFORE of WINDOW rows filed, none tested
            host.restart("drift")
            await _send(client, rows[BEFORE:], BEFORE)
        state = await _wait_report(kafka, topology.name)
    finally:
        host.stop()
    (entry,) = state.values()
    assert entry["windows"] == 1
    assert entry["latest"]["rows"] == WINDOW  # the rows read before the kill are in it
    assert entry["latest"]["rows_skipped"] == 0
