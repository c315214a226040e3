"""TorchClassifier's continual-learning capability: fine-tune from the live weights, load versions safely."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flowserve.errors import ComponentError, FlowserveError  # noqa: E402
from flowserve_components.digits import PIXEL_MAX, sample  # noqa: E402
from flowserve_components.torch_stage import TorchClassifier  # noqa: E402


def _component() -> TorchClassifier:
    c = TorchClassifier.configure({"model": "digits-mlp"}, node="model")
    assert isinstance(c, TorchClassifier)
    c.setup()
    return c


def _data(n: int, seed: int, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    requests, labels = sample(n, seed=seed, split=split, shift="brightness", amount=6.0)  # type: ignore[arg-type]
    return np.concatenate([r["pixels"] for r in requests]) / np.float32(PIXEL_MAX), np.array(labels)


def test_retrain_fine_tunes_and_the_new_weights_load(cache: Path) -> None:
    c = _component()
    x, y = _data(300, seed=1)
    before = c.score({"logits": _logits(c, x)}, {"label": y}).mean()
    result = c.retrain({"x": x}, {"label": y})
    assert result.metrics["examples"] == 300 and result.metrics["fit_accuracy_after"] > before
    live_hash = c.weights_hash
    assert c.score({"logits": _logits(c, x)}, {"label": y}).mean() == before  # retrain left the live weights alone
    c.load_weights(result.weights, "v1")
    assert c.model_version == "v1" and c.weights_hash != live_hash
    held_x, held_y = _data(200, seed=2, split="test")
    assert c.score({"logits": _logits(c, held_x)}, {"label": held_y}).mean() > 0.85


def _logits(c: TorchClassifier, x: np.ndarray) -> np.ndarray:
    from flowserve.component import Batch

    return c.process(Batch({"x": x.astype(np.float32)}, [len(x)], ["r"]))["logits"]


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo pwned",))


def test_load_weights_refuses_anything_but_tensors(cache: Path) -> None:
    c = _component()
    buffer = io.BytesIO()
    torch.save({"0.weight": _Boom()}, buffer, pickle_module=pickle)
    with pytest.raises(ComponentError, match="only plain tensors"):
        c.load_weights(buffer.getvalue(), "v9")
    with pytest.raises(ComponentError, match="do not fit"):
        other = io.BytesIO()
        torch.save({"weight": torch.zeros(2)}, other)
        c.load_weights(other.getvalue(), "v9")
    assert c.model_version is None


def test_retrain_needs_labels(cache: Path) -> None:
    c = _component()
    with pytest.raises(ComponentError, match="learns from 'label'"):
        c.retrain({"x": np.zeros((2, 64), np.float32)}, {"a": np.zeros(2), "b": np.zeros(2)})


def test_learn_says_when_the_node_input_is_not_captured() -> None:
    from flowserve.learning.learn import check_captured
    from flowserve.topology import load_topology

    repo = Path(__file__).resolve().parents[2]
    with pytest.raises(FlowserveError, match=r"input port 'x' \(pre.x, topic fs.digits.pre.x\) is not captured"):
        check_captured(load_topology(repo / "topologies" / "digits.yaml"), "model")
    check_captured(load_topology(repo / "topologies" / "digits-drift.yaml"), "model")  # capture: on
