"""What a valid topology compiles to: topics, node order, joins, the outputs record, derived inputs."""

from __future__ import annotations

import numpy as np

from flowserve.component import Batch, Port
from flowserve.topology import Source, Topology, load_topology_text
from flowserve.topology.graph import OUTPUTS_NODE, Collect

C = "fs_test_components"  # tests/topology/fs_test_components.py, importable through conftest.py
VEC = Port("FP32", [-1, 4])


def compile_yaml(nodes: str, outputs: str, head: str = "") -> Topology:
    return load_topology_text(f"name: digits\n{head}nodes:\n{nodes}outputs:\n{outputs}", source="inline.yaml")


def node(node_id: str, component: str, inputs: str = "{x: input.x}", more: str = "") -> str:
    extra = "".join(f"\n    {line}" for line in more.splitlines() if line)
    return f"  {node_id}:\n    component: {C}:{component}\n    inputs: {inputs}{extra}\n"


DIAMOND = (
    node("merge", "Pair", "{a: left.y, b: right.y}")
    + node("right", "Scale", "{x: src.y}", more="params: {factor: 3}")
    + node("left", "Scale", "{x: src.y}")
    + node("src", "Scale")
)


def test_topic_names_are_prefix_topology_node_port() -> None:
    nodes = node("a", "Classify") + node("b", "Scale", "{x: a.scores}") + node("c", "Count", "{label: a.label}")
    topo = compile_yaml(nodes, "  y: b.y\n  n: c.n\n", head="prefix: acme\n")
    assert topo.base == "acme.digits"
    assert topo.nodes["a"].output_topics == {"label": "acme.digits.a.label", "scores": "acme.digits.a.scores"}
    assert topo.nodes["b"].output_topics == {"y": "acme.digits.b.y"}
    assert topo.inputs_topic == "acme.digits.inputs"
    assert topo.outputs_topic == "acme.digits.outputs"
    assert topo.deadletter_topic == "acme.digits.deadletter"
    assert topo.group_id("a") == "acme.digits.a"
    assert topo.topics() == [
        "acme.digits.inputs", "acme.digits.outputs", "acme.digits.deadletter", "acme.digits.metrics",
        "acme.digits.feedback",
        "acme.digits.a.label", "acme.digits.a.scores", "acme.digits.b.y", "acme.digits.c.n",
    ]
    assert topo.nodes["a"].bindings == {"x": (Source("acme.digits.inputs", "x", None, "input.x", None),)}
    assert topo.nodes["c"].bindings["label"][0].topic == "acme.digits.a.label"


def test_only_ports_somebody_reads_get_a_topic() -> None:
    alone = compile_yaml(node("a", "Classify"), "  label: a.label\n")
    assert alone.nodes["a"].output_topics == {}
    assert alone.topics() == ["fs.digits.inputs", "fs.digits.outputs", "fs.digits.deadletter", "fs.digits.metrics",
                             "fs.digits.feedback"]
    read = compile_yaml(node("a", "Classify") + node("b", "Scale", "{x: a.scores}"), "  out: b.y\n")
    assert read.nodes["a"].output_topics == {"scores": "fs.digits.a.scores"}
    assert read.nodes["b"].output_topics == {}


def assert_every_read_topic_is_written(topo: Topology) -> None:
    written = {t for n in topo.nodes.values() for t in n.output_topics.values()} | {topo.inputs_topic}
    for n in topo.nodes.values():
        for source in [*(s for ss in n.bindings.values() for s in ss), *n.triggers]:
            if source.node is not None:
                assert source.topic in written, f"node '{n.id}' reads {source.topic}, which nobody writes"
                assert source.topic == topo.nodes[source.node].output_topics[source.tensor]


def test_every_topic_a_node_reads_is_written_by_its_producer() -> None:
    for outputs in ("  out: merge.y\n", "  merged: merge.y\n  early: left.y\n", "  r: right.y\n  l: left.y\n"):
        assert_every_read_topic_is_written(compile_yaml(DIAMOND, outputs))
    gated = compile_yaml(node("a", "Scale") + node("b", "Scale", more="triggers: [a.y]"), "  out: b.y\n")
    assert_every_read_topic_is_written(gated)


def test_topic_names_are_deterministic() -> None:
    first = compile_yaml(DIAMOND, "  out: merge.y\n")
    second = compile_yaml(DIAMOND, "  out: merge.y\n")
    assert first.topics() == second.topics()
    assert first.nodes["merge"].input_topics == ("fs.digits.left.y", "fs.digits.right.y")
    assert first.nodes["src"].output_topics == {"y": "fs.digits.src.y"}


def test_nodes_are_in_topological_order() -> None:
    topo = compile_yaml(DIAMOND, "  out: merge.y\n")
    assert list(topo.nodes) == ["src", "left", "right", "merge"]
    chain = compile_yaml(node("c", "Scale", "{x: b.y}") + node("b", "Scale", "{x: a.y}") + node("a", "Scale"),
                         "  out: c.y\n")
    assert list(chain.nodes) == ["a", "b", "c"]


def test_components_are_configured_per_node() -> None:
    topo = compile_yaml(DIAMOND, "  out: merge.y\n")
    right = topo.nodes["right"].component
    assert type(right).__name__ == "Scale"
    assert right.params.factor == 3.0  # type: ignore[attr-defined]
    assert right.node == "right"
    assert topo.nodes["left"].component.params.factor == 1.0  # type: ignore[attr-defined]
    assert type(topo.nodes["merge"].component).__name__ == "Pair"


def test_fan_in_node_needs_a_join() -> None:
    topo = compile_yaml(DIAMOND, "  out: merge.y\n")
    merge = topo.nodes["merge"]
    assert merge.needs_join
    assert merge.join.type == "inner" and merge.join.window_ms == 5000
    assert merge.bindings["a"][0].node == "left" and merge.bindings["a"][0].port == VEC
    assert not topo.nodes["left"].needs_join
    assert topo.nodes["left"].input_topics == ("fs.digits.src.y",)


def test_alternatives_and_triggers_need_a_join() -> None:
    any_join = compile_yaml(node("a", "Scale", "{x: [input.x, input.w]}", more="join: {type: any, window_ms: 50}"),
                            "  out: a.y\n")
    a = any_join.nodes["a"]
    assert a.input_topics == ("fs.digits.inputs",)
    assert a.needs_join
    assert a.join.type == "any" and a.join.window_ms == 50
    gated = compile_yaml(node("a", "Scale") + node("b", "Scale", more="triggers: [a.y]"), "  out: b.y\n")
    assert gated.nodes["b"].needs_join
    assert gated.nodes["b"].input_topics == ("fs.digits.a.y", "fs.digits.inputs")
    assert [t.ref for t in gated.nodes["b"].triggers] == ["a.y"]


def test_outputs_from_one_node_are_written_by_that_node() -> None:
    topo = compile_yaml(node("a", "Classify"), "  label: a.label\n  scores: a.scores\n")
    assert OUTPUTS_NODE not in topo.nodes
    assert topo.nodes["a"].emits_outputs == {"label": "label", "scores": "scores"}
    assert topo.output_ports() == {"label": Port("INT64", [-1]), "scores": VEC}


def test_outputs_can_be_renamed() -> None:
    topo = compile_yaml(node("a", "Classify"), "  digit: a.label\n")
    assert topo.nodes["a"].emits_outputs == {"digit": "label"}
    assert topo.outputs["digit"].tensor == "label"
    assert topo.outputs["digit"].topic == "fs.digits.a.label"
    assert topo.output_ports() == {"digit": Port("INT64", [-1])}


def test_outputs_from_several_nodes_get_an_implicit_collect_node() -> None:
    topo = compile_yaml(DIAMOND, "  merged: merge.y\n  early: left.y\n", head="deadline_ms: 2500\n")
    assert list(topo.nodes)[-1] == OUTPUTS_NODE
    collect = topo.nodes[OUTPUTS_NODE]
    assert isinstance(collect.component, Collect)
    assert {n.id: n.emits_outputs for n in topo.nodes.values() if n.emits_outputs} == {
        OUTPUTS_NODE: {"merged": "merged", "early": "early"}
    }
    assert {port: [s.topic for s in sources] for port, sources in collect.bindings.items()} == {
        "merged": ["fs.digits.merge.y"], "early": ["fs.digits.left.y"],
    }
    assert collect.bindings["early"][0].tensor == "y"
    assert collect.needs_join
    assert collect.join.type == "inner" and collect.join.window_ms == 2500
    assert collect.output_topics == {}
    assert collect.component.inputs == {"merged": VEC, "early": VEC}
    assert topo.topics() == [  # Collect writes the topology's outputs topic and owns none of its own
        "fs.digits.inputs", "fs.digits.outputs", "fs.digits.deadletter", "fs.digits.metrics",
        "fs.digits.feedback", "fs.digits.src.y", "fs.digits.left.y", "fs.digits.right.y", "fs.digits.merge.y",
    ]
    batch = Batch({"merged": np.ones((2, 4)), "early": np.zeros((2, 4))}, [1, 1], ["r1", "r2"])
    assert collect.component.process(batch).keys() == {"merged", "early"}


def test_collect_window_is_capped_for_long_deadlines() -> None:
    topo = compile_yaml(DIAMOND, "  merged: merge.y\n  early: left.y\n", head="deadline_ms: 7200000\n")
    assert topo.nodes[OUTPUTS_NODE].join.window_ms == 3_600_000


def test_external_reference_to_another_topology() -> None:
    topo = compile_yaml(node("a", "Scale", "{x: upstream.outputs.emb}"), "  out: a.y\n")
    source = topo.nodes["a"].bindings["x"][0]
    assert source == Source("fs.upstream.outputs", "emb", None, "upstream.outputs.emb", None)
    assert "fs.upstream.outputs" not in topo.topics()
    assert topo.inputs == {}


def test_output_from_another_topology_or_input_needs_collect() -> None:
    topo = compile_yaml(node("a", "Scale"), "  echo: input.x\n")
    assert topo.nodes[OUTPUTS_NODE].bindings["echo"][0].topic == "fs.digits.inputs"
    assert topo.nodes["a"].emits_outputs == {}


def test_topology_inputs_are_derived_from_consumers() -> None:
    topo = compile_yaml(node("a", "Classify") + node("b", "Scale", "{x: input.pixels}"),
                        "  label: a.label\n  y: b.y\n")
    assert topo.inputs == {"x": VEC, "pixels": VEC}


def test_declared_inputs_win_over_derived_ones() -> None:
    head = "inputs:\n  x: {datatype: FP32, shape: [8, 4], allow_nan: false}\n"
    topo = compile_yaml(node("a", "Scale"), "  out: a.y\n", head=head)
    assert topo.inputs == {"x": Port("FP32", [8, 4], allow_nan=False)}
    assert topo.nodes["a"].bindings["x"][0].port == Port("FP32", [8, 4], allow_nan=False)


def test_max_batch_and_replicas() -> None:
    topo = compile_yaml(node("a", "Scale") + node("b", "Classify", "{x: a.y}", more="max_batch: 7\nreplicas: 3"),
                        "  out: b.label\n")
    assert topo.nodes["a"].max_batch == type(topo.nodes["a"].component).max_batch == 32
    assert topo.nodes["a"].replicas == 1
    assert topo.nodes["b"].max_batch == 7
    assert topo.nodes["b"].replicas == 3
    assert type(topo.nodes["b"].component).__name__ == "Classify"


def test_spec_defaults_and_metadata() -> None:
    topo = compile_yaml(node("a", "Scale"), "  out: a.y\n", head="version: '2'\n")
    assert topo.name == "digits" and topo.version == "2" and topo.source == "inline.yaml"
    assert topo.spec.partitions == 4 and topo.spec.deadline_ms == 10_000
