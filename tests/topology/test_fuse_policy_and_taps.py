"""A node's ``fuse:`` policy (``auto`` or ``never``) and the capture taps of a fused chain's inner edges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flowserve.component import Batch, Result
from flowserve.errors import TopologyError
from flowserve.topology import load_topology, load_topology_text
from flowserve.topology.fuse import Chain

K = "fs_testkit"
# a doubles, b splits at 10 (lo: below, hi: the rest), c adds 1 to what b sends low
BASE = f"""
name: t
nodes:
  a: {{component: {K}:Affine, params: {{mul: 2}}, inputs: {{x: input.x}}}}
  b: {{component: {K}:Split, params: {{value: 10}}, inputs: {{x: a.x}}}}
  c: {{component: {K}:Affine, params: {{add: 1}}, inputs: {{x: b.lo}}}}
outputs: {{y: c.x}}
"""


def load(tmp_path: Path, text: str):  # noqa: ANN201 - a Topology
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return load_topology(path), path


@pytest.mark.parametrize("value", ["nevr", "true", "1", "'no'"])
def test_a_bad_fuse_policy_names_the_node_and_the_choices(tmp_path: Path, value: str) -> None:
    with pytest.raises(TopologyError) as info:
        load(tmp_path, BASE.replace("inputs: {x: a.x}}", f"inputs: {{x: a.x}}, fuse: {value}}}"))
    message = str(info.value)
    assert info.value.node == "b"
    assert "nodes.b.fuse: " in message and "is not a fusion policy: write 'never'" in message
    assert "or 'auto' (the default" in message


def test_fuse_policy_defaults_to_auto(tmp_path: Path) -> None:
    topology, _ = load(tmp_path, BASE.replace("inputs: {x: a.x}}", "inputs: {x: a.x}, fuse: never}"))
    assert topology.spec.nodes["b"].fuse == "never"
    assert topology.spec.nodes["a"].fuse == "auto"


def test_a_hand_written_chain_may_not_take_a_never_node(tmp_path: Path) -> None:
    text = BASE.replace("inputs: {x: a.x}}", "inputs: {x: a.x}, fuse: never}") + "fuse: {f: [a, b, c]}\n"
    with pytest.raises(TopologyError) as info:
        load(tmp_path, text)
    assert info.value.node == "b"
    assert "fuse.f: node 'b' says 'fuse: never'; take it out of the chain or drop its 'fuse: never'" \
        in str(info.value)


# --- capture taps ------------------------------------------------------------------------------------------


def test_without_capture_a_chain_taps_nothing() -> None:
    topology = load_topology_text(BASE + "fuse: {f: [a, b, c]}\n")
    chain = topology.nodes["f"].component
    assert isinstance(chain, Chain)
    assert chain.params.taps == {} and set(chain.outputs) == {"x"}
    assert topology.nodes["f"].capture_topics == {}


def test_capture_on_taps_every_inner_edge_to_a_side_topic() -> None:
    topology = load_topology_text(BASE + "capture: {sample: 1.0, lineage: false}\nfuse: {f: [a, b, c]}\n")
    chain = topology.nodes["f"].component
    assert isinstance(chain, Chain)
    assert chain.params.taps == {"a": ["x"], "b": ["lo"]}
    assert set(chain.outputs) == {"x", "a.x", "b.lo"}
    assert topology.nodes["f"].capture_topics == {"a.x": "fs.t.f.a.x", "b.lo": "fs.t.f.b.lo"}
    assert {"fs.t.f.a.x", "fs.t.f.b.lo"} <= set(topology.topics())
    assert "fs.t.a.x" not in topology.topics()  # the edge itself is not on Kafka


def test_capture_off_for_the_chain_taps_nothing() -> None:
    topology = load_topology_text(BASE + "capture: {nodes: {f: {enabled: false}}}\nfuse: {f: [a, b, c]}\n")
    assert topology.nodes["f"].component.params.taps == {}  # type: ignore[attr-defined]
    assert topology.nodes["f"].capture_topics == {}


def test_the_taps_carry_what_the_members_passed_on_masked_where_nothing_was() -> None:
    topology = load_topology_text(BASE + "capture: {sample: 1.0}\nfuse: {f: [a, b, c]}\n")
    chain = topology.nodes["f"].component
    firsts = [[1.0, 7.0], [2.0], [3.0, 4.0]]  # doubled: [2, 14], [4], [6, 8]; 14 goes high, so away from c
    rows = np.array([[v, 1.0, 2.0, 3.0] for r in firsts for v in r], dtype=np.float32)
    result = chain.process(Batch({"x": rows}, [2, 1, 2], ["r0", "r1", "r2"]))
    assert isinstance(result, Result) and result.errors == {}
    np.testing.assert_array_equal(result.outputs["a.x"], rows * 2)  # every row reached b: no mask
    assert "a.x" not in result.mask
    # b.lo: the rows b sent low, which c read (the row that went high is masked, as b's own mask says)
    np.testing.assert_array_equal(result.mask["b.lo"], [True, False, True, True, True])
    np.testing.assert_array_equal(result.outputs["b.lo"][result.mask["b.lo"]], (rows * 2)[[0, 2, 3, 4]])
    np.testing.assert_array_equal(result.outputs["x"][result.mask["x"]][:, 0], [3.0, 5.0, 7.0, 9.0])


def test_a_failed_request_keeps_its_error_beside_the_taps() -> None:
    """Capture writes nothing for a request that carries an error (as a worker writes no edge record for it),
    so the tap of the member that failed it may hold its rows."""
    text = BASE.replace(f"{K}:Split, params: {{value: 10}}", f"{K}:Reject, params: {{value: 4}}").replace(
        "b.lo", "b.x")
    topology = load_topology_text(text + "capture: {sample: 1.0}\nfuse: {f: [a, b, c]}\n")
    chain = topology.nodes["f"].component
    rows = np.array([[v, 0, 0, 0] for v in (1.0, 2.0, 3.0)], dtype=np.float32)  # 2 doubles to 4: b rejects it
    result = chain.process(Batch({"x": rows}, [1, 1, 1], ["r0", "r1", "r2"]))
    assert isinstance(result, Result) and result.errors == {1: "node 'b': rejects 4"}
    np.testing.assert_array_equal(result.outputs["a.x"][:, 0], [2.0, 4.0, 6.0])  # a saw every request
    np.testing.assert_array_equal(result.outputs["b.x"][[0, 2], 0], [2.0, 6.0])
    np.testing.assert_array_equal(result.mask["x"], [True, False, True])  # c saw only the other two
    np.testing.assert_array_equal(result.outputs["x"][[0, 2], 0], [3.0, 7.0])
