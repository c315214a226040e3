"""The stage-hook seam: a feature sees every batch and writes records of its own through the worker's outbox."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.component import Component
from flowserve.errors import Failure
from flowserve.runtime.emit import Item
from flowserve.runtime.hooks import (
    Answered,
    AnsweredInParts,
    BatchOutcome,
    Outcome,
    Part,
    StageContext,
    StageHooks,
    no_hooks,
)
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


class Gate(StageHooks):
    """Drops ``drop-`` records before decoding, answers ``ans-`` requests itself (rows of -1), and while
    ``hold`` is set holds back every partition from the first record it admitted since."""

    holds_offsets = True

    def __init__(self) -> None:
        self.dropped = 0
        self.hold = False
        self.held: dict[tuple[str, int], int] = {}

    def admit(self, records: list[Any]) -> list[Any]:
        if self.hold:
            for r in records:
                self.held.setdefault((r.topic, r.partition), r.offset)
        kept = [r for r in records if not (r.key or b"").startswith(b"drop-")]
        self.dropped += len(records) - len(kept)
        return kept

    def answer(self, items: Sequence[Item], sizes: Sequence[int]) -> Answered:
        return Answer([it.ready.request_id.startswith("ans-") for it in items])

    def held_offsets(self) -> dict[tuple[str, int], int]:
        return dict(self.held) if self.hold else {}


class Answer:
    def __init__(self, skip: list[bool], fill: float = -1) -> None:
        self.skip = skip
        self.fill = fill
        self.failures: dict[int, Failure] = {}

    def complete(self, sizes: Sequence[int], outputs: dict[str, np.ndarray], mask: dict[str, np.ndarray],
                 errors: dict[int, str]) -> Outcome:
        done = iter(np.split(outputs["x"], np.cumsum([n for n, s in zip(sizes, self.skip, strict=True)
                                                      if not s])[:-1])) if "x" in outputs else iter(())
        rows = [np.full((n, 4), self.fill, np.float32) if s else next(done)
                for n, s in zip(sizes, self.skip, strict=True)]
        return {"x": np.concatenate(rows)}, mask, errors


async def _committed(kafka: Any, group: str, topic: str) -> dict[int, int]:
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}


async def _ends(kafka: Any, topic: str, partitions: int) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(group_id=None, **kafka.client_kwargs())
    await consumer.start()
    try:
        return await consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    finally:
        await consumer.stop()


async def _until_committed(kafka: Any, group: str, topic: str, want: dict[int, int]) -> None:
    deadline = asyncio.get_running_loop().time() + 60
    while (got := await _committed(kafka, group, topic)) != want:
        assert asyncio.get_running_loop().time() < deadline, f"committed {got}, expected {want}"
        await asyncio.sleep(0.2)  # polling the broker's record of the group, not pacing the worker


@pytest.mark.integration
async def test_hooks_drop_records_answer_requests_and_bound_the_commit(kafka, write_topology) -> None:
    topology = load_topology(write_topology(TOPOLOGY))
    gates: list[Gate] = []

    def factory(t: Topology, node: Node, component: Component) -> list[StageHooks]:
        gates.append(Gate())
        return [gates[-1]]

    group, topic = topology.group_id("add"), topology.inputs_topic
    async with InlineHost(topology, kafka, hooks=factory), TopologyClient(topology, kafka) as client:
        (gate,) = gates
        await wait_ready(client, {"x": np.ones((1, 4), np.float32)})
        gate.hold = True
        futures = {rid: client.expect(rid) for rid in ("ans-1", "n-1", "ans-2", "n-2")}
        for i, rid in enumerate(("ans-1", "n-1", "drop-1", "ans-2", "n-2")):
            await client.queue({"x": np.full((1, 4), i, np.float32)}, request_id=rid)
        await client.flush()
        replies = dict(zip(futures, await asyncio.wait_for(asyncio.gather(*futures.values()), 60), strict=True))
        assert {rid: r.tensors["y"][0, 0] for rid, r in replies.items()} == {"ans-1": -1, "n-1": 2, "ans-2": -1,
                                                                             "n-2": 5}
        assert gate.dropped == 1
        # Held: each partition commits no further than the first record admitted since the hold began.
        ends = await _ends(kafka, topic, topology.spec.partitions)
        held = {p: off for (t, p), off in gate.held.items() if t == topic}
        await _until_committed(kafka, group, topic, {tp.partition: held.get(tp.partition, end)
                                                     for tp, end in ends.items()})
        # Released: the next batch commits every partition, those it has no record of included.
        gate.hold = False
        assert (await client.call({"x": np.zeros((1, 4), np.float32)}, timeout_ms=30_000)).error is None
        ends = await _ends(kafka, topic, topology.spec.partitions)
        await _until_committed(kafka, group, topic, {tp.partition: end for tp, end in ends.items()})


class Parts(StageHooks):
    """Answers ``p-`` requests itself (rows of -2) in parts of one, last request first."""

    def __init__(self) -> None:
        self.parts = 0

    def answer(self, items: Sequence[Item], sizes: Sequence[int]) -> Answered:
        return InParts(self, [it.ready.request_id.startswith("p-") for it in items])


class InParts(Answer):
    def __init__(self, hook: Parts, skip: list[bool]) -> None:
        super().__init__(skip, fill=-2)
        self.hook = hook

    async def parts(self):  # noqa: ANN201 - an AsyncGenerator[Part, None]
        for i in reversed([i for i, s in enumerate(self.skip) if s]):
            await asyncio.sleep(0)  # each part ready later, as a device's batch would be
            self.hook.parts += 1
            yield Part([i], Answer([True], fill=-2))


@pytest.mark.integration
async def test_an_answer_in_parts_is_sent_part_by_part_or_merged_with_the_others(kafka, write_topology) -> None:
    """Alone, a hook's answer in parts is written part by part; after another hook's answer it is merged
    whole with it and with what ``process`` returned."""
    topology = load_topology(write_topology(TOPOLOGY))
    hooks: list[StageHooks] = []

    def factory(t: Topology, node: Node, component: Component) -> list[StageHooks]:
        hooks.append(Parts())
        return [Gate(), hooks[-1]] if len(hooks) == 1 else [hooks[-1]]

    merged = topology
    alone = load_topology(write_topology(TOPOLOGY.replace("name: NAME", f"name: {topology.name}b")))
    for topo in (merged, alone):
        async with InlineHost(topo, kafka, hooks=factory) as host, TopologyClient(topo, kafka) as client:
            rids = ("ans-1", "p-1", "n-1", "p-2") if topo is merged else ("p-1", "p-2", "p-3")
            futures = {rid: client.expect(rid) for rid in rids}
            for i, rid in enumerate(rids):
                await client.queue({"x": np.full((1, 4), i, np.float32)}, request_id=rid)
            await client.flush()
            replies = dict(zip(futures, await asyncio.wait_for(asyncio.gather(*futures.values()), 60),
                               strict=True))
            worker = host.workers[0]
        want = {"ans-1": -1, "p-1": -2, "n-1": 3, "p-2": -2} if topo is merged else dict.fromkeys(rids, -2)
        assert {rid: r.tensors["y"][0, 0] for rid, r in replies.items()} == want
        assert worker.counters.requests_ok == len(rids)
    assert [h.parts for h in hooks] == [2, 3]
    assert isinstance(InParts(Parts(), []), AnsweredInParts)
