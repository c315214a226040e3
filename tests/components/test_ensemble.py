from __future__ import annotations

import numpy as np

from flowserve.component import Port
from flowserve_components.ensemble import Average, Softmax
from flowserve_components.postprocess import softmax


def test_softmax_component(configure, make_batch) -> None:
    node = configure(Softmax, {}, node="p")
    assert node.inputs == {"logits": Port("FP32", [-1, 10])}
    assert node.outputs == {"probs": Port("FP32", [-1, 10])}
    logits = np.random.default_rng(0).normal(size=(4, 10)).astype(np.float32)
    out = node.process(make_batch([3, 1], logits=logits))
    assert out["probs"].dtype == np.float32
    np.testing.assert_allclose(out["probs"], softmax(logits))


def test_average(configure, make_batch) -> None:
    node = configure(Average, {}, node="avg")
    assert set(node.inputs) == {"a", "b"}
    assert node.outputs == {"probs": Port("FP32", [-1, 10])}
    a = np.zeros((2, 10), dtype=np.float32)
    b = np.zeros((2, 10), dtype=np.float32)
    a[:, 1] = 1.0
    b[0, 1] = 1.0
    b[1, 4] = 1.0
    out = node.process(make_batch([1, 1], a=a, b=b))
    assert out["probs"].dtype == np.float32
    expected = np.zeros((2, 10), dtype=np.float32)
    expected[0, 1] = 1.0
    expected[1, 1] = expected[1, 4] = 0.5
    np.testing.assert_array_equal(out["probs"], expected)
