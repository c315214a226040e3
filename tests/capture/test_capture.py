"""Capture on a real broker: inspect returns each request's exact tensors at every node, sampling is
consistent across nodes, lineage names exactly the nodes a request passed, and every stage's spans
share the request's trace."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import yaml

from flowserve.capture import capture_hooks, sample_point, tracing
from flowserve.capture.drift import drift_state
from flowserve.capture.inspect import inspect_records
from flowserve.capture.lineage import expand, lineage
from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology, load_topology_text

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

CHAIN = """
name: NAME
partitions: 2
nodes:
  a: {component: fs_testkit:AddOne, inputs: {x: input.x}}
  b: {component: fs_testkit:AddOne, inputs: {x: a.x}}
outputs: {y: b.x}
capture: {sample: SAMPLE, ports: ["*"], lineage: true, tracing: false}
"""


async def _send(client: TopologyClient, xs: dict[str, np.ndarray], port: str = "x") -> None:
    futures = [client.expect(rid) for rid in xs]
    for rid, x in xs.items():
        await client.queue({port: x}, request_id=rid)
    await client.flush()
    replies = await asyncio.wait_for(asyncio.gather(*futures), 60)
    assert [r.error for r in replies] == [None] * len(xs)


async def test_inspect_returns_the_exact_tensors_of_a_request_at_every_node(kafka, unique_name) -> None:
    topology = load_topology_text(CHAIN.replace("NAME", unique_name).replace("SAMPLE", "1.0"))
    assert topology.nodes["b"].capture_topics == {"x": f"fs.{unique_name}.b.x"}  # nobody reads b.x
    rng = np.random.default_rng(0)
    xs = {f"req-{i}": rng.normal(size=(1 + i % 3, 4)).astype(np.float32) for i in range(12)}
    async with InlineHost(topology, kafka, hooks=capture_hooks), TopologyClient(topology, kafka) as client:
        await wait_ready(client, {"x": np.zeros((1, 4), np.float32)})
        await _send(client, xs)
    for rid, x in xs.items():
        records = await inspect_records(kafka, unique_name, request_id=rid)
        by_topic = {r.topic: r.tensors for r in records if r.topic != f"fs.{unique_name}.lineage"}
        assert set(by_topic) == {f"fs.{unique_name}.{t}" for t in ("inputs", "a.x", "b.x", "outputs")}
        np.testing.assert_array_equal(by_topic[f"fs.{unique_name}.inputs"]["x"], x)
        one_up = x + np.float32(1)  # each AddOne node's exact float32 result
        np.testing.assert_array_equal(by_topic[f"fs.{unique_name}.a.x"]["x"], one_up)
        np.testing.assert_array_equal(by_topic[f"fs.{unique_name}.b.x"]["x"], one_up + np.float32(1))
        np.testing.assert_array_equal(by_topic[f"fs.{unique_name}.outputs"]["y"], one_up + np.float32(1))
        one = await inspect_records(kafka, f"{unique_name}.a.x", request_id=rid)
        assert [r.topic for r in one] == [f"fs.{unique_name}.a.x"]
    last = await inspect_records(kafka, f"{unique_name}.b", last=3)
    assert len(last) == 3 and {r.topic for r in last} == {f"fs.{unique_name}.b.x"}


async def test_sampling_picks_the_same_requests_at_every_node(kafka, unique_name) -> None:
    topology = load_topology_text(CHAIN.replace("NAME", unique_name).replace("SAMPLE", "0.5"))
    xs = {f"s-{i}": np.full((1, 4), i, np.float32) for i in range(40)}
    async with InlineHost(topology, kafka, hooks=capture_hooks), TopologyClient(topology, kafka) as client:
        await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=120)
        await _send(client, xs)
    expected = {rid for rid in xs if sample_point(rid) < 0.5}
    assert 0 < len(expected) < len(xs)
    captured = await inspect_records(kafka, f"{unique_name}.b.x", last=1000)
    assert {r.key for r in captured} & set(xs) == expected
    lineage_records = await inspect_records(kafka, f"{unique_name}.lineage", last=1000)
    per_node: dict[str, list[str]] = {}
    batches: set[str] = set()
    for r in lineage_records:  # one record per commit (key: its first batch's id), listing sampled requests
        assert r.body["v"] == 3 and r.key == r.body["batches"][0]["id"]
        ids = [b["id"] for b in r.body["batches"]]
        assert not batches & set(ids) and len(set(ids)) == len(ids)  # each batch in exactly one record
        batches.update(ids)
        steps = expand(r.body)
        assert 1 <= len(steps) <= sum(b["size"] for b in r.body["batches"])
        for step in steps:
            assert step["batch"]["id"] in ids
            if step["request_id"] in xs:  # not wait_ready's probes
                per_node.setdefault(step["node"], []).append(step["request_id"])
    assert {n: sorted(rids) for n, rids in per_node.items()} == {"a": sorted(expected), "b": sorted(expected)}


def test_capture_off_writes_nothing_extra() -> None:
    from flowserve.capture import node_policy

    topology = load_topology(REPO / "topologies" / "digits.yaml")
    assert not any(t.endswith((".lineage", ".drift", ".post.probs", ".post.label")) for t in topology.topics())
    assert all(not n.capture_topics for n in topology.nodes.values())
    assert not any(node_policy(topology.spec, n).active for n in topology.nodes)  # no StageCapture attached


def _with_capture(path: Path, name: str) -> str:
    doc = yaml.safe_load(path.read_text())
    doc["name"] = name
    doc["capture"] = {"sample": 1.0, "lineage": True, "tracing": True, "retention_ms": 3_600_000}
    return yaml.safe_dump(doc)


@pytest.mark.parametrize("which", ["cascade", "ensemble"])
async def test_lineage_names_every_node_a_request_passed_and_spans_share_its_trace(kafka, unique_name,
                                                                                   which: str) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from flowserve_components.digits import sample

    exporter = InMemorySpanExporter()
    tracing.use_exporter(exporter)
    topology = load_topology_text(_with_capture(REPO / "topologies" / f"{which}.yaml", unique_name))
    for node in topology.nodes.values():
        node.component.prepare()
    requests, _ = sample(24, seed=3)
    xs = {f"{which}-{i}": r["pixels"] for i, r in enumerate(requests)}
    try:
        async with InlineHost(topology, kafka, hooks=capture_hooks), TopologyClient(topology, kafka) as client:
            await wait_ready(client, requests[0], timeout_s=120)
            await _send(client, xs, "pixels")
    finally:
        tracing.use_exporter(None)
    spans = exporter.get_finished_spans()
    paths = set()
    for rid in xs:
        steps = await lineage(kafka, rid, unique_name)
        nodes = [s.node for s in steps]
        assert len(nodes) == len(set(nodes)), nodes  # each node once
        if which == "ensemble":
            assert set(nodes) == set(topology.nodes)
        else:
            router = next(s for s in steps if s.node == "router")
            unsure = any(port == "unsure_x" for _, _, port in router.record["outputs"])
            branch = {"cnn", "cnn_probs"} if unsure else set()
            assert set(nodes) == {"pre", "fast", "fast_probs", "router", "final"} | branch
            paths.add(unsure)
        for s in steps:  # the records each stage read are read back from Kafka at the recorded offsets
            assert s.inputs and all(d is not None and d.tensors for d in s.inputs), s.record
            assert s.record["params_hash"] and s.record["batch"]["size"] >= 1
            if s.node in ("fast", "cnn", "mlp"):
                assert s.record["weights_hash"] and "weights=sha256:" in s.record["component"]
        np.testing.assert_array_equal(steps[0].inputs[0].tensors["pixels"], xs[rid])
        trace_ids = {s.record["trace_id"] for s in steps}
        assert len(trace_ids) == 1 and "" not in trace_ids
        mine = [sp for sp in spans if sp.attributes.get("fs.request_id") == rid]
        assert sorted(sp.name for sp in mine) == sorted(nodes)
        assert {f"{sp.context.trace_id:032x}" for sp in mine} == trace_ids
        span_ids = {sp.context.span_id for sp in mine}
        # each stage's span is the child of the span of the stage before it (or of the caller's span)
        assert sum(sp.parent.span_id in span_ids for sp in mine) >= len(mine) - 1
    if which == "cascade":
        assert paths == {True, False}  # both branches were taken and checked
    batch_spans = [sp for sp in spans if sp.name.endswith(".batch")]
    linked = {lk.context.span_id for sp in batch_spans for lk in sp.links}
    assert all(sp.context.span_id in linked for sp in spans if "fs.request_id" in sp.attributes)


async def test_drift_detector_on_a_shifted_stream(kafka, unique_name) -> None:
    from flowserve_components.digits import sample

    pytest.importorskip("alibi_detect")
    topology = load_topology_text(f"""
name: {unique_name}
partitions: 2
nodes:
  pre: {{component: flowserve_components.digits:Normalize, inputs: {{pixels: input.pixels}}}}
  input_drift:
    component: flowserve_components.drift:FeatureDrift
    params: {{window: 50, reference: "flowserve_components.drift:digits_reference"}}
    inputs: {{x: pre.x}}
outputs: {{x: pre.x}}
""")
    requests, _ = sample(150, seed=5, shift="noise", amount=0.5)
    xs = {f"d-{i}": r["pixels"] for i, r in enumerate(requests)}
    async with InlineHost(topology, kafka, hooks=capture_hooks), TopologyClient(topology, kafka) as client:
        await wait_ready(client, requests[0], timeout_s=120)
        futures = [client.expect(rid) for rid in xs]
        for rid, x in xs.items():
            await client.queue({"pixels": x}, request_id=rid)
        await client.flush()
        await asyncio.wait_for(asyncio.gather(*futures), 60)
        state: dict = {}
        deadline = asyncio.get_running_loop().time() + 60
        while asyncio.get_running_loop().time() < deadline:  # wait for the detector's third window
            state = await drift_state(kafka, unique_name)
            if state and next(iter(state.values()))["windows"] >= 3:
                break
    (entry,) = state.values()
    assert entry["windows"] >= 3 and entry["drift_windows"] >= 1, entry
    assert entry["latest"]["detector"] == "input_drift" and entry["latest"]["method"] == "ks"


def test_expand_reads_gathered_v3_records_and_single_batch_v2_records() -> None:
    fields = {"topology": "t", "version": "1", "node": "b", "component": "C", "params_hash": "p", "weights_hash": None}
    entry = ["r1", 0, 1, 2, [[0, 2, 7]], [[1, "x"]], "ab" * 16, "cd" * 8, None]
    v3 = {"v": 3, **fields, "topics": ["t.a.x", "t.b.x"], "batches": [
        {"id": "b-1", "size": 3, "start_ms": 10, "batch_ms": 0.5, "requests": [entry]},
        {"id": "b-2", "size": 1, "start_ms": 20, "batch_ms": 0.2, "requests": [["r2", *entry[1:]]]}]}
    steps = expand(v3)
    assert [(s["request_id"], s["batch"]["id"], s["timing"]["start_ms"]) for s in steps] == [
        ("r1", "b-1", 10), ("r2", "b-2", 20)]
    assert steps[0]["inputs"] == [["t.a.x", 2, 7]] and steps[0]["outputs"] == [["t.b.x", 2, "x"]]
    assert [s["batch"]["id"] for s in expand(v3, "r2")] == ["b-2"]
    v2 = {"v": 2, **fields, "topics": ["t.a.x", "t.b.x"], "batch": {"id": "b-1", "size": 3},
          "timing": {"start_ms": 10, "batch_ms": 0.5}, "requests": [entry]}
    assert expand(v2) == [steps[0]]
