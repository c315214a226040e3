"""Conditional routing: send each request down one branch of the graph, decided by the batch's data."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from flowserve.component import Batch, Component, Port, Result


class ConfidenceRouterParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(0.9, ge=0.0, le=1.0, description="smallest top probability counted as sure")


class ConfidenceRouter(Component):
    """Pass confident answers on; send the inputs of unsure requests to a stronger model.

    A request is confident when every one of its rows has a top probability >= ``threshold``; its
    ``probs`` go out on ``confident_probs``. Otherwise its ``x`` goes out on ``unsure_x``. All rows of
    a request take the same branch, so a downstream any-join gets the whole request from one side.
    Rows with NaN probabilities count as unsure.
    """

    inputs = {"probs": Port("FP32", [-1, 10]), "x": Port("FP32", [-1, 64])}
    outputs = {"confident_probs": Port("FP32", [-1, 10]), "unsure_x": Port("FP32", [-1, 64])}
    Params: ClassVar[type[BaseModel]] = ConfidenceRouterParams

    params: ConfidenceRouterParams

    def process(self, batch: Batch) -> Result:
        probs, x = batch["probs"], batch["x"]
        sizes = np.asarray(batch.sizes, dtype=np.intp)
        filled = sizes > 0
        # reduceat misreads empty requests (and fails on one at the very end), so reduce only the others.
        weakest = np.minimum.reduceat(probs.max(axis=1), batch.starts()[filled])
        sure = np.repeat(weakest >= self.params.threshold, sizes[filled])
        return Result(
            outputs={"confident_probs": probs, "unsure_x": x},
            mask={"confident_probs": sure, "unsure_x": ~sure},
        )
