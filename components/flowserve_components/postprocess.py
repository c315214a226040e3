"""Turn classifier outputs into answers: the most likely label, or the k most likely ones."""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from flowserve.component import Batch, Component, Port

N_CLASSES = 10


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float32; subtracting the row maximum keeps ``exp`` from overflowing."""
    z = np.asarray(logits, dtype=np.float32)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class ArgMaxParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    input: Literal["logits", "probs"] = Field(
        "logits", description="what arrives: logits (softmax applied here) or probabilities (passed on)"
    )


class ArgMax(Component):
    """The most likely label and the class probabilities.

    With ``params: {input: probs}`` the input port is ``probs`` and is passed on unchanged, for nodes
    downstream of a softmax or an ensemble.
    """

    inputs = {"logits": Port("FP32", [-1, N_CLASSES])}
    outputs = {"label": Port("INT64", [-1]), "probs": Port("FP32", [-1, N_CLASSES])}
    Params: ClassVar[type[BaseModel]] = ArgMaxParams

    params: ArgMaxParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        self.inputs = {self.params.input: Port("FP32", [-1, N_CLASSES])}  # type: ignore[misc]

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        probs = batch["probs"] if self.params.input == "probs" else softmax(batch["logits"])
        return {"label": probs.argmax(axis=1).astype(np.int64), "probs": probs}


class TopKParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    k: int = Field(3, ge=1, le=N_CLASSES, description="how many classes to report per row")


class TopK(Component):
    """The ``k`` most likely classes per row, best first, with their softmax probabilities.

    Ties go to the lower class index, so the output is deterministic.
    """

    inputs = {"logits": Port("FP32", [-1, N_CLASSES])}
    outputs = {"indices": Port("INT64", [-1, -1]), "scores": Port("FP32", [-1, -1])}
    Params: ClassVar[type[BaseModel]] = TopKParams

    params: TopKParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        k = self.params.k
        self.outputs = {"indices": Port("INT64", [-1, k]), "scores": Port("FP32", [-1, k])}  # type: ignore[misc]

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        probs = softmax(batch["logits"])
        # A stable sort of the negated scores keeps equal scores in index order.
        indices = np.argsort(-probs, axis=1, kind="stable")[:, : self.params.k]
        return {"indices": indices.astype(np.int64), "scores": np.take_along_axis(probs, indices, axis=1)}
