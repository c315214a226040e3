"""Combine models: a softmax to put logits on a common scale, and an average of members' predictions."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from flowserve.component import Batch, Component, Port
from flowserve_components.postprocess import N_CLASSES, softmax


class Softmax(Component):
    """Class probabilities from logits (numerically stable)."""

    inputs = {"logits": Port("FP32", [-1, N_CLASSES])}
    outputs = {"probs": Port("FP32", [-1, N_CLASSES])}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"probs": softmax(batch["logits"])}


class AverageParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: one input port per member, named after it (the names ``missing`` reports).
    members: list[str] = Field(default_factory=lambda: ["a", "b"], min_length=2, max_length=32)

    @field_validator("members")
    @classmethod
    def _distinct(cls, members: list[str]) -> list[str]:
        if len(set(members)) != len(members) or not all(m.isidentifier() for m in members):
            raise ValueError(f"members {members} must be distinct identifiers")
        return members


class Average(Component):
    """The mean of the members' probabilities that are present, and which members were missing.

    Behind ``join: {type: deadline}`` a slow member's row is absent (``Batch.present``): the mean is
    over the members present on that row, and ``missing`` lists the absent ones, comma-separated
    (``b""`` when all answered). Behind an inner join every member is always present.
    """

    Params: ClassVar[type[BaseModel]] = AverageParams
    accepts_absent: ClassVar[bool] = True
    outputs = {"probs": Port("FP32", [-1, N_CLASSES]), "missing": Port("BYTES", [-1])}

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        assert isinstance(self.params, AverageParams)
        self.members = list(self.params.members)
        self.inputs = {m: Port("FP32", [-1, N_CLASSES]) for m in self.members}  # type: ignore[misc]

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        present = np.stack([batch.present(m) for m in self.members], axis=1)  # rows x members
        total = np.zeros_like(batch[self.members[0]])
        for j, m in enumerate(self.members):
            total += np.where(present[:, j:j + 1], batch[m], np.float32(0))
        count = np.maximum(present.sum(axis=1, keepdims=True), 1).astype(np.float32)
        missing = np.full(batch.rows, b"", dtype=object)
        for i in np.flatnonzero(~present.all(axis=1)):  # only rows with a member absent: the rare case
            missing[i] = ",".join(m for m, p in zip(self.members, present[i], strict=True) if not p).encode()
        return {"probs": (total / count).astype(np.float32, copy=False), "missing": missing}
