"""Many real torch models on one device: the component of a many-model node whose models are registered
versions (:class:`flowserve.learning.Registry`), not emulated ones.

:class:`TorchModels` implements :class:`flowserve.models.ServesModels`. A model of the node's ``models:``
is registry node ``<model name>`` of registry topology ``params.registry`` (the node's ``prefix`` is the
registry's naming, e.g. ``dv-`` for :mod:`flowserve_components.digit_variants`); a load reads its
promoted version (else its newest), checks it against its manifest's hash, reads it with
``torch.load(weights_only=True)`` (plain tensors or nothing, never pickle), builds the zoo architecture the
catalogue names as the model's ``kind`` (:func:`flowserve_components.models.build`) and moves it to the
device (``cuda`` when present: :meth:`setup`); an unload drops it (on CUDA its memory returns to torch's
cache for the next load); a batch runs it under ``inference_mode``. The scheduler decides when each call
happens, on its copy and compute lanes.

Every zoo model takes ``x`` (float32 [n, 64], pixels / 16) and returns ``logits`` (float32 [n, 10]).
torch is imported by :meth:`setup` and the first load: loading the topology never imports it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from flowserve.component import Batch, Component, Port, pick_device, torch_threads
from flowserve.errors import ErrorKind, FlowserveError
from flowserve.models import ModelSpec
from flowserve_components.digit_variants import ARCH, REGISTRY, module, produce

if TYPE_CHECKING:
    import torch


class TorchModelsParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    registry: str = Field(REGISTRY, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                          description="registry topology whose nodes are the models (under $FLOWSERVE_CACHE/models)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when present, else cpu")
    kind: str = Field(ARCH, description="the zoo architecture of a model whose catalogue entry names no kind")
    threads: int = Field(1, ge=1, le=256, description="torch intra-op threads per lane (CPU only)")
    variants: int = Field(0, ge=0, le=100_000, description="prepare registers this many digits variants "
                          "(flowserve_components.digit_variants) where missing; 0: the registry is filled elsewhere")


class TorchModels(Component):
    """Real torch models from the version registry, a bounded set of them on the device (module doc)."""

    Params: ClassVar[type[BaseModel]] = TorchModelsParams
    max_batch: ClassVar[int] = 64
    inputs = {"x": Port("FP32", [-1, 64], doc="pixels / 16")}
    outputs = {"logits": Port("FP32", [-1, 10])}

    params: TorchModelsParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        self._resident: dict[str, torch.nn.Module] = {}
        self._lock = threading.Lock()  # the copy and compute lanes are two threads

    def prepare(self) -> None:
        """Register the digits variants the params ask for, once, before the workers that load them start."""
        if self.params.variants:
            produce(self.params.variants, registry=self.params.registry)

    def setup(self) -> None:
        self.device = pick_device() if self.params.device == "auto" else self.params.device

    def load_model(self, spec: ModelSpec) -> None:
        if self.device == "cpu":
            torch_threads(self.params.threads)  # per OS thread: this is the copy lane's
        model = module(spec.name, self.params.registry, spec.kind or self.params.kind, self.device)
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()  # the copy is done when the load returns (the scheduler's copy lane)
        with self._lock:
            self._resident[spec.name] = model

    def unload_model(self, name: str) -> None:
        with self._lock:
            self._resident.pop(name, None)  # the last reference: its tensors are freed

    def resident(self) -> list[str]:
        """The models on the device now."""
        with self._lock:
            return sorted(self._resident)

    def run_model(self, spec: ModelSpec, batch: Batch) -> dict[str, np.ndarray]:
        import torch

        with self._lock:
            model = self._resident.get(spec.name)
        if model is None:  # the scheduler runs only what it loaded
            raise FlowserveError(f"model '{spec.name}' is not resident on node '{self.node}'",
                                 kind=ErrorKind.COMPONENT_FAILURE)
        if self.device == "cpu":
            torch_threads(self.params.threads)  # the compute lane's thread
        x = batch["x"]
        if not (x.flags.writeable and x.flags.c_contiguous and x.dtype == np.float32):
            x = np.array(x, np.float32, order="C")  # decoded from a record: read-only, which torch warns of
        with torch.inference_mode():
            logits = model(torch.from_numpy(x).to(self.device))
        return {"logits": logits.float().cpu().numpy()}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        raise FlowserveError(f"node '{self.node}' serves many models: its worker needs the models hook "
                             "(flowserve.models.model_hooks; flowserve worker attaches it)",
                             kind=ErrorKind.INVALID_TOPOLOGY)

    def close(self) -> None:
        with self._lock:
            self._resident.clear()
