"""Placement on live workers, on both brokers: two worker processes serve 16 emulated models through 4
partitions; requests routed by model (:class:`~flowserve.models.ModelRouter`) load each cold model on one
worker only and the hot one on both; then a worker holding models is SIGKILLed mid-stream, and its models are
served again by the other: every request answered (or refused with kind ``deadline``, counted) exactly once
at its caller, none by a model other than the one it named."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fs_once import assert_answered_once
from fs_topics import read_to_end

from flowserve.cli import main
from flowserve.client import TopologyClient
from flowserve.client.http import AsyncHttpClient
from flowserve.errors import ErrorKind
from flowserve.gateway import Gateway, GatewaySettings
from flowserve.gateway.health import ReadinessProbe
from flowserve.kafka.replies import Reply
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.models import ModelRouter, model_hooks, partition_of
from flowserve.models.agent import PlacementAgent, live_workers
from flowserve.runtime.host import InlineHost, ProcessHost
from flowserve.runtime.metrics import model_rows, read_snapshots
from flowserve.topology import Topology, load_topology
from flowserve.wire.envelope import H_MODEL, H_SERVED_BY, now_ms
from flowserve_components.many_models import offset

# 16 ResNet-50s (102 MB, 8 ms to load); each worker has room for 10, so neither needs to evict its own
ZOO = """
name: NAME
partitions: 4
deadline_ms: 120000
nodes:
  zoo:
    component: flowserve_components.many_models:EmulatedModels
    inputs: {x: input.x}
    replicas: 2
    batching: {policy: lag}
    models: {count: 16, kind: resnet50, memory_mb: 1100}
outputs: {y: zoo.y}
"""
NAMES = [f"m-{i:05d}" for i in range(16)]
HOT = NAMES[0]
TIMEOUT_MS = 120_000
X = np.array([[1, 2, 3, 4]], np.float32)


async def _stable(topology: Topology, kafka: KafkaSettings, workers: int) -> None:
    """Until the node's consumer group is Stable with ``workers`` members (polled, bounded)."""
    probe = ReadinessProbe([topology], kafka, cache_s=0.0)
    try:
        async with asyncio.timeout(120):
            while (await probe.check(0.0))[topology.name].members.get("zoo") != workers:
                await asyncio.sleep(0.2)
    finally:
        await probe.close()


async def _per_worker(topology: Topology, kafka: KafkaSettings, answers: int) -> dict[str, dict[str, Any]]:
    """Each worker's latest counters, once their snapshots count ``answers`` model answers in all."""
    async with asyncio.timeout(60):
        while True:
            snaps = [s for s in await read_snapshots(topology, kafka, timeout_s=5.0) if s.get("node") == "zoo"]
            if sum(s["counters"].get("model_answers", 0) for s in snaps) >= answers:
                return {str(s["worker"]): s["counters"] for s in snaps}
            await asyncio.sleep(0.5)


async def _send(client: TopologyClient, router: ModelRouter, batch: list[tuple[str, str, np.ndarray]],
                futures: dict[str, asyncio.Future[Reply]]) -> None:
    for rid, model, x in batch:
        futures[rid] = client.expect(rid)
        await client.queue({"x": x}, request_id=rid, headers={H_MODEL: model}, timeout_ms=TIMEOUT_MS,
                           partition=router.partition(model))
    await client.flush()


def _check(sent: dict[str, tuple[str, np.ndarray]], replies: dict[str, Reply]) -> int:
    """Every request answered by the model it named (or refused with ``deadline``); the refusals."""
    assert replies.keys() == sent.keys()  # nothing lost
    refused = 0
    for rid, (model, x) in sent.items():
        reply = replies[rid]
        if reply.error is not None:
            assert reply.error_kind is ErrorKind.DEADLINE, (rid, reply.error)
            refused += 1
            continue
        assert reply.headers[H_SERVED_BY] == model.encode(), rid
        np.testing.assert_array_equal(reply.tensors["y"], x + np.float32(offset(model)))
    return refused


@pytest.mark.slow
@pytest.mark.every_broker
async def test_models_are_placed_and_a_killed_workers_models_are_served_again(kafka, write_topology,
                                                                              tmp_path: Path) -> None:
    path = write_topology(ZOO)
    topology = load_topology(path)
    host = ProcessHost(path, topology, kafka, log_dir=tmp_path / "logs")
    await host.start()
    try:
        await _stable(topology, kafka, 2)
        router = ModelRouter(topology.spec.partitions, workers=2)
        async with TopologyClient(topology, kafka) as client:
            # placement: 3 rounds of every model once and the hot one 16 times (half the requests); after
            # the first round the router places again, and the hot model gains the second worker
            sent: dict[str, tuple[str, np.ndarray]] = {}
            futures: dict[str, asyncio.Future[Reply]] = {}
            for round_ in range(3):
                batch = [(f"p{round_}-{k}", name, np.full((1, 4), round_ * 100 + k, np.float32))
                         for k, name in enumerate(NAMES + [HOT] * 15)]
                sent.update({rid: (m, x) for rid, m, x in batch})
                await _send(client, router, batch, futures)
                await asyncio.wait_for(asyncio.gather(*futures.values()), 120)
                if round_ == 0:
                    changes = router.replace()
                    assert [(c.model, len(c.workers)) for c in changes] == [(HOT, 2)]
            replies = {rid: f.result() for rid, f in futures.items()}
            assert _check(sent, replies) == 0
            counters = await _per_worker(topology, kafka, len(sent))
            assert len(counters) == 2
            loaded_on = {m: sum(1 for c in counters.values() if c.get(f"model/{m}/loads")) for m in NAMES}
            assert loaded_on == {m: 2 if m == HOT else 1 for m in NAMES}  # cold: one worker; hot: both
            assert all(c["models_resident"] > 0 for c in counters.values())  # each holds models

            # a worker holding models is killed mid-stream: the other takes its partitions and its models
            victim = host.procs["zoo"][0]
            (held,) = [c for w, c in counters.items() if f"-{victim.pid}-" in w]
            assert held["models_resident"] > 0
            stream = [(f"s{k}", NAMES[(k * 5) % len(NAMES)] if k % 3 else HOT,
                       np.full((1, 4), 1000 + k, np.float32)) for k in range(240)]
            more: dict[str, asyncio.Future[Reply]] = {}
            for start in range(0, len(stream), 24):
                await _send(client, router, stream[start:start + 24], more)
                if start == 72:
                    os.kill(victim.pid, signal.SIGKILL)
                    victim.wait()
                await asyncio.sleep(0.05)  # bursts, as a stream: not synchronisation
            done = await asyncio.wait_for(asyncio.gather(*more.values()), 180)
            streamed = {rid: (m, x) for rid, m, x in stream}
            refused = _check(streamed, dict(zip(more, done, strict=True)))
            assert refused <= len(stream)  # counted: refusals of kind deadline are answers too
            print(f"after the kill: {len(stream) - refused} answered, {refused} refused (deadline)")
            # the victim's models, which the survivor never loaded before, are the survivor's now
            (survivor,) = [w for w in counters if f"-{victim.pid}-" not in w]
            orphans = {m for m in NAMES if held.get(f"model/{m}/loads") and not counters[survivor].get(
                f"model/{m}/loads")}
            assert orphans
            async with asyncio.timeout(60):
                while True:
                    now = {str(s["worker"]): s["counters"] for s in await read_snapshots(topology, kafka)}
                    if all(now[survivor].get(f"model/{m}/answers") for m in orphans):
                        break
                    await asyncio.sleep(0.5)
            served = Counter(m for m, _ in streamed.values())
            assert set(served) == set(NAMES)
            await assert_answered_once(client, kafka, [*sent, *streamed])
            assert host.alive() == {"zoo": 1}
    finally:
        host.stop()


@pytest.mark.integration
async def test_the_gateway_routes_by_placement_and_publishes_it(kafka, write_topology, capsys) -> None:
    path = write_topology(ZOO)
    topology = load_topology(path)
    settings = WorkerSettings(metrics_interval_s=0.2)
    agent = PlacementAgent(topology, "zoo", kafka, instance="test", interval_s=3600)  # rounds by hand
    gateway = Gateway([topology], kafka, GatewaySettings(port=0))
    gateway.bridge.routes[topology.name] = agent.router
    async with InlineHost(topology, kafka, settings, hooks=model_hooks(kafka, settings)), gateway, \
            AsyncHttpClient(gateway.url) as http:
        await agent.start()
        try:
            await _stable(topology, kafka, 2)
            deadline = asyncio.get_running_loop().time() + 120
            while (first := await http.infer("m-00003", {"x": X})).status != 200:  # groups still forming
                assert asyncio.get_running_loop().time() < deadline, f"no answer within 120 s: {first.json()}"
            async with asyncio.timeout(60):  # both workers report (every 0.2 s here)
                while live_workers(await read_snapshots(topology, kafka), "zoo", now_ms()) < 2:
                    await asyncio.sleep(0.2)
            for name in [HOT] * 10 + NAMES[5:9]:
                answer = await http.infer(name, {"x": X})
                assert answer.json()["model_name"] == name, answer.json()
            (change,) = await agent.round()  # half the requests: the hot model gains the other worker
            assert change.model == HOT and len(change.workers) == 2 and change.partitions[0] == partition_of(HOT, 4)
            for _ in range(6):
                answer = await http.infer(HOT, {"x": X})
                assert answer.json()["model_name"] == HOT
                np.testing.assert_array_equal(answer.outputs()["y"], X + np.float32(offset(HOT)))

            records = await read_to_end(kafka, topology.inputs_topic, 4)
            by_model: dict[str, Counter[int]] = {}
            for r in records:
                model = dict(r.headers)[H_MODEL].decode()
                by_model.setdefault(model, Counter())[r.partition] += 1
            assert by_model.pop(HOT) == {change.partitions[0]: 13, change.partitions[1]: 3}  # 10, then 3 + 3
            assert all(set(parts) == {partition_of(m, 4)} for m, parts in by_model.items())  # cold: home only

            actions = [json.loads(r.value) for r in await read_to_end(kafka, topology.actions_topic, 4)]
            assert [a["action"]["model"] for a in actions if a["source"] == "placement"] == [HOT]
            (action,) = [a["action"] for a in actions]
            assert action["partitions"] == list(change.partitions) and action["reason"].startswith("hot")

            capsys.readouterr()
            assert await asyncio.to_thread(main, ["stats", str(path), "--broker", kafka.bootstrap]) == 0
            assert "placement of node zoo: 2 worker(s), 4 partitions, 1 model(s) on more than one worker" in \
                capsys.readouterr().out
            async with asyncio.timeout(60):  # until the workers' snapshots (every 0.2 s) count the last answers
                while (rows := {r["model"]: r for r in model_rows(await read_snapshots(topology, kafka))}) \
                        .get(HOT, {}).get("answers", 0) < 16:  # flowserve ui's models panel
                    await asyncio.sleep(0.2)
            assert rows[HOT]["placed"] == list(change.partitions) and rows[HOT]["answers"] == 16
            assert rows["m-00005"]["placed"] == []
        finally:
            await agent.stop()
