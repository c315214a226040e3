"""Components (and a topology) used only by the tests. Importable by worker subprocesses via PYTHONPATH
(see conftest)."""

from __future__ import annotations

import time
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from flowserve import Batch, Component, Port, Result

#: the tuner tests' topology: one emulated stage whose batches of 4 take 68 ms on the "cpu" table (~59
#: requests/s per consumer); the test fills in NAME and PARTITIONS
ONE_EMULATED_STAGE = """
name: NAME
partitions: PARTITIONS
deadline_ms: 120000
nodes:
  m:
    component: flowserve.builtin:Accelerator
    params: {model: resnet50, hardware: cpu, jitter: 0}
    inputs: {x: input.x}
outputs: {x: m.x}
"""


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


class WhereAmI(Component):
    """An offloading component that records which thread ran each batch."""

    inputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 4])}
    outputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 4])}
    offload: ClassVar[bool] = True
    threads: ClassVar[list[int]] = []

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        import threading

        WhereAmI.threads.append(threading.get_ident())
        return {"x": batch["x"]}


# Members of fused chains (tests/topology/test_fuse.py, tests/integration/test_fused_chain.py): rows of 4 FP32.
ROW = Port("FP32", [-1, 4])


class AffineParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mul: float = 1.0
    add: float = 0.0
    weights: str | None = None  # reported as weights_hash, for lineage tests
    max_batch: int = 1024


class Affine(Component):
    """``x * mul + add``; a plain dict result."""

    inputs: ClassVar[dict[str, Port]] = {"x": ROW}
    outputs: ClassVar[dict[str, Port]] = {"x": ROW}
    Params: ClassVar[type[BaseModel]] = AffineParams
    params: AffineParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        self.weights_hash = self.params.weights
        self.max_batch = self.params.max_batch  # type: ignore[misc]

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"x": batch["x"] * self.params.mul + self.params.add}


class ValueParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    value: float = 0.0


class Reject(Component):
    """Fails each row whose first column equals ``value`` (its request fails); passes the others on."""

    inputs: ClassVar[dict[str, Port]] = {"x": ROW}
    outputs: ClassVar[dict[str, Port]] = {"x": ROW}
    Params: ClassVar[type[BaseModel]] = ValueParams
    params: ValueParams

    def process(self, batch: Batch) -> Result:
        bad = np.flatnonzero(batch["x"][:, 0] == self.params.value)
        return Result({"x": batch["x"]}, errors={int(i): f"rejects {self.params.value:g}" for i in bad})


class Split(Component):
    """Rows whose first column is below ``value`` go out on ``lo``, the others on ``hi`` (a row mask)."""

    inputs: ClassVar[dict[str, Port]] = {"x": ROW}
    outputs: ClassVar[dict[str, Port]] = {"lo": ROW, "hi": ROW}
    Params: ClassVar[type[BaseModel]] = ValueParams
    params: ValueParams

    def process(self, batch: Batch) -> Result:
        x = batch["x"]
        lo = x[:, 0] < self.params.value
        return Result({"lo": x, "hi": x}, mask={"lo": lo, "hi": ~lo})


class Boom(Component):
    """Raises when a row's first column equals ``value``, as a component with a bug would."""

    inputs: ClassVar[dict[str, Port]] = {"x": ROW}
    outputs: ClassVar[dict[str, Port]] = {"x": ROW}
    Params: ClassVar[type[BaseModel]] = ValueParams
    params: ValueParams

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        if (batch["x"][:, 0] == self.params.value).any():
            raise RuntimeError(f"boom on {self.params.value:g}")
        return {"x": batch["x"]}


class ShortMask(Component):
    """Returns a mask one row short when a row's first column equals ``value``: a result that breaks the
    component's own declaration."""

    inputs: ClassVar[dict[str, Port]] = {"x": ROW}
    outputs: ClassVar[dict[str, Port]] = {"x": ROW}
    Params: ClassVar[type[BaseModel]] = ValueParams
    params: ValueParams

    def process(self, batch: Batch) -> Result:
        x = batch["x"]
        short = (x[:, 0] == self.params.value).any()
        return Result({"x": x}, mask={"x": np.ones(len(x) - 1 if short else len(x), dtype=bool)})


class Emit(Component):
    """Emits ``x`` unless its first column equals ``value`` (then NaN, or float64 rows of 4 otherwise)."""

    inputs: ClassVar[dict[str, Port]] = {"x": ROW}
    outputs: ClassVar[dict[str, Port]] = {"x": ROW}
    Params: ClassVar[type[BaseModel]] = ValueParams
    params: ValueParams

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        x = batch["x"].astype(np.float64)  # the worker casts to the declared FP32; so must a chain
        x[x[:, 0] == self.params.value] = np.nan
        return {"x": x}


class NoNaN(Component):
    """Takes rows of 4 FP32 without NaN (the port contract does the checking) and counts its calls."""

    inputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 4], allow_nan=False)}
    outputs: ClassVar[dict[str, Port]] = {"x": ROW}
    seen: ClassVar[list[np.dtype]] = []

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        NoNaN.seen.append(batch["x"].dtype)
        return {"x": batch["x"]}


class Lifecycle(Component):
    """Records prepare/setup/close calls, in order, with its node id."""

    inputs: ClassVar[dict[str, Port]] = {"x": ROW}
    outputs: ClassVar[dict[str, Port]] = {"x": ROW}
    calls: ClassVar[list[str]] = []

    def prepare(self) -> None:
        Lifecycle.calls.append(f"prepare {self.node}")

    def setup(self) -> None:
        Lifecycle.calls.append(f"setup {self.node}")

    def close(self) -> None:
        Lifecycle.calls.append(f"close {self.node}")

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"x": batch["x"]}


class Count(Component):
    """An integer output (cannot be summed by a parity decoder)."""

    inputs: ClassVar[dict[str, Port]] = {"x": ROW}
    outputs: ClassVar[dict[str, Port]] = {"n": Port("INT64", [-1, 1])}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"n": np.ones((batch.rows, 1), np.int64)}


class Widen(Component):
    """FP32 [-1, 4] -> FP32 [-1, 8] on port ``x``: not a parity model for a 4 -> 4 node."""

    inputs: ClassVar[dict[str, Port]] = {"x": ROW}
    outputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 8])}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"x": np.concatenate([batch["x"], batch["x"]], axis=1)}


class SlowAddOne(Component):
    """``x + 1`` after 20 ms per batch: keeps a worker busy in one step long enough to break the broker under it."""

    inputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 4])}
    outputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 4])}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        time.sleep(0.02)
        return {"x": batch["x"] + 1}
