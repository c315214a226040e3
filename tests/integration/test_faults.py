"""A 3-node topology answers every request, each exactly once at its caller, through a SIGKILLed stage and
through a broker paused for 5 s: every reply the faults made twice is dropped by the client's dedup and
counted there (tests/support/fs_once.py says why that is what "exactly once" means here)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
from fs_once import assert_answered_once

from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.runtime.host import ProcessHost
from flowserve.topology import load_topology

pytestmark = pytest.mark.slow

PIPELINE = """
name: NAME
partitions: 4
deadline_ms: 300000
nodes:
  a: {component: fs_testkit:AddOne, inputs: {x: input.x}}
  b: {component: fs_testkit:AddOne, inputs: {x: a.x}}
  c: {component: fs_testkit:AddOne, inputs: {x: b.x}}
outputs: {y: c.x}
"""
N = 1500


async def _drive(client: TopologyClient, fault, n: int = N) -> dict[str, np.ndarray]:
    """Send n requests in small bursts, call ``fault()`` a third of the way in, collect all replies."""
    sent: dict[str, float] = {}
    got: dict[str, np.ndarray] = {}
    futures = {}
    for i in range(n):
        rid = f"req-{i}"
        futures[rid] = client.expect(rid)
        await client.queue({"x": np.full((1, 4), i, np.float32)}, request_id=rid, timeout_ms=300_000)
        sent[rid] = i
        if i % 25 == 24:
            await client.flush()
            await asyncio.sleep(0.02)
        if i == n // 3:
            await client.flush()
            await fault()
    await client.flush()
    done, pending = await asyncio.wait(futures.values(), timeout=180)
    assert not pending, f"{len(pending)} of {n} requests never came back"
    for rid, fut in futures.items():
        reply = fut.result()
        assert reply.error is None, f"{rid}: {reply.error}"
        got[rid] = reply.tensors["y"]
    return got


def _check(got: dict[str, np.ndarray], n: int = N) -> None:
    assert len(got) == n
    for i in range(n):
        np.testing.assert_array_equal(got[f"req-{i}"], np.full((1, 4), i + 3, np.float32))


async def test_stage_killed_and_restarted_loses_nothing(kafka, write_topology, tmp_path: Path) -> None:
    path = write_topology(PIPELINE)
    topology = load_topology(path)
    host = ProcessHost(path, topology, kafka, log_dir=tmp_path / "logs")
    await host.start()
    try:
        async with TopologyClient(topology, kafka) as client:
            await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=120)

            async def kill_b() -> None:
                host.kill("b")
                await asyncio.sleep(1.0)
                host.restart("b")

            got = await _drive(client, kill_b)
            _check(got)
            await assert_answered_once(client, kafka, got)
            assert host.alive() == {"a": 1, "b": 1, "c": 1}
    finally:
        host.stop()


async def test_broker_paused_for_5s_loses_nothing(broker, kafka, write_topology, tmp_path: Path) -> None:
    path = write_topology(PIPELINE)
    topology = load_topology(path)
    host = ProcessHost(path, topology, kafka, log_dir=tmp_path / "logs")
    await host.start()
    try:
        async with TopologyClient(topology, kafka) as client:
            await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=120)

            async def pause() -> None:
                broker.pause()
                # Blocking on purpose: nothing on this loop may talk to the broker while it is stopped.
                time.sleep(5.0)
                broker.resume()

            got = await _drive(client, pause)
            _check(got)
            await assert_answered_once(client, kafka, got)
            assert host.alive() == {"a": 1, "b": 1, "c": 1}
    finally:
        host.stop()
