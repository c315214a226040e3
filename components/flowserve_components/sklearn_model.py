"""Serve a scikit-learn estimator saved with skops: ports from the estimator, untrusted types refused.

In a topology::

    model:
      component: flowserve_components.sklearn_model:SklearnModel
      params: {model: models/churn.skops}
      inputs: {x: pre.x}

The input port ``x`` is a feature matrix ``[-1, n_features_in_]``. The outputs are one port per method:
by default a classifier gives ``label`` (``predict``; INT64, or BYTES for string classes) and ``probs``
(``predict_proba``, when it has one), a regressor ``prediction`` (``predict``) and a transformer
``transformed`` (``transform``); ``methods: {port: method}`` picks others (``decision_function``,
``predict_log_proba``, ...). Each port's datatype and shape come from running the method on a row of
zeros when the topology loads. Floating outputs are FP32 unless ``precision: FP64``.

Loading is safe: a skops file describes the objects to build, and ``skops.io`` builds only types it
trusts (scikit-learn's estimators, numpy, scipy) unless told otherwise. Types it does not trust by default
are refused, listing them, unless they are named under ``trusted`` (review them first: skops explains why
each is untrusted; ``sklearn.tree._tree.Tree``, which every tree ensemble holds, indexes its nodes without
bounds checks). A pickle or joblib file is refused with how to re-save it (``skops.io.dump``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from flowserve.component import Batch, Component, Port
from flowserve.errors import ComponentError
from flowserve_components.model_files import ModelFile, check_port_name, require

Method = Literal["predict", "predict_proba", "predict_log_proba", "decision_function", "transform"]
_RESAVE = "save the estimator with skops.io.dump(model, 'model.skops')"


class SklearnParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="path of the .skops file (skops.io.dump)")
    trusted: list[str] = Field(default_factory=list, description="types to build that skops does not trust by "
                               "default (as skops.io.get_untrusted_types names them), after reviewing them")
    methods: dict[str, Method] | None = Field(None, description="output port -> estimator method; default by "
                                              "estimator kind (label/probs, prediction, transformed)")
    input: str = Field("x", description="name of the input port (the feature matrix)")
    datatype: Literal["FP32", "FP64"] = Field("FP32", description="datatype of the input port")
    precision: Literal["FP32", "FP64"] = Field("FP32", description="datatype of floating-point outputs")
    max_batch: int | None = Field(None, gt=0, le=65536, description="largest batch in requests")


def load_skops(file: ModelFile, trusted: list[str]) -> Any:
    """The estimator in a skops file, refusing one whose untrusted types are not all in ``trusted``."""
    skops_io = require("skops.io", "skops")
    file.head(_RESAVE)
    if "schema.json" not in file.zip_names():
        raise file.fail(f"not a skops file (a zip archive holding schema.json); {_RESAVE}")
    try:
        untrusted = skops_io.get_untrusted_types(file=file.path)
    except Exception as exc:  # noqa: BLE001 - a damaged archive or schema: the file cannot be served
        raise file.fail(f"skops cannot read it ({type(exc).__name__}: {exc})") from None
    refused = [t for t in untrusted if t not in trusted]
    if refused:
        raise file.fail(f"holds types skops does not trust by default: {', '.join(refused)}. Building them "
                        "could run code or read memory out of bounds if the file was crafted; if you made the "
                        "file or trust its source, list them under 'trusted' in the node's params")
    try:
        return skops_io.load(file.path, trusted=[t for t in untrusted if t in trusted])
    except Exception as exc:  # noqa: BLE001 - skops raises what building the object raised
        raise file.fail(f"skops cannot load it ({type(exc).__name__}: {exc})") from None


def _kind(estimator: Any) -> str:
    kind = getattr(estimator, "_estimator_type", None)
    if kind is None:  # scikit-learn 1.6 moved it into the estimator's tags
        tags = getattr(estimator, "__sklearn_tags__", None)
        kind = getattr(tags(), "estimator_type", None) if callable(tags) else None
    return str(kind)


def default_methods(estimator: Any) -> dict[str, str]:
    """Output port -> method for an estimator of this kind."""
    if _kind(estimator) == "classifier":
        methods = {"label": "predict"}
        if hasattr(estimator, "predict_proba"):  # False for an SVC without probability=True
            methods["probs"] = "predict_proba"
        return methods
    if hasattr(estimator, "predict"):
        return {"prediction": "predict"}
    if hasattr(estimator, "transform"):
        return {"transformed": "transform"}
    return {}


def _datatype(array: np.ndarray, precision: str) -> str:
    if array.dtype.kind == "f":
        return precision
    if array.dtype.kind in "OUS":
        return "BYTES"
    if array.dtype.kind == "b":
        return "BOOL"
    if array.dtype.kind in "iu":
        return "INT64"
    raise ComponentError(f"outputs of dtype {array.dtype} have no V2 datatype")


class SklearnModel(Component):
    """A scikit-learn estimator (or pipeline) from a skops file; one method call per port per batch."""

    Params: ClassVar[type[BaseModel]] = SklearnParams
    max_batch: ClassVar[int] = 1024

    params: SklearnParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        if self.params.max_batch is not None:
            self.max_batch = self.params.max_batch  # type: ignore[misc]
        self.file = ModelFile(self.params.model, "scikit-learn model")
        self._estimator = load_skops(self.file, self.params.trusted)
        features = getattr(self._estimator, "n_features_in_", None)
        if not isinstance(features, int):
            raise self.file.fail(f"the {type(self._estimator).__name__} in it records no n_features_in_ (is it "
                                 "fitted?)")
        self.inputs = {check_port_name(self.file, "input", self.params.input):  # type: ignore[misc]
                       Port(self.params.datatype, [-1, features])}
        self._methods = dict(self.params.methods or default_methods(self._estimator))
        if not self._methods:
            raise self.file.fail(f"{type(self._estimator).__name__} has no predict or transform; name its "
                                 "methods under 'methods'")
        self.outputs = self._probe(features)  # type: ignore[misc]
        self.weights_hash: str | None = None

    def _probe(self, features: int) -> dict[str, Port]:
        """Each output's port, from the method's answer to one row of zeros."""
        zeros = np.zeros((1, features), dtype=np.float32 if self.params.datatype == "FP32" else np.float64)
        ports: dict[str, Port] = {}
        for port, method in self._methods.items():
            check_port_name(self.file, "output", port)
            call = getattr(self._estimator, method, None)
            if call is None:
                raise self.file.fail(f"{type(self._estimator).__name__} has no method {method} (output '{port}')")
            try:
                answer = _as_array(call(zeros))
                ports[port] = Port(_datatype(answer, self.params.precision), [-1, *answer.shape[1:]])
            except ComponentError as exc:
                raise self.file.fail(f"{method} (output '{port}'): {exc}") from None
            except Exception as exc:  # noqa: BLE001 - the estimator cannot answer a row of this width
                raise self.file.fail(f"{method} on a row of {features} zeros raised {type(exc).__name__}: "
                                     f"{exc}") from None
        return ports

    def setup(self) -> None:
        self.weights_hash = self.file.sha256()

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        x = batch[self.params.input]
        return {port: _as_array(getattr(self._estimator, method)(x)) for port, method in self._methods.items()}

    def describe(self) -> str:
        parts = [f"model={self.file.path}"]
        if self.weights_hash:
            parts.append(f"weights=sha256:{self.weights_hash}")
        return f"{super().describe()}({', '.join(parts)})"


def _as_array(answer: Any) -> np.ndarray:
    """A method's answer as a port's array: dense, strings as bytes (the V2 BYTES representation)."""
    if hasattr(answer, "toarray"):  # a sparse matrix (a one-hot transform)
        answer = answer.toarray()
    array = np.asarray(answer)
    if array.dtype.kind in "OU":
        return np.vectorize(lambda v: v.encode() if isinstance(v, str) else v, otypes=[object])(array)
    return array
