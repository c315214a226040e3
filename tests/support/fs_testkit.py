"""Components used only by the tests. Importable by worker subprocesses via PYTHONPATH (see conftest)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from flowserve import Batch, Component, Port


class Checked(Component):
    """FP32 rows of 4, no NaN allowed: the port contract does the checking."""

    inputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 4], allow_nan=False)}
    outputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 4])}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"x": batch["x"]}


class AddOne(Component):
    inputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 4])}
    outputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 4])}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"x": batch["x"] + 1}
