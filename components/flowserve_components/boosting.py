"""Serve gradient-boosted trees from their native files: XGBoost (JSON or UBJ) and LightGBM (text).

In a topology::

    model:
      component: flowserve_components.boosting:XGBoostModel
      params: {model: models/churn.json}      # LightGBMModel: a booster.save_model("model.txt") file
      inputs: {x: pre.x}

Ports come from the model file: one input ``x`` (a float matrix ``[-1, features]``, features as the model
counts them; NaN is a missing value, as in training) and outputs by the model's objective:

===============================================  ==================================================
objective                                        outputs
===============================================  ==================================================
XGBoost ``binary:logistic``, LightGBM ``binary``  ``label`` INT64 [-1] (P > 0.5), ``probs`` FP32 [-1, 2]
``multi:softprob``, ``multiclass(ova)``           ``label`` INT64 [-1] (arg-max), ``probs`` FP32 [-1, k]
``multi:softmax``, ``binary:hinge``               ``label`` INT64 [-1]
anything else (regression, ranking, raw margins)  ``prediction`` FP32 [-1] (``[-1, t]`` for t targets)
===============================================  ==================================================

so ``label`` and ``probs`` are what ``XGBClassifier``/``LGBMClassifier``'s ``predict`` and
``predict_proba`` give. The model is read when the topology loads (its ports depend on it); ``model_from``
names a function that returns the path instead, creating the file first when it is missing (a model
trained on first use into a cache, as ``topologies/tabular.yaml`` does). Native files hold trees and
numbers only; a pickle (``pickle.dump``/``joblib.dump`` of the estimator) is refused, with how to re-save.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flowserve.component import Batch, Component, Port
from flowserve_components.model_files import ModelFile, check_port_name, model_location, one_source, require

#: objective -> what the model's raw prediction is: probabilities, class indices, or a value.
XGBOOST_TASKS: dict[str, str] = {"binary:logistic": "binary", "multi:softprob": "multiclass",
                                 "multi:softmax": "label", "binary:hinge": "label"}
LIGHTGBM_TASKS: dict[str, str] = {"binary": "binary", "multiclass": "multiclass", "multiclassova": "multiclass",
                                  "softmax": "multiclass", "multiclass_ova": "multiclass", "ova": "multiclass",
                                  "ovr": "multiclass"}


class BoostingParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(None, description="path of the model file")
    model_from: str | None = Field(None, description="'module:function' returning the model's path, creating the "
                                   "file when missing (e.g. training into a cache); called when the topology loads")
    input: str = Field("x", description="name of the input port (the feature matrix)")
    datatype: Literal["FP32", "FP64"] = Field("FP32", description="datatype of the input port")
    threads: int = Field(1, ge=1, le=256, description="prediction threads per worker")
    max_batch: int | None = Field(None, gt=0, le=65536, description="largest batch in requests")

    @model_validator(mode="after")
    def _one_source(self) -> BoostingParams:
        one_source(self.model, self.model_from)
        return self


class _BoostedTrees(Component):
    """Ports from a boosted-tree model's objective; one ``predict`` per batch."""

    Params: ClassVar[type[BaseModel]] = BoostingParams
    max_batch: ClassVar[int] = 1024
    #: both libraries release the GIL while they predict, so the worker can fetch the next batch meanwhile.
    offload: ClassVar[bool] = True
    what: ClassVar[str] = "model"
    resave: ClassVar[str] = ""

    params: BoostingParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        if self.params.max_batch is not None:
            self.max_batch = self.params.max_batch  # type: ignore[misc]
        self.file = ModelFile(model_location(self.params.model, self.params.model_from), self.what)
        self.file.head(self.resave)
        self._booster: Any = None
        self.weights_hash: str | None = None
        self.task, features, width = self._read()
        self.inputs = {check_port_name(self.file, "input", self.params.input):  # type: ignore[misc]
                       Port(self.params.datatype, [-1, features], doc="features, NaN where missing")}
        if self.task == "binary":
            self.outputs = {"label": Port("INT64", [-1]), "probs": Port("FP32", [-1, 2])}  # type: ignore[misc]
        elif self.task == "multiclass":
            self.outputs = {"label": Port("INT64", [-1]), "probs": Port("FP32", [-1, width])}  # type: ignore[misc]
        elif self.task == "label":
            self.outputs = {"label": Port("INT64", [-1])}  # type: ignore[misc]
        else:
            shape = [-1] if width == 1 else [-1, width]
            self.outputs = {"prediction": Port("FP32", shape)}  # type: ignore[misc]

    def _read(self) -> tuple[str, int, int]:
        """Load the booster; return (task, number of features, outputs per row)."""
        raise NotImplementedError

    def _predict(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def setup(self) -> None:
        self.weights_hash = self.file.sha256()

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        raw = np.asarray(self._predict(np.ascontiguousarray(batch[self.params.input])))
        if self.task == "binary":
            positive = raw.reshape(-1)
            # XGBClassifier and LGBMClassifier both call a row positive when P > 0.5
            return {"label": (positive > 0.5).astype(np.int64), "probs": np.stack([1 - positive, positive], 1)}
        if self.task == "multiclass":
            return {"label": raw.argmax(axis=1).astype(np.int64), "probs": raw}
        if self.task == "label":
            return {"label": raw.reshape(-1).astype(np.int64)}
        return {"prediction": raw}

    def describe(self) -> str:
        parts = [f"model={self.file.path}"]
        if self.weights_hash:
            parts.append(f"weights=sha256:{self.weights_hash}")
        return f"{super().describe()}({', '.join(parts)})"


class XGBoostModel(_BoostedTrees):
    """An XGBoost booster saved with ``save_model`` as JSON or UBJ."""

    what: ClassVar[str] = "XGBoost model"
    resave: ClassVar[str] = "save it with model.save_model('model.json') (or '.ubj')"

    def _read(self) -> tuple[str, int, int]:
        xgboost = require("xgboost", "xgboost")
        try:
            booster = xgboost.Booster(model_file=str(self.file.path))
        except xgboost.core.XGBoostError as exc:
            first = (str(exc).strip().splitlines() or ["?"])[0]
            raise self.file.fail(f"XGBoost cannot read it ({first}); {self.resave}") from None
        config = json.loads(booster.save_config())["learner"]
        objective = config["objective"]["name"]
        params = config["learner_model_param"]
        classes, targets = int(params.get("num_class", "0")), int(params.get("num_target", "1"))
        booster.set_param({"nthread": self.params.threads})
        self._booster = booster
        task = XGBOOST_TASKS.get(objective, "value")
        if task == "multiclass" and classes < 2:
            raise self.file.fail(f"objective {objective} with num_class {classes}: not a classifier")
        return task, booster.num_features(), classes if task == "multiclass" else max(1, targets)

    def _predict(self, x: np.ndarray) -> np.ndarray:
        return self._booster.inplace_predict(x)


class LightGBMModel(_BoostedTrees):
    """A LightGBM booster saved with ``save_model`` (its text format)."""

    what: ClassVar[str] = "LightGBM model"
    resave: ClassVar[str] = "save it with model.booster_.save_model('model.txt')"

    def _read(self) -> tuple[str, int, int]:
        lightgbm = require("lightgbm", "lightgbm")
        header = _lightgbm_header(self.file.path)
        if "objective" not in header or "max_feature_idx" not in header:
            raise self.file.fail(f"not a LightGBM text model (no objective or max_feature_idx line); {self.resave}")
        try:
            booster = lightgbm.Booster(model_file=str(self.file.path))
        except lightgbm.basic.LightGBMError as exc:
            raise self.file.fail(f"LightGBM cannot read it ({exc}); {self.resave}") from None
        self._booster = booster
        objective = header["objective"].split()[0]
        task = LIGHTGBM_TASKS.get(objective, "value")
        return task, booster.num_feature(), booster.num_model_per_iteration()

    def _predict(self, x: np.ndarray) -> np.ndarray:
        return self._booster.predict(x, num_threads=self.params.threads)


def _lightgbm_header(path: Path) -> dict[str, str]:
    """The ``key=value`` lines before the first tree of a LightGBM text model (read without parsing trees)."""
    header: dict[str, str] = {}
    with path.open("rb") as f:
        text = f.read(1 << 16).decode("utf-8", errors="replace")  # the header is short; trees follow
    for line in text.splitlines():
        if line.startswith("Tree="):
            break
        key, sep, value = line.strip().partition("=")
        if sep:
            header[key] = value
    return header
