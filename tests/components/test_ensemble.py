from __future__ import annotations

import numpy as np
import pytest

from flowserve.component import Batch, Port
from flowserve.errors import ComponentError
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
    assert node.outputs == {"probs": Port("FP32", [-1, 10]), "missing": Port("BYTES", [-1])}
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
    assert out["missing"].tolist() == [b"", b""]


def _one_hot(*classes: int) -> np.ndarray:
    x = np.zeros((len(classes), 10), dtype=np.float32)
    x[np.arange(len(classes)), classes] = 1.0
    return x


def test_average_over_the_members_present_names_the_missing(configure) -> None:
    node = configure(Average, {"members": ["mlp", "cnn", "tree"]}, node="avg")
    assert set(node.inputs) == {"mlp", "cnn", "tree"}
    mlp, cnn, tree = _one_hot(1, 2, 3), _one_hot(1, 4, 3), _one_hot(5, 6, 7)
    present = {"mlp": np.array([True, True, False]), "cnn": np.array([True, False, False]),
               "tree": np.array([False, True, True])}
    batch = Batch({"mlp": mlp, "cnn": cnn * present["cnn"][:, None], "tree": tree * present["tree"][:, None]},
                  [2, 1], ["r0", "r1"], masks=present)
    out = node.process(batch)
    expected = np.zeros((3, 10), dtype=np.float32)
    expected[0, 1] = 1.0  # mlp and cnn agree; tree absent
    expected[1, 2] = expected[1, 6] = 0.5  # mlp and tree; cnn absent
    expected[2, 7] = 1.0  # tree alone
    np.testing.assert_allclose(out["probs"], expected)
    assert out["missing"].tolist() == [b"tree", b"cnn", b"mlp,cnn"]


def test_average_members_must_be_distinct(configure) -> None:
    with pytest.raises(ComponentError, match="distinct"):
        Average.configure({"members": ["a", "a"]}, node="avg")
