from __future__ import annotations

import numpy as np
import pytest

from flowserve.component import Port
from flowserve.errors import ComponentError
from flowserve_components.postprocess import ArgMax, TopK, softmax


def test_softmax_is_stable_and_normalised() -> None:
    logits = np.array([[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0], [-1e4, -1e4 + 1, -1e4]], dtype=np.float32)
    probs = softmax(logits)
    assert probs.dtype == np.float32
    assert np.isfinite(probs).all()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(probs[0], [1.0, 0.0, 0.0])
    np.testing.assert_allclose(probs[1], [1 / 3] * 3, rtol=1e-6)
    np.testing.assert_allclose(probs[2], softmax(np.array([[0.0, 1.0, 0.0]], dtype=np.float32))[0], rtol=1e-5)


def test_argmax_labels_and_probs(configure, make_batch) -> None:
    node = configure(ArgMax, {}, node="post")
    assert node.inputs == {"logits": Port("FP32", [-1, 10])}
    assert node.outputs == {"label": Port("INT64", [-1]), "probs": Port("FP32", [-1, 10])}
    logits = np.zeros((3, 10), dtype=np.float32)
    logits[0, 7] = 5.0
    logits[1, 2] = 1.0
    logits[2, 9] = 800.0
    out = node.process(make_batch([2, 1], logits=logits))
    assert out["label"].dtype == np.int64
    assert out["label"].tolist() == [7, 2, 9]
    np.testing.assert_allclose(out["probs"], softmax(logits))
    for name, port in node.outputs.items():
        port.check(name, out[name])


def test_argmax_on_probabilities_passes_them_on(configure, make_batch) -> None:
    node = configure(ArgMax, {"input": "probs"}, node="final")
    assert node.inputs == {"probs": Port("FP32", [-1, 10])}
    assert ArgMax.inputs == {"logits": Port("FP32", [-1, 10])}  # the class declaration is untouched
    probs = np.full((2, 10), 0.05, dtype=np.float32)
    probs[0, 3] = 0.55
    probs[1, 0] = 0.55
    out = node.process(make_batch([1, 1], probs=probs))
    assert out["label"].tolist() == [3, 0]
    assert out["probs"] is probs


def test_argmax_rejects_unknown_input() -> None:
    with pytest.raises(ComponentError, match="bad params for ArgMax: input"):
        ArgMax.configure({"input": "scores"})


def test_topk(configure, make_batch) -> None:
    node = configure(TopK, {"k": 3}, node="top")
    assert node.outputs == {"indices": Port("INT64", [-1, 3]), "scores": Port("FP32", [-1, 3])}
    assert TopK.outputs["indices"].shape == (-1, -1)
    logits = np.array([[0, 5, 1, 3, 0, 0, 0, 0, 0, 2], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]], dtype=np.float32)
    out = node.process(make_batch([2], logits=logits))
    assert out["indices"].dtype == np.int64 and out["scores"].dtype == np.float32
    assert out["indices"].tolist() == [[1, 3, 9], [0, 1, 2]]  # ties go to the lower index
    probs = softmax(logits)
    np.testing.assert_allclose(out["scores"], [probs[0, [1, 3, 9]], probs[1, [0, 1, 2]]])
    assert (np.diff(out["scores"], axis=1) <= 0).all()
    for name, port in node.outputs.items():
        port.check(name, out[name])


@pytest.mark.parametrize("k", [0, 11])
def test_topk_k_must_fit_ten_classes(k: int) -> None:
    with pytest.raises(ComponentError, match="bad params for TopK: k"):
        TopK.configure({"k": k})
