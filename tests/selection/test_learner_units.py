"""The learner's pieces that need no broker: which topics it joins, how it reads the state topic back."""

from __future__ import annotations

import json

import pytest

from flowserve.component import Component
from flowserve.errors import ComponentError, ErrorKind, TopologyError
from flowserve.kafka.settings import KafkaSettings
from flowserve.selection import LearnsFromFeedback, selection_hooks
from flowserve.selection.learner import Restored, answer_topics, read_state_value
from flowserve.topology.capture import topic_configs
from flowserve.topology.graph import load_topology_text

SELECT = """
name: sel
nodes:
  select:
    component: flowserve_components.selection:Exp3Selector
    params: {answers: [a.label, b.label]}
    inputs: {x: input.x}
  a: {component: selection_kit:Answer, params: {value: 1}, inputs: {x: select.arm0}}
  b: {component: selection_kit:Answer, params: {value: 2}, inputs: {x: select.arm1}}
"""
MERGED = SELECT + """  merge:
    component: flowserve.builtin:Identity
    params: {ports: {label: {datatype: INT64, shape: [-1]}}}
    join: {type: any}
    inputs: {label: [a.label, b.label]}
outputs:
  label: merge.label
"""


def test_a_learning_node_gets_decision_and_compacted_state_topics_and_the_feedback_topic_exists() -> None:
    t = load_topology_text(MERGED)
    assert {"fs.sel.feedback", "fs.sel.select.decisions", "fs.sel.select.state"} <= set(t.topics())
    assert topic_configs(t)["fs.sel.select.state"] == {"cleanup.policy": "compact"}
    assert answer_topics(t, t.nodes["select"], t.nodes["select"].component) == {
        "fs.sel.a.label": "a.label", "fs.sel.b.label": "b.label"}


def test_an_answer_without_a_topic_is_refused_saying_how_to_give_it_one() -> None:
    t = load_topology_text(SELECT + "outputs:\n  label: a.label\n")
    with pytest.raises(TopologyError, match=r"capture: \{ports: \[a.label\]\}"):
        answer_topics(t, t.nodes["select"], t.nodes["select"].component)
    captured = load_topology_text(SELECT + "outputs:\n  label: a.label\ncapture: {ports: [a.label, b.label]}\n")
    assert set(answer_topics(captured, captured.nodes["select"], captured.nodes["select"].component)) == {
        "fs.sel.a.label", "fs.sel.b.label"}


def test_the_state_topic_reads_back_the_last_value_per_key_and_skips_junk() -> None:
    restored = Restored()
    for key, value in [(b"context/ann", {"log_weights": [0.0, -1.0]}), (b"context/ann", {"log_weights": [0.0, -2.0]}),
                       (b"position", {"watermark": {"0": 5}, "applied_above": {"0": [7]}}),
                       (b"context/bob", "not an object"), (b"other", {"x": 1})]:
        read_state_value(key, json.dumps(value).encode(), restored)
    read_state_value(b"context/eve", b"{broken", restored)
    read_state_value(None, b"{}", restored)
    assert restored.states == {"ann": {"log_weights": [0.0, -2.0]}}
    assert restored.watermark == {0: 5} and restored.applied_above == {0: [7]}


class Mute(Component):
    """Declares that it learns from feedback but implements none of it."""

    learns = True


def test_a_learning_node_whose_component_cannot_learn_is_refused_when_its_hooks_are_built() -> None:
    t = load_topology_text(MERGED)
    assert isinstance(t.nodes["select"].component, LearnsFromFeedback)
    factory = selection_hooks(KafkaSettings(bootstrap="127.0.0.1:1"))  # refused before any connection
    with pytest.raises(ComponentError, match="node 'm': Mute cannot learn from feedback .* it lacks "
                                             "drain_decisions, answer_refs, learn, learned_state, "
                                             "restore_learned") as info:
        factory(t, t.nodes["select"], Mute(node="m"))
    assert info.value.kind == ErrorKind.INVALID_TOPOLOGY
