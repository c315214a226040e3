"""Many models on one emulated device: the component a many-model node (``models:``) runs with.

:class:`EmulatedModels` implements :class:`flowserve.models.ServesModels` on an emulated accelerator: a load
holds the copy lane for the model's load time (its size over the link's bandwidth,
:data:`flowserve.models.BANDWIDTH`), a batch holds the compute lane for the model's batch time (its
latency table), both by sleeping, so an emulated worker costs no CPU while its device is busy. Each model
computes ``y = x + offset(name)`` (:func:`offset`), so every answer shows which model computed it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from flowserve.component import Batch, Component, Port
from flowserve.errors import ErrorKind, FlowserveError
from flowserve.models import ModelSpec


def offset(name: str) -> float:
    """What model ``name`` adds to its input: 1 to 10,000, from a hash of its name (stable everywhere)."""
    return float(1 + int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest(), "big") % 10_000)


class EmulatedModelsParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    width: int = Field(4, ge=1, le=65536, description="columns of x and y")


class EmulatedModels(Component):
    """An emulated accelerator holding some of many models (see the module's doc)."""

    Params: ClassVar[type[BaseModel]] = EmulatedModelsParams
    max_batch: ClassVar[int] = 64

    params: EmulatedModelsParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        row = Port("FP32", [-1, self.params.width])
        self.inputs = {"x": row}  # type: ignore[misc]
        self.outputs = {"y": row}  # type: ignore[misc]
        self._resident: set[str] = set()
        self._lock = threading.Lock()  # the copy and compute lanes are two threads
        #: (kind, model) of every load and batch, in the order they ended (tests read it)
        self.log: list[tuple[str, str]] = []

    def load_model(self, spec: ModelSpec) -> None:
        time.sleep(spec.load_s)  # the copy engine is busy for size / bandwidth
        with self._lock:
            self._resident.add(spec.name)
            self.log.append(("load", spec.name))

    def unload_model(self, name: str) -> None:
        with self._lock:
            self._resident.discard(name)
            self.log.append(("unload", name))

    def run_model(self, spec: ModelSpec, batch: Batch) -> dict[str, np.ndarray]:
        with self._lock:
            if spec.name not in self._resident:  # the scheduler runs only what it loaded
                raise FlowserveError(f"model '{spec.name}' is not resident on node '{self.node}'",
                                     kind=ErrorKind.COMPONENT_FAILURE)
        time.sleep(spec.batch_s(len(batch.sizes)))
        with self._lock:
            self.log.append(("batch", spec.name))
        return {"y": (batch["x"] + np.float32(offset(spec.name))).astype(np.float32)}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        raise FlowserveError(f"node '{self.node}' serves many models: its worker needs the models hook "
                             "(flowserve.models.model_hooks; flowserve worker attaches it)",
                             kind=ErrorKind.INVALID_TOPOLOGY)
