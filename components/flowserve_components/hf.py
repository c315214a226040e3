"""Serve a Hugging Face transformers model from a local directory: sequence classification or embeddings.

In a topology::

    model:
      component: flowserve_components.hf:HfModel
      params: {model: models/my-bert, task: sequence-classification}
      inputs: {input_ids: tokenize.input_ids, attention_mask: tokenize.attention_mask}

The directory is what ``model.save_pretrained(dir)`` writes: ``config.json`` and safetensors weights
(``model.safetensors``, or shards listed in ``model.safetensors.index.json``). Nothing is downloaded:
the model is read with ``from_pretrained(dir, local_files_only=True, use_safetensors=True,
trust_remote_code=False)``. Weights only in pickle form (``pytorch_model.bin``, ``*.pt``, ``*.ckpt``) are
refused when the topology loads, with the reason and how to convert them; beside safetensors they are
ignored. Tokenize with :class:`flowserve_components.text.Tokenize` (the directory's ``tokenizer.json``).

Ports, from ``config.json``: inputs ``input_ids`` and ``attention_mask`` (INT64 ``[-1, L]``; plus
``token_type_ids`` with ``type_ids: true``); ``task: sequence-classification`` gives ``logits`` (FP32
``[-1, num_labels]``), ``task: embeddings`` gives ``embedding`` (FP32 ``[-1, hidden_size]``: the mean of
the last hidden states over the attended tokens, or the first token's with ``pooling: cls``; unit length
with ``normalize: true``). A row the model cannot take (a token id outside its vocabulary, more tokens than
its ``max_position_embeddings``) fails its own request, saying why; the rest of the batch runs.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flowserve.component import Batch, Component, Port, Result, pick_device, torch_threads
from flowserve.errors import ComponentError
from flowserve_components.model_files import ModelFile, is_safetensors, model_location, one_source, require

#: weight files that are pickles (torch.save): loading one runs whatever code it names
PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")
#: config.json keys that give the hidden size, by architecture family
HIDDEN_KEYS = ("hidden_size", "d_model", "dim", "n_embd")
CONVERT = ("re-save it as safetensors: AutoModel...from_pretrained(dir).save_pretrained(dir, "
           "safe_serialization=True), in a process you trust with that file")


class HfParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(None, description="the model directory (save_pretrained's output)")
    model_from: str | None = Field(None, description="'module:function' returning that directory, creating it "
                                   "when missing; called when the topology loads")
    task: Literal["sequence-classification", "embeddings"] = Field(description="what the model answers")
    pooling: Literal["mean", "cls"] = Field("mean", description="embeddings: mean over attended tokens, or "
                                            "the first token")
    normalize: bool = Field(False, description="embeddings: scale each to unit length")
    type_ids: bool = Field(False, description="take a token_type_ids input")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when torch sees a GPU")
    threads: int = Field(1, ge=1, le=256, description="torch intra-op threads per worker (CPU)")
    max_batch: int | None = Field(None, gt=0, le=65536, description="largest batch in requests")

    @model_validator(mode="after")
    def _one_source(self) -> HfParams:
        one_source(self.model, self.model_from, "a directory")
        return self


class ModelDirectory:
    """A save_pretrained directory checked without importing transformers: config, safetensors weights."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.file = ModelFile(self.path, "Hugging Face model directory")
        if not self.path.is_dir():
            raise self.file.fail("no such directory" if not self.path.exists() else
                                 "not a directory; give the folder model.save_pretrained() wrote")
        config_file = self.path / "config.json"
        try:
            self.config: dict[str, Any] = json.loads(config_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise self.file.fail("has no config.json") from None
        except (OSError, ValueError) as exc:
            raise self.file.fail(f"config.json does not parse as JSON ({exc})") from None
        self.weights = self._weights()

    def _weights(self) -> list[Path]:
        safe = sorted(self.path.glob("*.safetensors"))
        pickles = sorted({p.name for pattern in PICKLE_WEIGHTS for p in self.path.glob(pattern)})
        if not safe:
            if pickles:
                raise self.file.fail(f"holds its weights only as pickles ({', '.join(pickles)}); loading a pickle "
                                     f"runs whatever code it names, so it is refused: {CONVERT}")
            raise self.file.fail("holds no safetensors weights (model.safetensors); save the model with "
                                 "save_pretrained(dir, safe_serialization=True)")
        for weights in safe:
            with weights.open("rb") as f:
                if not is_safetensors(f.read(16)):
                    raise ModelFile(weights, "safetensors file").fail("is not a safetensors file (its header "
                                                                      "is not a length and JSON)")
        return safe

    def count(self, *keys: str, default: int | None = None) -> int:
        """The first of ``keys`` that config.json sets, as an int (``default`` when none is set)."""
        for key in keys:
            value = self.config.get(key)
            if isinstance(value, int) and value > 0:
                return value
        if default is not None:
            return default
        raise self.file.fail(f"config.json sets none of {', '.join(keys)}")

    def sha256(self) -> str:
        digest = hashlib.sha256()
        for weights in self.weights:
            digest.update(bytes.fromhex(ModelFile(weights, "weights").sha256()))
        return digest.hexdigest()


class HfModel(Component):
    """A local transformers model (safetensors only) for sequence classification or embeddings."""

    Params: ClassVar[type[BaseModel]] = HfParams
    max_batch: ClassVar[int] = 64
    #: torch releases the GIL while it runs, so the worker can fetch the next batch meanwhile.
    offload: ClassVar[bool] = True
    params: HfParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        p = self.params
        if p.max_batch is not None:
            self.max_batch = p.max_batch  # type: ignore[misc]
        self.directory = ModelDirectory(model_location(p.model, p.model_from))
        inputs = {"input_ids": Port("INT64", [-1, -1]), "attention_mask": Port("INT64", [-1, -1])}
        if p.type_ids:
            inputs["token_type_ids"] = Port("INT64", [-1, -1])
        self.inputs = inputs  # type: ignore[misc]
        if p.task == "sequence-classification":
            labels = self.directory.config.get("id2label")
            n = len(labels) if isinstance(labels, dict) and labels else self.directory.count("num_labels", default=2)
            self.outputs = {"logits": Port("FP32", [-1, n])}  # type: ignore[misc]
        else:
            self.outputs = {"embedding": Port("FP32", [-1, self.directory.count(*HIDDEN_KEYS)])}  # type: ignore[misc]
        self.vocab = self.directory.count("vocab_size")
        self.positions = self.directory.count("max_position_embeddings", "n_positions", default=0)
        self._model: Any = None
        self._torch: Any = None

    def setup(self) -> None:
        self._torch = require("torch", "text")
        transformers = require("transformers", "text")
        auto = (transformers.AutoModelForSequenceClassification if self.params.task == "sequence-classification"
                else transformers.AutoModel)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = auto.from_pretrained(str(self.directory.path), local_files_only=True, use_safetensors=True,
                                             trust_remote_code=False)
        except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError, ...
            raise self.directory.file.fail(f"transformers cannot load it: {type(exc).__name__}: "
                                           f"{str(exc).strip()[:500]}") from None
        self.device = pick_device() if self.params.device == "auto" else self.params.device
        self._model = model.eval().to(self.device)
        self.weights_hash = self.directory.sha256()

    def close(self) -> None:
        self._model = None

    def process(self, batch: Batch) -> Result:
        if self._model is None:
            raise ComponentError(f"node '{self.node}': HfModel.process called before setup()")
        torch = self._torch
        torch_threads(self.params.threads)
        arrays = {name: np.array(batch[name], np.int64) for name in self.inputs}  # copies: bad rows are zeroed
        errors = self._check(arrays)
        feeds = {name: torch.from_numpy(array).to(self.device) for name, array in arrays.items()}
        with torch.inference_mode():
            out = self._model(**feeds)
            if self.params.task == "sequence-classification":
                return Result({"logits": out.logits.float().cpu().numpy()}, errors=errors)
            hidden = out.last_hidden_state.float()
            if self.params.pooling == "cls":
                pooled = hidden[:, 0]
            else:
                mask = feeds["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
            if self.params.normalize:
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
            return Result({"embedding": pooled.cpu().numpy()}, errors=errors)

    def _check(self, arrays: dict[str, np.ndarray]) -> dict[int, str]:
        """Rows the model cannot take (a token id outside its vocabulary, more tokens than it has positions)
        fail alone, with why; they are zeroed (and long batches cut to the positions) so the rest can run."""
        ids, mask = arrays["input_ids"], arrays["attention_mask"]
        errors: dict[int, str] = {}
        for row in np.flatnonzero(((ids < 0) | (ids >= self.vocab)).any(axis=1)):
            token = int(ids[row][(ids[row] < 0) | (ids[row] >= self.vocab)][0])
            errors[int(row)] = (f"node '{self.node}': token id {token} is outside the model's vocabulary "
                                f"(0 to {self.vocab - 1}): was the text tokenized with this model's tokenizer?")
        if self.positions and ids.shape[1] > self.positions:
            for row in np.flatnonzero(mask[:, self.positions:].any(axis=1)):
                errors[int(row)] = (f"node '{self.node}': {int(mask[row].sum())} tokens, more than the model's "
                                    f"{self.positions} positions: give the tokenizer max_length {self.positions}")
            for name in arrays:
                arrays[name] = np.ascontiguousarray(arrays[name][:, : self.positions])
        for name in arrays:
            arrays[name][list(errors)] = 0
        return errors

    def describe(self) -> str:
        parts = [f"model={self.directory.path}", f"task={self.params.task}"]
        if self.weights_hash:
            parts.append(f"weights=sha256:{self.weights_hash}")
        return f"{super().describe()}({', '.join(parts)})"
