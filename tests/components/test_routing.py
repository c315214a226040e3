from __future__ import annotations

import numpy as np
import pytest

from flowserve.component import Port, Result
from flowserve.errors import ComponentError
from flowserve_components.routing import ConfidenceRouter


def _probs(tops: list[float]) -> np.ndarray:
    """One row per entry: class 0 gets ``top``, the rest share what is left."""
    rows = np.array([[t] + [(1 - t) / 9] * 9 for t in tops], dtype=np.float32)
    return rows.reshape(len(tops), 10)


def _route(sizes: list[int], tops: list[float], make_batch, threshold: float = 0.9) -> Result:
    x = np.arange(len(tops) * 64, dtype=np.float32).reshape(len(tops), 64)
    node = ConfidenceRouter.configure({"threshold": threshold}, node="router")
    assert isinstance(node, ConfidenceRouter)
    result = node.process(make_batch(sizes, probs=_probs(tops), x=x))
    assert isinstance(result, Result)
    assert result.errors == {}
    assert result.outputs["unsure_x"] is x
    return result


def test_ports() -> None:
    assert ConfidenceRouter.inputs == {"probs": Port("FP32", [-1, 10]), "x": Port("FP32", [-1, 64])}
    assert ConfidenceRouter.outputs == {
        "confident_probs": Port("FP32", [-1, 10]),
        "unsure_x": Port("FP32", [-1, 64]),
    }
    assert ConfidenceRouter.configure({}).params.threshold == 0.9  # type: ignore[attr-defined]


def test_routes_whole_requests(make_batch) -> None:
    # r0: sure; r1: one sure row and one unsure row -> unsure as a whole; r2: unsure; r3: sure, 3 rows.
    result = _route([1, 2, 1, 3], [0.95, 0.99, 0.5, 0.3, 0.91, 0.92, 0.999], make_batch)
    sure = [True, False, False, False, True, True, True]
    assert result.mask["confident_probs"].tolist() == sure
    assert result.mask["unsure_x"].tolist() == [not s for s in sure]
    assert result.mask["confident_probs"].dtype == bool


def test_threshold_is_inclusive(make_batch) -> None:
    result = _route([1, 1], [0.75, 0.7499], make_batch, threshold=0.75)
    assert result.mask["confident_probs"].tolist() == [True, False]


def test_nan_rows_are_unsure(make_batch) -> None:
    result = _route([2, 1], [0.99, float("nan"), 0.99], make_batch)
    assert result.mask["confident_probs"].tolist() == [False, False, True]


@pytest.mark.parametrize(
    ("sizes", "tops", "sure"),
    [
        ([0, 1, 0, 2, 0], [0.95, 0.2, 0.99], [True, False, False]),
        ([1, 0], [0.2], [False]),
        ([0], [], []),
        ([], [], []),
    ],
)
def test_empty_requests(sizes: list[int], tops: list[float], sure: list[bool], make_batch) -> None:
    result = _route(sizes, tops, make_batch)
    assert result.mask["confident_probs"].tolist() == sure
    assert result.mask["unsure_x"].tolist() == [not s for s in sure]


def test_threshold_bounds() -> None:
    with pytest.raises(ComponentError, match="threshold"):
        ConfidenceRouter.configure({"threshold": 1.5})
