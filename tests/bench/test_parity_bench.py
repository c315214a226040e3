"""The parity bench's deployments: equal resources per contender, on the digits model or an emulated stage."""

from __future__ import annotations

import asyncio

import pytest

from flowserve.errors import FlowserveError
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import load_topology_text
from flowserve_bench.parity import parity_bench, protected_node, topology_text


@pytest.mark.parametrize("stage", ["digits", "emulated"])
def test_the_contenders_get_equal_resources(stage: str) -> None:
    protected = protected_node(stage)
    workers = {}
    for contender in ("none", "replicas", "parity"):
        t = load_topology_text(topology_text(f"p{contender}", contender, 2, 2, 50.0, "sum", stage))
        assert (f"{protected}-parity" in t.nodes) == (contender == "parity")
        workers[contender] = t.nodes[protected].replicas + (
            t.nodes[f"{protected}-parity"].replicas if contender == "parity" else 0)
    assert workers == {"none": 2, "replicas": 3, "parity": 3}


def test_the_concat_encoder_is_offered_on_the_digits_model_only() -> None:
    t = load_topology_text(topology_text("pc", "parity", 2, 2, 50.0, "concat", "digits"))
    assert t.spec.nodes["model"].parity is not None and t.spec.nodes["model"].parity.encoder == "concat"
    assert t.nodes["model-parity"].component.params.parity_encoder == "concat"
    with pytest.raises(FlowserveError, match="--encoder sum"):
        asyncio.run(parity_bench(KafkaSettings(), encoder="concat", stage="emulated"))
