"""The parity: section: the parity model node it adds, and checks that name the node and the fix."""

from __future__ import annotations

import pytest

from flowserve.errors import TopologyError
from flowserve.topology import load_topology_text, names

GOOD = """
name: par
partitions: 4
nodes:
  pre: {component: fs_testkit:AddOne, inputs: {x: input.x}}
  model:
    component: fs_testkit:Affine
    params: {mul: 3.0}
    inputs: {x: pre.x}
    parity: {k: 2, wait_ms: 15, replicas: 2, params: {weights: parity-k2}}
  post: {component: fs_testkit:AddOne, inputs: {x: model.x}}
outputs: {y: post.x}
"""


def test_a_protected_node_gets_a_parity_model_node_and_its_readers_drop_duplicates() -> None:
    t = load_topology_text(GOOD)
    parity = t.nodes["model-parity"]
    base = t.base
    assert parity.input_topics == (names.parity_query_topic(base, "model"),) == ("fs.par.model.parity",)
    assert parity.output_topics == {"x": "fs.par.model-parity.x"}
    assert parity.replicas == 2
    assert parity.component.params.mul == 3.0 and parity.component.params.weights == "parity-k2"
    assert t.group_id("model-parity") != t.group_id("model")  # its own consumer group
    assert t.nodes["post"].first_wins == frozenset({"fs.par.model.x"})
    assert t.nodes["model"].first_wins == frozenset()
    assert "fs.par.model.parity" in t.topics() and "fs.par.model-parity.x" in t.topics()
    assert t.lineage_topic in t.topics()
    # it stands in for the protected node's late outputs: not a side branch (no lowered priority)
    assert t.on_critical_path("model-parity")


def _error(text: str) -> TopologyError:
    with pytest.raises(TopologyError) as info:
        load_topology_text(text)
    return info.value


def test_k_below_two_names_the_node_and_the_fix() -> None:
    err = _error(GOOD.replace("k: 2,", "k: 1,"))
    assert err.node == "model"
    assert "at least 2" in str(err) and "replicas" in str(err)


def test_outputs_that_cannot_be_summed_are_refused() -> None:
    text = (GOOD.replace("component: fs_testkit:Affine\n    params: {mul: 3.0}", "component: fs_testkit:Count")
            .replace("params: {weights: parity-k2}", "params: {}")
            .replace("post: {component: fs_testkit:AddOne, inputs: {x: model.x}}",
                     "post: {component: fs_testkit:Affine, inputs: {x: pre.x}, triggers: [model.n]}"))
    err = _error(text)
    assert err.node == "model"
    assert "INT64" in str(err) and "cannot be summed" in str(err)


def test_a_parity_model_whose_ports_do_not_match_is_refused() -> None:
    err = _error(GOOD.replace("params: {weights: parity-k2}", "component: fs_testkit:Widen"))
    assert err.node == "model"
    assert "output port 'x'" in str(err) and "same ports" in str(err)


def test_a_node_fed_by_the_topology_inputs_cannot_host_the_encoder() -> None:
    err = _error(GOOD.replace("inputs: {x: pre.x}\n    parity", "inputs: {x: input.x}\n    parity"))
    assert err.node == "model" and "put a node" in str(err)


def test_fewer_partitions_than_k_is_refused() -> None:
    err = _error(GOOD.replace("partitions: 4", "partitions: 1"))
    assert err.node == "model" and "raise 'partitions'" in str(err)


def test_a_protected_node_must_not_write_the_outputs_itself() -> None:
    text = GOOD.replace("  post: {component: fs_testkit:AddOne, inputs: {x: model.x}}\n", "")
    text = text.replace("post.x", "model.x")
    err = _error(text)
    assert err.node == "model" and "add a node after it" in str(err)


def test_unknown_parity_keys_are_refused_with_the_node() -> None:
    err = _error(GOOD.replace("wait_ms: 15", "wait: 15"))
    assert err.node == "model" and "parity.wait" in str(err)


def test_the_concat_encoder_needs_inputs_it_can_tile() -> None:
    # AddOne's rows of 4 values are 2x2 images: two half-width tiles fit
    t = load_topology_text(GOOD.replace("wait_ms: 15,", "wait_ms: 15, encoder: concat,"))
    assert t.spec.nodes["model"].parity is not None and t.spec.nodes["model"].parity.encoder == "concat"
    err = _error(GOOD.replace("wait_ms: 15,", "wait_ms: 15, encoder: concat, image: [1, 3],"))
    assert err.node == "model"
    assert "concat encoder cannot encode" in str(err) and "whole 1x3 images" in str(err)
    err = _error(GOOD.replace("k: 2,", "k: 3,").replace("wait_ms: 15,", "wait_ms: 15, encoder: concat, image: [1, 4],"))
    assert "height must be a multiple of 2" in str(err)
