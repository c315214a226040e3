"""Property tests of the topology loader: any document gives a Topology or a FlowserveError that says what
is wrong, never another exception."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flowserve.errors import FlowserveError
from flowserve.topology.graph import load_topology_text

PROPERTIES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)



_NODE = st.fixed_dictionaries({
    "component": st.one_of(st.sampled_from(["flowserve.builtin:Identity", "flowserve.builtin:Fail",
                                            "no.such:Thing", "flowserve.builtin"]), st.text(max_size=10)),
    "inputs": st.one_of(st.dictionaries(st.sampled_from(["x", "y", "t_fp32"]),
                                        st.sampled_from(["input.x", "a.x", "b.y", "input.t_fp32", "x"]), max_size=2),
                        json_values),
}, optional={"params": json_values, "replicas": json_values, "join": json_values, "triggers": json_values,
             "max_batch": json_values, "batching": json_values})


@st.composite
def topology_docs(draw: st.DrawFn) -> Any:
    doc: dict[str, Any] = {
        "name": draw(st.one_of(st.just("t"), st.text(max_size=6))),
        "nodes": draw(st.one_of(st.dictionaries(st.sampled_from(["a", "b", "input", "c d"]), _NODE, max_size=3),
                                json_values)),
        "outputs": draw(st.one_of(st.dictionaries(st.sampled_from(["y", "z"]),
                                                  st.sampled_from(["a.x", "b.x", "a.nope", "zz"]), max_size=2),
                                  json_values)),
    }
    for key in ("partitions", "fuse", "capture", "allow_cycles", "inputs", "deadline_ms"):
        if draw(st.booleans()):
            doc[key] = draw(json_values)
    return doc


@PROPERTIES
@given(topology_docs())
# json.dumps writes U+10000 as two escapes, which YAML reads as two lone surrogates (found by this test)
@example({"name": "t", "nodes": {}, "outputs": {}, "fuse": {"\U00010000": []}})
def test_any_topology_document_loads_or_is_a_flowserve_error(doc: Any) -> None:
    with contextlib.suppress(FlowserveError):
        load_topology_text(json.dumps(doc))  # JSON is YAML


@PROPERTIES
@given(st.text(max_size=200))
def test_any_text_loads_as_a_topology_or_is_a_flowserve_error(text: str) -> None:
    with contextlib.suppress(FlowserveError):
        load_topology_text(text)
