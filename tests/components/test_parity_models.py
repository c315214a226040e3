"""Parity models of the digits zoo: trained beside the base weights, loaded weights-only, accurate when decoding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flowserve.component import Batch


def test_parity_training_reaches_the_degraded_mode_accuracy_and_saves_beside_the_base(
        empty_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flowserve_components import models
    from flowserve_components.parity import parity_path, train_parity

    models.train("digits-mlp", quiet=True)
    report = train_parity("digits-mlp", 2, ks=(2,))
    printed = capsys.readouterr().out
    assert "base model digits-mlp: held-out accuracy" in printed and "k=2: degraded-mode accuracy" in printed
    assert report.path == parity_path("digits-mlp", 2) == models.model_path("digits-mlp").with_name(
        "digits-mlp.parity-k2.pt")
    assert report.path.exists()
    assert report.degraded[2] >= 0.85
    assert report.base_accuracy >= report.degraded[2]


def test_a_parity_k_classifier_loads_the_parity_model_or_says_how_to_train_it(empty_cache: Path) -> None:
    from flowserve.errors import ComponentError
    from flowserve_components import models
    from flowserve_components.parity import train_parity
    from flowserve_components.torch_stage import TorchClassifier

    models.train("digits-mlp", epochs=1, quiet=True)
    missing = TorchClassifier.configure({"model": "digits-mlp", "parity_k": 3}, node="model-parity")
    with pytest.raises(ComponentError, match="flowserve parity train"):
        missing.setup()
    train_parity("digits-mlp", 3, ks=(3,), epochs=1, quiet=True)
    parity = TorchClassifier.configure({"model": "digits-mlp", "parity_k": 3}, node="model-parity")
    parity.setup()
    base = TorchClassifier.configure({"model": "digits-mlp"}, node="model")
    base.setup()
    assert parity.weights_hash != base.weights_hash
    x = np.random.default_rng(0).random((2, 64), dtype=np.float32)
    out = parity.process(Batch({"x": x}, [1, 1], ["a", "b"]))
    assert np.asarray(out["logits"]).shape == (2, 10)


def test_a_concat_parity_model_is_kept_apart_and_loaded_for_a_concat_node(empty_cache: Path) -> None:
    from flowserve_components import models
    from flowserve_components.parity import parity_path, train_parity
    from flowserve_components.torch_stage import TorchClassifier

    models.train("digits-mlp", epochs=1, quiet=True)
    report = train_parity("digits-mlp", 2, encoding="concat", ks=(2,), epochs=1, quiet=True)
    assert report.path == parity_path("digits-mlp", 2, "concat") != parity_path("digits-mlp", 2)
    assert report.path.name == "digits-mlp.parity-k2-concat.pt" and report.path.exists()
    summed = TorchClassifier.configure({"model": "digits-mlp", "parity_k": 2}, node="model-parity")
    with pytest.raises(Exception, match="--encoder sum"):
        summed.setup()  # only the concat model was trained
    concat = TorchClassifier.configure({"model": "digits-mlp", "parity_k": 2, "parity_encoder": "concat"},
                                       node="model-parity")
    concat.setup()
    out = concat.process(Batch({"x": np.zeros((1, 64), np.float32)}, [1], ["a"]))
    assert np.asarray(out["logits"]).shape == (1, 10)
