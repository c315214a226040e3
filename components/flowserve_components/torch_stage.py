"""Run a PyTorch classifier over a batch: a zoo model by name, or user weights from a file.

In a topology::

    model:
      component: flowserve_components.torch_stage:TorchClassifier
      params: {model: digits-cnn, threads: 1}
      inputs: {x: pre.x}

torch is imported in ``setup``, not at module import, so loading a topology stays fast.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flowserve.component import Batch, Component, Port, pick_device, torch_threads
from flowserve.errors import ComponentError
from flowserve.learning.capabilities import Retrained
from flowserve_components import models

if TYPE_CHECKING:
    import torch


class TorchClassifierParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(None, description="zoo model name; with a state-dict 'path', its architecture")
    path: str | None = Field(None, description="user weights: a TorchScript file or a state dict for 'model'")
    parity_k: int | None = Field(None, ge=2, le=16, description="load the zoo model's parity model for groups "
                                 "of k (trained by `flowserve parity train`) instead of the model")
    parity_encoder: Literal["sum", "concat"] = Field("sum", description="with parity_k: the encoder the parity "
                                                     "model was trained for (the node's parity: encoder)")
    threads: int = Field(1, ge=1, le=256, description="torch intra-op threads per worker (CPU only)")
    max_batch: int | None = Field(None, gt=0, le=65536, description="largest batch in requests")

    @field_validator("model")
    @classmethod
    def _known(cls, name: str | None) -> str | None:
        if name is not None and name not in models.ZOO:
            raise ValueError(f"unknown model '{name}'; the zoo has {', '.join(models.ZOO)}")
        return name

    @model_validator(mode="after")
    def _something_to_load(self) -> TorchClassifierParams:
        if self.model is None and self.path is None:
            raise ValueError("give 'model' (a zoo name), 'path' (a weights file), or both")
        return self


class TorchClassifier(Component):
    """Logits of a torch classifier for flattened 8x8 images. Uses CUDA when there is one."""

    inputs = {"x": Port("FP32", [-1, 64], doc="pixels / 16")}
    outputs = {"logits": Port("FP32", [-1, 10])}
    Params: ClassVar[type[BaseModel]] = TorchClassifierParams
    max_batch: ClassVar[int] = 256
    #: torch releases the GIL while it computes, so the worker can fetch the next batch meanwhile.
    offload: ClassVar[bool] = True
    #: fine-tunes from the live weights on feedback (flowserve learn); zoo state-dict models only.
    retrainable: ClassVar[bool] = True

    params: TorchClassifierParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        if self.params.max_batch is not None:
            self.max_batch = self.params.max_batch  # type: ignore[misc]
        self.weights_hash: str | None = None
        self._model: Any = None
        self._pinned: torch.Tensor | None = None

    def prepare(self) -> None:
        """Train and cache a missing zoo model once, before the workers that load it start."""
        if self.params.path is None and self.params.model is not None and self.params.parity_k is None:
            models.ensure(self.params.model)

    def setup(self) -> None:
        import torch

        self.device = pick_device()
        if self.device == "cpu":
            # Several workers share the machine's cores; torch's default (all cores each) oversubscribes.
            torch.set_num_threads(self.params.threads)
        path = self.params.path
        if self.params.parity_k is not None and path is None and self.params.model is not None:
            from flowserve_components.parity import parity_path

            path = str(parity_path(self.params.model, self.params.parity_k, self.params.parity_encoder))
            if not Path(path).exists():
                raise ComponentError(f"node '{self.node}': no parity model at {path}; train it with "
                                     f"'flowserve parity train TOPOLOGY NODE --k {self.params.parity_k} "
                                     f"--encoder {self.params.parity_encoder}'")
        try:
            self._model, self.weights_hash = models.load_with_hash(self.params.model, self.device, path)
        except ComponentError as exc:
            raise ComponentError(f"node '{self.node}': {exc}") from None

    def train_parity(self, k: int, encoding: str = "sum") -> dict[str, Any]:
        """Train the zoo model's parity models (k = 2, 3, 4 and ``k``), saving the one for ``k`` beside it."""
        from flowserve_components.parity import train_parity

        if self.params.model is None or self.params.path is not None:
            raise ComponentError(f"node '{self.node}': parity training needs a zoo model ('model'), not a 'path'")
        if encoding not in ("sum", "concat"):
            raise ComponentError(f"node '{self.node}': unknown parity encoder '{encoding}' (sum or concat)")
        report = train_parity(self.params.model, k, encoding="concat" if encoding == "concat" else "sum")
        return {"base": report.base, "k": k, "encoder": encoding, "path": str(report.path),
                "base_accuracy": report.base_accuracy,
                "degraded_accuracy": {str(n): a for n, a in report.degraded.items()}}

    def _architecture(self) -> str:
        if self.params.model is None or self.params.parity_k is not None:
            raise ComponentError(f"node '{self.node}': continual learning needs a zoo architecture ('model'), "
                                 "not a TorchScript file or a parity model")
        return self.params.model

    def retrain(self, inputs: Mapping[str, np.ndarray], targets: Mapping[str, np.ndarray]) -> Retrained:
        """Fine-tune the loaded weights on the examples (``x``) and their true labels (the feedback's
        ``label``, or its only output)."""
        import torch

        self._architecture()
        if self._model is None:
            raise ComponentError(f"node '{self.node}': retrain called before setup()")
        labels = _labels(targets, self.node)
        x = torch.from_numpy(np.ascontiguousarray(inputs["x"], dtype=np.float32))
        if len(x) != len(labels):
            raise ComponentError(f"node '{self.node}': {len(x)} inputs but {len(labels)} labels")
        weights, metrics = models.fine_tune(self._model, x, torch.from_numpy(labels))
        return Retrained(weights, metrics)

    def load_weights(self, data: bytes, version: str | None = None) -> None:
        """Swap in a registered version's state dict (``weights_only``); the next batch runs on it."""
        import hashlib

        model = models.load_state(self._architecture(), data, self.device)
        self._model = model  # one reference swap: a batch runs wholly on the old or the new weights
        self.weights_hash = hashlib.sha256(data).hexdigest()
        self.model_version = version

    def score(self, outputs: Mapping[str, np.ndarray], targets: Mapping[str, np.ndarray]) -> np.ndarray:
        """Whether the arg-max of ``logits`` is the true label, per row."""
        return np.asarray(outputs["logits"]).argmax(axis=1) == _labels(targets, self.node)

    def close(self) -> None:
        self._model = None
        self._pinned = None

    def _to_device(self, x: np.ndarray) -> torch.Tensor:
        import torch

        if self.device == "cpu":
            # Arrays decoded from the wire are read-only views; torch wants memory it may write.
            return torch.from_numpy(x if x.flags.writeable else x.copy())
        rows = x.shape[0]
        if self._pinned is None or self._pinned.shape[0] < rows:
            # Pinned host memory is slow to allocate, so keep one buffer and grow it geometrically.
            capacity = max(rows, 2 * (0 if self._pinned is None else self._pinned.shape[0]))
            self._pinned = torch.empty((capacity, *x.shape[1:]), dtype=torch.float32, pin_memory=True)
        staging = self._pinned[:rows]
        staging.numpy()[...] = x
        # Safe to reuse the buffer next call: process() waits for the result, hence for this copy.
        return staging.to(self.device, non_blocking=True)

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        import torch

        if self._model is None:
            raise ComponentError(f"node '{self.node}': TorchClassifier.process called before setup()")
        if self.device == "cpu":
            torch_threads(self.params.threads)  # in this thread: setup() ran in another
        x = np.ascontiguousarray(batch["x"], dtype=np.float32)
        with torch.inference_mode():
            logits = self._model(self._to_device(x))
            out = logits.float().cpu().numpy()
        return {"logits": out}

    def torch_forward(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """``process`` in torch with autograd on (flowserve.explain.Differentiable): logits on the input's device."""
        if self._model is None:
            raise ComponentError(f"node '{self.node}': TorchClassifier.torch_forward called before setup()")
        x = inputs["x"]
        return {"logits": self._model(x.float().to(self.device)).float().to(x.device)}

    def describe(self) -> str:
        what = self.params.model or "user"
        parts = [f"model={what}"]
        if self.params.path:
            parts.append(f"path={self.params.path}")
        if self.weights_hash:
            parts.append(f"weights=sha256:{self.weights_hash}")
        return f"{super().describe()}({', '.join(parts)})"


def _labels(targets: Mapping[str, np.ndarray], node: str) -> np.ndarray:
    """The true class per row: the feedback's ``label`` output, or its only one."""
    if "label" in targets:
        array = targets["label"]
    elif len(targets) == 1:
        array = next(iter(targets.values()))
    else:
        raise ComponentError(f"node '{node}': feedback has outputs {', '.join(targets)}; a classifier learns "
                             "from 'label' (the true class per request)")
    return np.asarray(array).reshape(-1).astype(np.int64)
