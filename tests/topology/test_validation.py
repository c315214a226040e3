"""Every way a topology file can be wrong: the error names the file and the node and says what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowserve.errors import TopologyError
from flowserve.topology import Topology, load_topology

C = "fs_test_components"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return path


def topology(nodes: str, *, outputs: str = "out: a.y", head: str = "") -> str:
    """A topology named ``t`` with the given (already indented) node block."""
    return f"name: t\n{head}nodes:\n{nodes}outputs:\n  {outputs}\n"


def node(node_id: str, component: str, inputs: str = "{x: input.x}", more: str = "") -> str:
    extra = "".join(f"\n    {line}" for line in more.splitlines() if line)
    return f"  {node_id}:\n    component: {C}:{component}\n    inputs: {inputs}{extra}\n"


def load_error(tmp_path: Path, text: str) -> tuple[TopologyError, str, Path]:
    path = write(tmp_path, text)
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    return info.value, str(info.value), path


def assert_points_at(error: TopologyError, path: Path, node_id: str) -> None:
    message = str(error)
    assert message.startswith(f"{path}: node '{node_id}': ")
    assert error.source == str(path)
    assert error.node == node_id


def test_unknown_component_module(tmp_path: Path) -> None:
    text = topology("  a:\n    component: no_such_module_xyz:Thing\n    inputs: {x: input.x}\n")
    error, message, path = load_error(tmp_path, text)
    assert_points_at(error, path, "a")
    assert "cannot import module 'no_such_module_xyz' for component 'no_such_module_xyz:Thing'" in message
    assert "check the module path" in message


def test_relative_component_module_is_a_topology_error(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology("  a:\n    component: .rel:Thing\n    inputs: {}\n"))
    assert_points_at(error, path, "a")
    assert "cannot import module '.rel'" in message


def test_component_without_class_part(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(f"  a:\n    component: {C}\n    inputs: {{x: input.x}}\n"))
    assert_points_at(error, path, "a")
    assert f"component '{C}' must look like 'package.module:ClassName'" in message


def test_unknown_class_in_module(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Nope")))
    assert_points_at(error, path, "a")
    assert f"module '{C}' has no 'Nope' (component '{C}:Nope'); check the class name" in message


@pytest.mark.parametrize("name", ["NotAComponent", "not_a_class"])
def test_class_that_is_not_a_component(tmp_path: Path, name: str) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", name)))
    assert_points_at(error, path, "a")
    assert f"'{C}:{name}' is not a flowserve Component subclass; name a class derived from Component" in message


def test_bad_params(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Scale", more="params: {factor: -1, bogus: 2}")))
    assert_points_at(error, path, "a")
    assert "bad params for Scale: factor: Input should be greater than 0; bogus: Extra inputs are not permitted" in (
        message
    )


def test_params_on_a_component_without_params(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Pair", "{a: input.x, b: input.w}",
                                                              more="params: {k: 1}"), outputs="out: a.y"))
    assert_points_at(error, path, "a")
    assert "bad params for Pair: k: Extra inputs are not permitted" in message


def test_unknown_input_port(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Scale", "{x: input.x, z: input.z}")))
    assert_points_at(error, path, "a")
    assert "unknown input port 'z' of Scale (its inputs: x)" in message


def test_unconnected_input_port(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Pair", "{a: input.x}")))
    assert_points_at(error, path, "a")
    assert "input port(s) b of Pair are not connected; add them under 'inputs'" in message


def test_reference_to_unknown_node(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Scale") + node("b", "Scale", "{x: ghost.y}"),
                                                         outputs="out: b.y"))
    assert_points_at(error, path, "b")
    assert "'ghost.y' refers to unknown node 'ghost' (nodes: a, b)" in message


def test_unknown_upstream_output_port(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Scale") + node("b", "Scale", "{x: a.q}"),
                                                         outputs="out: b.y"))
    assert_points_at(error, path, "b")
    assert "'a.q': node 'a' has no output port 'q' (its outputs: y)" in message


def test_unreadable_reference(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Scale", "{x: a.b.c.d}")))
    assert_points_at(error, path, "a")
    assert "cannot read reference 'a.b.c.d': use 'node.port', 'input.name' or 'topology.outputs.name'" in message


def test_output_referring_to_unknown_node(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Scale"), outputs="out: nobody.y"))
    assert_points_at(error, path, "outputs.out")
    assert "'nobody.y' refers to unknown node 'nobody'" in message


def test_datatype_mismatch_between_connected_ports(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Classify") + node("b", "Scale", "{x: a.label}"),
                                                         outputs="out: b.y"))
    assert_points_at(error, path, "b")
    assert "'a.label' cannot feed input port 'x': datatype INT64 does not match FP32" in message


def test_shape_mismatch_between_connected_ports(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Scale") + node("b", "Wide", "{x: a.y}"),
                                                         outputs="out: b.y"))
    assert_points_at(error, path, "b")
    assert "'a.y' cannot feed input port 'x': shape [-1, 4] does not fit [-1, 8]" in message


def test_declared_input_mismatching_its_consumer(tmp_path: Path) -> None:
    head = "inputs:\n  x: {datatype: FP32, shape: [-1, 4, 1]}\n"
    error, message, path = load_error(tmp_path, topology(node("a", "Scale"), head=head))
    assert_points_at(error, path, "a")
    assert "'input.x' cannot feed input port 'x': shape [-1, 4, 1] has rank 3, expected [-1, 4]" in message


def test_undeclared_topology_input(tmp_path: Path) -> None:
    head = "inputs:\n  x: {datatype: FP32, shape: [-1, 4]}\n"
    error, message, path = load_error(tmp_path, topology(node("a", "Scale", "{x: input.q}"), head=head))
    assert_points_at(error, path, "a")
    assert "'input.q' names topology input 'q', which is not declared under 'inputs' (declared: x)" in message


def test_derived_input_feeding_disagreeing_ports(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Scale") + node("b", "Wide"), outputs="out: b.y"))
    assert_points_at(error, path, "b")
    assert "topology input 'x' feeds ports that disagree" in message
    assert "(node 'a'); declare it under 'inputs'" in message


def test_duplicate_node_ids(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Scale") + node("b", "Scale") + node("a", "Wide")))
    assert_points_at(error, path, "a")
    assert "duplicate id 'a' (line 9, first at line 3); ids must be unique" in message


@pytest.mark.parametrize("node_id", ["inputs", "input", "outputs", "deadletter"])
def test_reserved_node_id(tmp_path: Path, node_id: str) -> None:
    error, message, path = load_error(tmp_path, topology(node(node_id, "Scale"), outputs=f"out: {node_id}.y"))
    assert error.source == str(path)
    assert message.startswith(f"{path}: nodes: ")
    assert f"node id '{node_id}' is reserved; rename the node" in message


def test_malformed_node_id(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("9lives", "Scale"), outputs="out: 9lives.y"))
    assert message.startswith(f"{path}: ")
    assert "node id '9lives' must match ^[A-Za-z][A-Za-z0-9_-]*$" in message


def test_misspelled_node_field(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Scale", more="replica: 2")))
    assert_points_at(error, path, "a")
    assert "nodes.a.replica: Extra inputs are not permitted" in message


def test_bad_join_window(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Scale", more="join: {window_ms: 0}")))
    assert_points_at(error, path, "a")
    assert "nodes.a.join.window_ms: Input should be greater than 0" in message


CYCLE = node("a", "Pair", "{a: input.x, b: b.y}") + node("b", "Scale", "{x: a.y}")


def test_disallowed_cycle(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(CYCLE, outputs="out: b.y"))
    assert_points_at(error, path, "a")
    assert "cycle a -> b -> a; remove it or set 'allow_cycles: true' (with 'max_revisits')" in message


def test_self_loop_is_a_cycle(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Pair", "{a: input.x, b: a.y}")))
    assert_points_at(error, path, "a")
    assert "cycle a -> a;" in message


def test_cycle_accepted_with_allow_cycles(tmp_path: Path) -> None:
    topo = load_topology(write(tmp_path, topology(CYCLE, outputs="out: b.y", head="allow_cycles: true\n")))
    assert isinstance(topo, Topology)
    assert list(topo.nodes) == ["a", "b"]
    assert topo.nodes["a"].needs_join
    assert topo.nodes["b"].emits_outputs == {"out": "y"}


def test_unreachable_node(tmp_path: Path) -> None:
    text = topology(node("a", "Scale") + "  c:\n    component: fs_test_components:Constant\n", outputs="out: a.y")
    error, message, path = load_error(tmp_path, text)
    assert_points_at(error, path, "c")
    assert "unreachable: none of its inputs lead back to the topology's inputs; connect it to 'input.<name>'" in (
        message
    )


def test_cycle_cut_off_from_the_inputs_is_unreachable(tmp_path: Path) -> None:
    nodes = node("a", "Scale") + node("b", "Scale", "{x: c.y}") + node("c", "Scale", "{x: b.y}")
    error, _, path = load_error(tmp_path, topology(nodes, head="allow_cycles: true\n"))
    assert_points_at(error, path, "b")


def test_alternatives_without_join_any(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Scale", "{x: [input.x, input.w]}")))
    assert_points_at(error, path, "a")
    assert "input port 'x' lists 2 alternative sources; that needs 'join: {type: any}'" in message


def test_alternatives_accepted_with_join_any(tmp_path: Path) -> None:
    topo = load_topology(write(tmp_path, topology(node("a", "Scale", "{x: [input.x, input.w]}",
                                                       more="join: {type: any}"))))
    assert [s.ref for s in topo.nodes["a"].bindings["x"]] == ["input.x", "input.w"]


def test_empty_alternatives(tmp_path: Path) -> None:
    error, message, path = load_error(tmp_path, topology(node("a", "Scale", "{x: []}", more="join: {type: any}")))
    assert_points_at(error, path, "a")
    assert "input port 'x' has an empty list of sources" in message


@pytest.mark.parametrize("text", ["name: t\nnodes: [\n", "name: t\n  nodes: {}\n bad", "a: b: c\n"])
def test_invalid_yaml(tmp_path: Path, text: str) -> None:
    error, message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}: not valid YAML: ")
    assert f'in "{path}", line ' in message
    assert error.node is None


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", ""])
def test_yaml_that_is_not_a_mapping(tmp_path: Path, text: str) -> None:
    _, message, path = load_error(tmp_path, text)
    assert message == f"{path}: a topology file must be a YAML mapping"


def test_unhashable_yaml_key_is_invalid_yaml(tmp_path: Path) -> None:
    _, message, path = load_error(tmp_path, "? [a, b]\n: 1\n")
    assert message.startswith(f"{path}: not valid YAML: ")
    assert "found unhashable key" in message


def test_missing_outputs(tmp_path: Path) -> None:
    _, message, path = load_error(tmp_path, f"name: t\nnodes:\n{node('a', 'Scale')}")
    assert message == f"{path}: outputs: Field required"


def test_empty_outputs(tmp_path: Path) -> None:
    _, message, path = load_error(tmp_path, topology(node("a", "Scale"), outputs="{}"))
    assert message == f"{path}: a topology needs at least one entry under 'outputs'"


def test_no_nodes(tmp_path: Path) -> None:
    _, message, path = load_error(tmp_path, "name: t\nnodes: {}\noutputs: {out: a.y}\n")
    assert message == f"{path}: nodes: Value error, a topology needs at least one node"


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(TopologyError, match=r"absent\.yaml: cannot read topology file: No such file"):
        load_topology(path)
