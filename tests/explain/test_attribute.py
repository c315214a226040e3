"""Explanations through the graph without a broker: integrated gradients' completeness end to end through the
digits pipeline's three stages, the KernelSHAP fallback for a chain that is not differentiable, the capability
check, and the explanation's JSON."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from flowserve.cli.explain import heat_map
from flowserve.errors import ComponentError, ErrorKind
from flowserve.explain import Chain, ExplainError, Explanation, explain, integrated_gradients, targets
from flowserve.explain.service import explanation_record, sampled
from flowserve.topology import load_topology, load_topology_text

pytest.importorskip("captum")
pytest.importorskip("flowserve_components")

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "topologies" / "digits.yaml"
EXPLAINED = """
name: NAME
nodes:
  pre:
    component: flowserve_components.digits:Normalize
    inputs: {pixels: input.pixels}
  model:
    component: flowserve_components.torch_stage:TorchClassifier
    params: {model: digits-mlp, threads: 1}
    inputs: {x: pre.x}
  post:
    component: flowserve_components.postprocess:POST
    inputs: {logits: model.logits}
outputs: {OUT}
explain: {sample: 1.0, method: METHOD}
"""


def _topology(post: str = "ArgMax", outputs: str = "{label: post.label, probs: post.probs}", method: str = "auto"):
    return load_topology_text(EXPLAINED.replace("NAME", "explained").replace("POST", post)
                              .replace("{OUT}", outputs).replace("METHOD", method))


@pytest.fixture(scope="module")
def digits_chain() -> Iterator[Chain]:
    (target,) = targets(_topology())
    chain = Chain(_topology(), target)
    chain.setup()
    yield chain
    chain.close()


def test_integrated_gradients_are_complete_through_the_three_digit_stages(digits_chain: Chain) -> None:
    from flowserve_components.digits import sample

    assert [n.id for n in digits_chain.nodes] == ["pre", "model", "post"]
    assert digits_chain.inputs == ["pixels"] and digits_chain.differentiable()
    requests, _ = sample(20, seed=3)
    errors = []
    for i, request in enumerate(requests):
        e = explain(digits_chain, request, request_id=f"r{i}")
        assert e.method == "integrated_gradients" and e.output == "probs"
        assert e.attributions["pixels"].shape == (1, 64)
        # the class explained is the one the pipeline answers: the arg-max of its probabilities
        probs = digits_chain.numpy_fn({"pixels": request["pixels"]})
        assert e.classes == [int(probs.argmax(axis=1)[0])]
        assert e.f_x[0] == pytest.approx(float(probs.max()), rel=1e-5)
        gap = e.f_x[0] - e.f_baseline[0]
        assert abs(gap) > 0.05  # a black image is not read as this digit: the relative error means something
        errors.append(abs(e.sums[0] - gap) / abs(gap))
    print(f"completeness: largest relative error {max(errors) * 100:.3f}% over {len(errors)} requests")
    assert max(errors) < 0.01


def test_a_request_of_several_rows_is_explained_row_by_row(digits_chain: Chain) -> None:
    from flowserve_components.digits import sample

    requests, _ = sample(3, seed=4)
    pixels = np.concatenate([r["pixels"] for r in requests])
    e = integrated_gradients(digits_chain, {"pixels": pixels}, steps=64)
    assert e.attributions["pixels"].shape == (3, 64) and len(e.classes) == 3
    assert all(abs(d) < 0.01 * abs(fx - fb) for d, fx, fb in zip(e.delta, e.f_x, e.f_baseline, strict=True))
    assert Explanation.from_json(e.to_json()).classes == e.classes
    again = Explanation.from_json(e.to_json())
    np.testing.assert_allclose(again.attributions["pixels"], e.attributions["pixels"], rtol=1e-5, atol=1e-9)


def test_a_chain_with_a_component_without_torch_forward_falls_back_to_kernel_shap() -> None:
    from flowserve_components.digits import sample

    topology = _topology("TopK", "{indices: post.indices, scores: post.scores}")
    (target,) = targets(topology)
    assert target.name == "scores"  # the first floating-point output
    chain = Chain(topology, target)
    chain.setup()
    try:
        assert not chain.differentiable()
        requests, _ = sample(1, seed=5)
        e = explain(chain, requests[0], request_id="r")
        assert e.method == "kernel_shap" and e.classes == [0]  # top-k scores come best first
        assert e.attributions["pixels"].shape == (1, 64)
        # KernelSHAP's fit keeps efficiency: the attributions add up to the score's change from the baseline
        assert e.sums[0] == pytest.approx(e.f_x[0] - e.f_baseline[0], rel=0.01)
    finally:
        chain.close()


def test_integrated_gradients_by_name_requires_every_node_to_be_differentiable() -> None:
    topology = _topology("TopK", "{indices: post.indices, scores: post.scores}", method="integrated_gradients")
    (target,) = targets(topology)
    with pytest.raises(ComponentError) as err:
        Chain(topology, target)
    assert err.value.kind == ErrorKind.INVALID_TOPOLOGY
    assert "node 'post'" in str(err.value) and "torch_forward" in str(err.value)


def test_an_output_that_is_not_the_topologys_is_refused() -> None:
    topology = load_topology_text(EXPLAINED.replace("NAME", "x").replace("POST", "ArgMax")
                                  .replace("{OUT}", "{probs: post.probs}").replace("METHOD", "auto")
                                  .replace("sample: 1.0", "output: nope"))
    with pytest.raises(ExplainError, match="'nope' is not an output"):
        targets(topology)


def test_the_shipped_digits_topology_has_no_explain_section_and_no_explanations_topic() -> None:
    topology = load_topology(DIGITS)
    assert targets(topology) == [] and not topology.explained
    assert topology.explanations_topic not in topology.topics()
    assert _topology().explanations_topic in _topology().topics()


def test_sampling_is_a_stable_share_of_request_ids() -> None:
    ids = [f"req-{i}" for i in range(4000)]
    picked = [rid for rid in ids if sampled(rid, 0.01)]
    assert 20 <= len(picked) <= 60  # about 1% of 4000
    assert picked == [rid for rid in ids if sampled(rid, 0.01)]  # the same ids every time, in every process
    assert all(sampled(rid, 1.0) for rid in ids[:10]) and not any(sampled(rid, 0.0) for rid in ids[:10])
    assert set(picked) <= {rid for rid in ids if sampled(rid, 0.05)}  # a larger share keeps the smaller's


def test_an_explanation_that_fails_is_recorded_with_its_reason(digits_chain: Chain) -> None:
    import json

    body = json.loads(explanation_record(digits_chain, "r-bad", {"other": np.zeros((1, 64), np.float32)}))
    assert body["request_id"] == "r-bad" and body["kind"] == "invalid_input" and "no input 'pixels'" in body["error"]
    body = json.loads(explanation_record(digits_chain, "r-shape", {"pixels": np.zeros((1, 3), np.float32)}))
    assert body["kind"] == "component_failure" and "attributions" not in body  # torch's own error, kept going


def test_the_text_heat_map_marks_the_strongest_pixels() -> None:
    image = np.zeros(64)
    image[9], image[63] = 1.0, -0.5
    lines = heat_map(image)
    assert len(lines) == 8 and all(len(line) == 16 for line in lines)
    # half the peak magnitude, whatever its sign: the middle of the shades
    assert lines[1][2:4] == "@@" and lines[7][14:16] == "++" and lines[0] == " " * 16
    assert heat_map(np.array([0.1, -2.0, 0.3])) == ["[1] -2, [2] +0.3, [0] +0.1"]


def test_a_fused_chain_is_explained_through_its_members(tmp_path) -> None:  # noqa: ANN001
    from flowserve_components.digits import sample

    path = tmp_path / "fused.yaml"
    path.write_text((REPO / "topologies" / "digits-fused.yaml").read_text() + "explain: {sample: 0.0}\n")
    topology = load_topology(path)
    assert list(topology.nodes) == ["classify"]  # one worker runs the three stages
    (target,) = targets(topology)
    chain = Chain(topology, target)
    assert [n.id for n in chain.nodes] == ["pre", "model", "post"] and chain.differentiable()
    chain.setup()
    try:
        (request,), _ = sample(1, seed=6)
        e = explain(chain, request)
        assert e.method == "integrated_gradients"
        assert abs(e.delta[0]) <= 0.01 * abs(e.f_x[0] - e.f_baseline[0])
    finally:
        chain.close()
