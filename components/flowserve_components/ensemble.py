"""Combine models: a softmax to put logits on a common scale, and an average of two predictions."""

from __future__ import annotations

import numpy as np

from flowserve.component import Batch, Component, Port
from flowserve_components.postprocess import N_CLASSES, softmax


class Softmax(Component):
    """Class probabilities from logits (numerically stable)."""

    inputs = {"logits": Port("FP32", [-1, N_CLASSES])}
    outputs = {"probs": Port("FP32", [-1, N_CLASSES])}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"probs": softmax(batch["logits"])}


class Average(Component):
    """The mean of two models' probabilities; wire it with an inner join so both have arrived."""

    inputs = {"a": Port("FP32", [-1, N_CLASSES]), "b": Port("FP32", [-1, N_CLASSES])}
    outputs = {"probs": Port("FP32", [-1, N_CLASSES])}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"probs": ((batch["a"] + batch["b"]) / np.float32(2)).astype(np.float32, copy=False)}
