"""A many-model node on a real broker: requests for many models, every answer from the model it named,
refusals of kind ``deadline``, nothing lost."""

from __future__ import annotations

import asyncio
import uuid
from typing import cast

import numpy as np
import pytest

from flowserve.client import TopologyClient
from flowserve.errors import ErrorKind
from flowserve.models import ModelHooks, model_hooks
from flowserve.runtime.host import InlineHost, create_topology_topics
from flowserve.topology import Topology, load_topology
from flowserve.wire.envelope import H_MODEL, H_SERVED_BY
from flowserve_components.many_models import EmulatedModels, offset

pytestmark = pytest.mark.integration

# 30 ResNet-50s (102 MB, 8 ms to load) with room for 5, and one model too slow to answer in time for anyone
ZOO = """
name: NAME
partitions: 2
deadline_ms: 60000
nodes:
  zoo:
    component: flowserve_components.many_models:EmulatedModels
    inputs: {x: input.x}
    batching: {policy: lag}
    models:
      names: [{name: huge, size_mb: 100, latency_ms: {1: 4000.0}}]
      kind: resnet50
      memory_mb: 520
outputs: {y: zoo.y}
"""


def _zoo(write_topology) -> Topology:  # noqa: ANN001
    names = [f"m-{i:05d}" for i in range(30)]
    listed = "[" + ", ".join([*names, "{name: huge, size_mb: 100, latency_ms: {1: 4000.0}}"]) + "]"
    return load_topology(write_topology(ZOO.replace("[{name: huge, size_mb: 100, latency_ms: {1: 4000.0}}]",
                                                    listed)))


async def test_every_answer_comes_from_the_model_it_named(kafka, write_topology) -> None:
    topology = _zoo(write_topology)
    component = cast(EmulatedModels, topology.nodes["zoo"].component)
    names = [f"m-{i:05d}" for i in range(30)]
    async with InlineHost(topology, kafka, hooks=model_hooks()) as host, \
            TopologyClient(topology, kafka) as client:
        (hook,) = [h for h in host.workers[0].hooks if isinstance(h, ModelHooks)]
        sent: dict[str, tuple[str, np.ndarray]] = {}
        futures = {}
        for round_ in range(4):
            for k, name in enumerate(names):
                rid = f"r{round_}-{k}-{uuid.uuid4().hex[:6]}"
                x = np.full((1, 4), round_ * 100 + k, np.float32)
                sent[rid] = (name, x)
                futures[rid] = client.expect(rid)
                await client.queue({"x": x}, request_id=rid, headers={H_MODEL: name}, timeout_ms=60_000)
        # refused early: a batch of 'huge' takes 4 s, past its 1.5 s deadline; then a model unknown, or none
        for rid, model, timeout in (("late", "huge", 1500), ("unknown", "m-99999", 60_000)):
            futures[rid] = client.expect(rid)
            await client.queue({"x": np.zeros((1, 4), np.float32)}, request_id=rid, headers={H_MODEL: model},
                               timeout_ms=timeout)
        futures["nameless"] = client.expect("nameless")
        await client.queue({"x": np.zeros((1, 4), np.float32)}, request_id="nameless", timeout_ms=60_000)
        await client.flush()
        replies = dict(zip(futures, await asyncio.wait_for(asyncio.gather(*futures.values()), 120), strict=True))

        # a burst with deadlines too tight for all its loads: each answered by its model or refused early
        burst: dict[str, tuple[str, np.ndarray]] = {}
        waits = {}
        for k in range(90):
            name, rid = names[(k * 7) % len(names)], f"b{k}-{uuid.uuid4().hex[:6]}"
            burst[rid] = (name, np.full((1, 4), k, np.float32))
            waits[rid] = client.expect(rid)
            await client.queue({"x": burst[rid][1]}, request_id=rid, headers={H_MODEL: name}, timeout_ms=150)
        await client.flush()
        tight = dict(zip(waits, await asyncio.wait_for(asyncio.gather(*waits.values()), 120), strict=True))

    assert len(tight) == len(burst)  # nothing lost
    for rid, (name, x) in burst.items():
        reply = tight[rid]
        if reply.error is not None:
            assert reply.error_kind is ErrorKind.DEADLINE, (rid, reply.error)
            continue
        assert reply.headers[H_SERVED_BY] == name.encode()
        np.testing.assert_array_equal(reply.tensors["y"], x + np.float32(offset(name)))
    assert len(replies) == len(sent) + 3  # nothing lost
    for rid, (name, x) in sent.items():
        reply = replies[rid]
        assert reply.error is None, (rid, reply.error)
        assert reply.headers[H_SERVED_BY] == name.encode()
        np.testing.assert_array_equal(reply.tensors["y"], x + np.float32(offset(name)))
    assert replies["late"].error_kind is ErrorKind.DEADLINE
    assert replies["unknown"].error_kind is ErrorKind.INVALID_INPUT and "m-99999" in str(replies["unknown"].error)
    assert replies["nameless"].error_kind is ErrorKind.INVALID_INPUT
    counters = hook.counters()
    answered = sum(r.error is None for r in tight.values())
    assert counters["model_answers"] == len(sent) + answered
    # the worker's own counts (flowserve stats): a refusal is no answer, a request naming no model is invalid
    worker = host.workers[0].counters
    assert worker.requests_ok == len(sent) + answered
    assert worker.refused == counters["model_refusals"] >= 1
    assert worker.dead_lettered == 2 and worker.dead_letter_reasons == {"invalid_input": 2}
    assert worker.requests_ok + worker.refused + worker.expired + worker.dead_lettered == len(replies) + len(tight)
    assert counters["model_loads"] >= len(names)  # each model loaded at least once, 5 at a time
    assert counters["model_evictions"] >= len(names) - 5
    assert counters["models_resident"] <= 5
    assert "huge" not in {m for kind, m in component.log if kind == "load"}  # never started: it cannot make it
    batches = [m for kind, m in component.log if kind == "batch"]
    assert sorted(set(batches)) == names


# one partition; 'fast' loads at once, 'heavy' holds the copy lane 1.5 s (its deadline is later: EDF loads 'fast'
# first)
TWO = """
name: NAME
partitions: 1
nodes:
  zoo:
    component: flowserve_components.many_models:EmulatedModels
    inputs: {x: input.x}
    batching: {policy: lag}
    models:
      names: [{name: fast, load_ms: 1}, {name: heavy, load_ms: 1500}]
      kind: alexnet
      memory_mb: 1000
outputs: {y: zoo.y}
"""


async def test_an_early_answer_leaves_before_the_consumed_batch_is_done(kafka, write_topology) -> None:
    """Both requests reach the worker in one fetch, 'heavy' first: 'fast''s answer is written as soon as its
    own batch ends, so it precedes 'heavy''s on the outputs topic (the whole batch answered at once would
    write them in the batch's order)."""
    topology = load_topology(write_topology(TWO))
    await create_topology_topics(topology, kafka)
    order: list[str] = []
    async with TopologyClient(topology, kafka) as client:
        futures = {}
        for rid, model, timeout in (("heavy", "heavy", 60_000), ("fast", "fast", 30_000)):
            futures[rid] = client.expect(rid)
            futures[rid].add_done_callback(lambda _, rid=rid: order.append(rid))
            await client.queue({"x": np.ones((1, 4), np.float32)}, request_id=rid, headers={H_MODEL: model},
                               timeout_ms=timeout)
        await client.flush()  # both written before the worker starts: one fetch, one consumed batch
        async with InlineHost(topology, kafka, hooks=model_hooks()) as host:
            replies = dict(zip(futures, await asyncio.wait_for(asyncio.gather(*futures.values()), 60), strict=True))
            worker = host.workers[0].counters
    assert order == ["fast", "heavy"]
    assert {rid: r.headers[H_SERVED_BY] for rid, r in replies.items()} == {"fast": b"fast", "heavy": b"heavy"}
    assert worker.requests_ok == 2 and worker.records_in == 2
