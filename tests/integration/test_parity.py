"""A parity-protected node's worker is SIGSTOPped mid-stream: every request is answered exactly once, with
exact values (the protected node is linear, so decoding is exact), and some answers are rebuilt from
their parity group and marked so."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from flowserve.capture.inspect import inspect_records
from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.runtime.host import ProcessHost
from flowserve.runtime.metrics import read_snapshots
from flowserve.topology import load_topology
from flowserve.wire.envelope import H_RECONSTRUCTED

pytestmark = pytest.mark.slow

PIPELINE = """
name: NAME
partitions: 4
deadline_ms: 300000
nodes:
  pre: {component: fs_testkit:AddOne, inputs: {x: input.x}}
  model:
    component: fs_testkit:Affine
    params: {mul: 3.0}
    inputs: {x: pre.x}
    replicas: 2
    parity: {k: 2, wait_ms: 50}
  post: {component: fs_testkit:AddOne, inputs: {x: model.x}}
outputs: {y: post.x}
"""
N = 600


async def _until_both_workers_compute(client: TopologyClient, host: ProcessHost) -> None:
    """Send warm-up requests until each model worker's published count of answered requests has grown:
    the group has settled with partitions on both, so the one stopped below holds some."""
    pids = {p.pid for p in host.procs["model"]}
    first: dict[int, int] | None = None
    for _ in range(120):
        calls = [client.call({"x": np.zeros((1, 4), np.float32)}, timeout_ms=60_000) for _ in range(8)]
        await asyncio.gather(*calls)
        counts = {int(s["worker"].rsplit("-", 2)[1]): s["counters"]["requests_ok"]
                  for s in await read_snapshots(host.topology, host.kafka) if s["node"] == "model"}
        if first is None and set(counts) == pids:
            first = counts
        elif first is not None and all(counts[p] > first[p] for p in pids):
            return
    raise AssertionError("the model workers never both answered requests (120 rounds of warm-up)")


async def _check_counters_and_lineage(host: ProcessHost, rebuilt: set[str]) -> None:
    """The encoder's and decoder's counters reach the metrics snapshots (``flowserve stats``), and every
    rebuilt request has a lineage record naming its group."""
    topology = host.topology
    for _ in range(100):  # snapshots are published every 2 s: poll until they count the rebuilt outputs
        snaps = await read_snapshots(topology, host.kafka)
        total = {key: sum(s["counters"].get(key, 0) for s in snaps)
                 for key in ("parity_groups", "reconstructed", "duplicates")}
        if total["reconstructed"] >= len(rebuilt):
            break
        await asyncio.sleep(0.5)
    assert total["parity_groups"] > 0 and total["reconstructed"] >= len(rebuilt)
    consumer = AIOKafkaConsumer(topology.lineage_topic, group_id=None, auto_offset_reset="earliest",
                                **host.kafka.client_kwargs())
    await consumer.start()
    found: dict[str, dict] = {}
    try:
        while not rebuilt <= set(found):
            batches = await consumer.getmany(timeout_ms=5000)
            assert batches, f"no lineage record for {sorted(rebuilt - set(found))[:5]}"
            for records in batches.values():
                for rec in records:
                    body = json.loads(rec.value)
                    if "reconstructed" in body:
                        found[body["request_id"]] = body
    finally:
        await consumer.stop()
    some = found[min(rebuilt)]
    assert some["node"] == "model" and min(rebuilt) in some["reconstructed"]["members"]
    assert len(some["reconstructed"]["members"]) == 2
    # and as actions of the parity decoder on the actions topic (flowserve ui shows them)
    actions = await inspect_records(host.kafka, f"{topology.name}.actions", last=1000, timeout_s=10)
    acted = {r.body["action"]["reconstructed"] for r in actions if r.body["source"] == "parity"}
    assert rebuilt <= acted


async def test_a_stopped_worker_of_a_protected_node_is_hidden_by_parity(kafka, write_topology,
                                                                          tmp_path: Path) -> None:
    path = write_topology(PIPELINE)
    topology = load_topology(path)
    host = ProcessHost(path, topology, kafka, log_dir=tmp_path / "logs")
    await host.start()
    stopped = host.procs["model"][0]
    try:
        async with TopologyClient(topology, kafka) as client:
            await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=120)
            await _until_both_workers_compute(client, host)
            futures = {}
            for i in range(N):
                rid = f"req-{i}"
                futures[rid] = client.expect(rid)
                await client.queue({"x": np.full((1, 4), i, np.float32)}, request_id=rid, timeout_ms=300_000)
                if i % 20 == 19:
                    await client.flush()
                    await asyncio.sleep(0.02)  # pacing, so groups form while the worker is stopped
                if i == N // 3:
                    await client.flush()
                    stopped.send_signal(signal.SIGSTOP)
            await client.flush()
            done, pending = await asyncio.wait(futures.values(), timeout=180)
            assert not pending, f"{len(pending)} of {N} requests never came back"
            rebuilt_ids = set()
            for i in range(N):
                reply = futures[f"req-{i}"].result()
                assert reply.error is None, f"req-{i}: {reply.error}"
                np.testing.assert_array_equal(reply.tensors["y"], np.full((1, 4), (i + 1) * 3 + 1, np.float32))
                if H_RECONSTRUCTED in reply.headers:
                    rebuilt_ids.add(f"req-{i}")
            rebuilt = len(rebuilt_ids)
            assert rebuilt > 0, "no reply was rebuilt from its parity group"
            assert client.duplicates == 0
            await _check_counters_and_lineage(host, rebuilt_ids)
    finally:
        with contextlib.suppress(ProcessLookupError):
            stopped.send_signal(signal.SIGCONT)
        host.stop()
