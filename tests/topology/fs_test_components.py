"""Small components the topology and join tests wire together (importable as ``fs_test_components``)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from flowserve.component import Batch, Component, Port

VEC = Port("FP32", [-1, 4])


class ScaleParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    factor: float = Field(1.0, gt=0)


class Scale(Component):
    """FP32 [-1, 4] -> FP32 [-1, 4], with a validated parameter."""

    inputs: ClassVar[dict[str, Port]] = {"x": VEC}
    outputs: ClassVar[dict[str, Port]] = {"y": VEC}
    Params = ScaleParams
    max_batch: ClassVar[int] = 32

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"y": batch["x"] * self.params.factor}  # type: ignore[attr-defined]


class Pair(Component):
    """Two FP32 [-1, 4] inputs (a fan-in node)."""

    inputs: ClassVar[dict[str, Port]] = {"a": VEC, "b": VEC}
    outputs: ClassVar[dict[str, Port]] = {"y": VEC}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"y": batch["a"] + batch["b"]}


class Classify(Component):
    """FP32 [-1, 4] -> INT64 [-1] labels and FP32 [-1, 4] scores."""

    inputs: ClassVar[dict[str, Port]] = {"x": VEC}
    outputs: ClassVar[dict[str, Port]] = {"label": Port("INT64", [-1]), "scores": VEC}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"label": batch["x"].argmax(axis=1), "scores": batch["x"]}


class Wide(Component):
    """Takes FP32 [-1, 8]: same rank as VEC, different fixed width."""

    inputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 8])}
    outputs: ClassVar[dict[str, Port]] = {"y": Port("FP32", [-1, 8])}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"y": batch["x"]}


class Constant(Component):
    """No inputs at all: nothing can ever reach it."""

    outputs: ClassVar[dict[str, Port]] = {"y": VEC}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"y": np.zeros((batch.rows, 4), dtype=np.float32)}


class NotAComponent:
    """A class that does not derive from Component."""


not_a_class = 3


class Count(Component):
    """INT64 [-1] labels -> INT64 [-1]."""

    inputs: ClassVar[dict[str, Port]] = {"label": Port("INT64", [-1])}
    outputs: ClassVar[dict[str, Port]] = {"n": Port("INT64", [-1])}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"n": batch["label"] + 1}


class Mean(Component):
    """The mean of three FP32 [-1, 4] inputs over those present (behind a deadline join)."""

    inputs: ClassVar[dict[str, Port]] = {"a": VEC, "b": VEC, "c": VEC}
    outputs: ClassVar[dict[str, Port]] = {"y": VEC}
    accepts_absent: ClassVar[bool] = True

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        present = np.stack([batch.present(p) for p in "abc"], axis=1).astype(np.float32)
        total = sum(batch[p] * present[:, i:i + 1] for i, p in enumerate("abc"))
        return {"y": total / np.maximum(present.sum(axis=1, keepdims=True), 1)}


class Sum3(Mean):
    """Mean's ports without ``accepts_absent``: a deadline join must refuse it."""

    accepts_absent: ClassVar[bool] = False
