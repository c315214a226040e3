"""Which nodes are on the critical path (their outputs reach the topology's outputs) and which are side branches."""

from __future__ import annotations

from test_graph import DIAMOND, compile_yaml, node

from flowserve.topology.graph import OUTPUTS_NODE


def test_side_branches_are_the_nodes_whose_outputs_reach_no_output() -> None:
    nodes = DIAMOND + node("side", "Scale", "{x: src.y}") + node("side2", "Scale", "{x: side.y}")
    topo = compile_yaml(nodes, "  y: merge.y\n")
    assert topo.critical_path == {"src", "left", "right", "merge"}
    assert {n for n in topo.nodes if not topo.on_critical_path(n)} == {"side", "side2"}


def test_a_trigger_puts_its_source_on_the_critical_path() -> None:
    nodes = (node("src", "Scale") + node("gate", "Scale", "{x: src.y}")
             + node("out", "Scale", "{x: src.y}", more="triggers: [gate.y]"))
    topo = compile_yaml(nodes, "  y: out.y\n")
    assert topo.critical_path == {"src", "gate", "out"}


def test_outputs_from_several_nodes_keep_their_producers_and_collect_on_the_critical_path() -> None:
    nodes = node("a", "Scale") + node("b", "Scale") + node("c", "Scale", "{x: a.y}")
    topo = compile_yaml(nodes, "  ya: a.y\n  yb: b.y\n")
    assert topo.critical_path == {"a", "b", OUTPUTS_NODE}
    assert not topo.on_critical_path("c")


def test_the_bundled_drift_detector_is_a_side_branch() -> None:
    from pathlib import Path

    from flowserve.topology.graph import load_topology

    topo = load_topology(Path(__file__).parents[2] / "topologies" / "digits-drift.yaml")
    assert not topo.on_critical_path("input_drift")
    assert all(topo.on_critical_path(n) for n in ("pre", "model", "post"))
