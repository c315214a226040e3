"""Faults on purpose: degrade a branch's input from a point in a run (benches of model selection)."""

from __future__ import annotations

import zlib
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from flowserve.component import Batch, Component, Port


class InputNoiseParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sigma: float = Field(0.5, ge=0.0, description="standard deviation of the Gaussian noise added")
    header: str = Field("x-degrade", description="only requests carrying this header get noise")


class InputNoise(Component):
    """Add Gaussian noise to ``x`` of the requests that carry ``header`` (others pass unchanged).

    The noise of a request is drawn from a generator seeded by its request id, so running the same
    requests again (a bench's offline baseline) gives the very same inputs.
    """

    inputs = {"x": Port("FP32", [-1, -1])}
    outputs = {"x": Port("FP32", [-1, -1])}
    Params: ClassVar[type[BaseModel]] = InputNoiseParams

    params: InputNoiseParams

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        x = batch["x"]
        flags = batch.header(self.params.header.lower())
        if not any(f is not None for f in flags):
            return {"x": x}
        out = x.copy()
        for rid, flag, start, n in zip(batch.request_ids, flags, batch.starts().tolist(), batch.sizes, strict=True):
            if flag is not None:  # per request: its own seeded generator (few requests carry the header)
                rng = np.random.default_rng(zlib.crc32(rid.encode()))
                out[start:start + n] += rng.normal(0.0, self.params.sigma, size=out[start:start + n].shape)
        return {"x": out.astype(np.float32, copy=False)}
