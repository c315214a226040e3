"""The stage-hook seam: a feature sees every batch and writes records of its own through the worker's outbox."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.component import Component
from flowserve.runtime.emit import Item
from flowserve.runtime.hooks import BatchOutcome, StageContext, StageHooks, no_hooks
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology
from flowserve.topology.graph import Node, Topology

TOPOLOGY = """
name: NAME
partitions: 2
deadline_ms: 60000
nodes:
  add: {component: fs_testkit:AddOne, inputs: {x: input.x}}
outputs: {y: add.x}
"""


class Recorder(StageHooks):
    """Counts what the worker shows it and copies each request's id to a side topic."""

    def __init__(self, side_topic: str) -> None:
        self.side_topic = side_topic
        self.stage: StageContext | None = None
        self.requests: list[str] = []
        self.rows = 0
        self.ended = 0
        self.steps = 0
        self.closed = False

    def start(self, stage: StageContext) -> None:
        self.stage = stage

    def begin(self, items: Sequence[Item]) -> Any:
        return [it.ready.request_id for it in items]

    def end(self, token: Any, outcome: BatchOutcome) -> None:
        assert self.stage is not None
        self.ended += 1
        self.requests.extend(token)
        self.rows += sum(outcome.sizes)
        assert set(outcome.outputs) == {"x"} and not outcome.errors
        for rid in token:
            self.stage.emit(self.side_topic, 0, rid.encode(), b"seen", [])

    def after_step(self, *, force: bool) -> bool:
        self.steps += 1
        return True

    def close(self) -> None:
        self.closed = True


async def _side_keys(kafka: Any, topic: str, expect: int) -> list[str]:
    consumer = AIOKafkaConsumer(topic, group_id=None, auto_offset_reset="earliest", fetch_max_wait_ms=5,
                                **kafka.client_kwargs())
    await consumer.start()
    keys: list[str] = []
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while len(keys) < expect and asyncio.get_running_loop().time() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                keys.extend(r.key.decode() for r in records)
    finally:
        await consumer.stop()
    return keys


@pytest.mark.integration
async def test_hooks_see_every_batch_and_write_side_records(kafka, write_topology) -> None:
    topology = load_topology(write_topology(TOPOLOGY))
    side = f"{topology.base}.hook-side"
    recorders: list[Recorder] = []

    def factory(t: Topology, node: Node, component: Component) -> list[StageHooks]:
        assert t is topology and node.id == "add" and component is node.component
        recorders.append(Recorder(side))
        return [recorders[-1]]

    async with InlineHost(topology, kafka, hooks=factory), TopologyClient(topology, kafka) as client:
        (hook,) = recorders
        assert hook.stage is not None and hook.stage.node.id == "add"
        await wait_ready(client, {"x": np.ones((1, 4), np.float32)})
        ids = [f"r{i}" for i in range(40)]
        futures = [client.expect(rid) for rid in ids]
        for i, rid in enumerate(ids):
            await client.queue({"x": np.full((1, 4), i, np.float32)}, request_id=rid)
        await client.flush()
        replies = await asyncio.wait_for(asyncio.gather(*futures), 60)
        assert [r.error for r in replies] == [None] * len(ids)
        assert set(ids) <= set(hook.requests) and hook.ended >= 1 and hook.rows == len(hook.requests)
        assert set(ids) <= set(await _side_keys(kafka, side, len(hook.requests)))
        assert hook.steps > 0  # once per step, batch or not (one step may run several batches)
    assert hook.closed


def test_a_worker_without_hooks_has_none() -> None:
    assert no_hooks(None, None, None) == []  # type: ignore[arg-type]
