"""Branches for the model-selection tests: each answers one fixed label (importable by worker processes)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from flowserve import Batch, Component, Port


class AnswerParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    value: int = 0


class Answer(Component):
    """Answer ``value`` for every row: a branch that is right exactly when the truth is ``value``."""

    inputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, -1])}
    outputs: ClassVar[dict[str, Port]] = {"label": Port("INT64", [-1])}
    Params: ClassVar[type[BaseModel]] = AnswerParams

    params: AnswerParams

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"label": np.full(batch.rows, self.params.value, np.int64)}


class ProbsParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    probs: list[float] = [0.5, 0.5]


class Probs(Component):
    """Give the same class probabilities ``probs`` for every row: an ensemble member of known quality."""

    inputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, -1])}
    outputs: ClassVar[dict[str, Port]] = {"probs": Port("FP32", [-1, -1])}
    Params: ClassVar[type[BaseModel]] = ProbsParams

    params: ProbsParams

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"probs": np.tile(np.asarray(self.params.probs, np.float32), (batch.rows, 1))}
