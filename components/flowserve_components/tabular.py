"""Tabular pre-processing: named columns, as V2 tensors or JSON rows, to a feature matrix in a fixed order.

A model trained on a table takes its features in the training order; callers name them. ``Columns`` puts
them in that order::

    pre:
      component: flowserve_components.tabular:Columns
      params: {columns: [age, income, tenure]}          # the model's feature order
      inputs: {age: input.age, income: input.income, tenure: input.tenure}

takes one V2 tensor per column (``[-1]``: one value per row; a request may hold several rows) and gives
``x``, float32 ``[-1, 3]``. With ``source: rows`` it takes one BYTES tensor ``rows`` whose elements are
JSON objects (``{"age": 41, "income": 52000.5, "tenure": 3, "id": "c-17"}``): keys other than the columns
are ignored, a missing key or a null takes ``missing`` (NaN suits XGBoost and LightGBM, which route
missing values as in training) or, when ``missing`` is not set, fails that row's request alone.

>>> import numpy as np
>>> from flowserve.component import Batch
>>> pre = Columns.configure({"columns": ["b", "a"], "source": "rows"})
>>> pre.process(Batch({"rows": np.array([b'{"a": 1, "b": 2.5}'], dtype=object)}, [1], ["r0"])).outputs["x"]
array([[2.5, 1. ]], dtype=float32)
"""

from __future__ import annotations

import json
import math
from typing import ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from flowserve.component import Batch, Component, Port, Result
from flowserve.errors import ComponentError
from flowserve_components.model_files import PORT_NAME

#: what a column tensor may hold (numbers and booleans, converted to the matrix's float type).
ColumnType = Literal["FP32", "FP64", "FP16", "INT64", "INT32", "INT16", "INT8", "UINT8", "BOOL"]


class ColumnsParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    columns: list[str] = Field(min_length=1, description="the features, in the order the model takes them")
    source: Literal["tensors", "rows"] = Field("tensors", description="tensors: one input port per column; "
                                               "rows: one BYTES port 'rows' of JSON objects")
    datatype: ColumnType = Field("FP32", description="tensors: the datatype of every column port")
    datatypes: dict[str, ColumnType] = Field(default_factory=dict, description="tensors: per-column datatypes")
    missing: float | None = Field(None, description="rows: the value of a column a row lacks (or null); unset: "
                                  "such a row's request fails")
    output: str = Field("x", description="name of the output port (the feature matrix)")
    output_datatype: Literal["FP32", "FP64"] = Field("FP32", description="datatype of the feature matrix")

    @field_validator("columns")
    @classmethod
    def _distinct(cls, columns: list[str]) -> list[str]:
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        if repeated:
            raise ValueError(f"columns repeated: {', '.join(repeated)}")
        return columns


class Columns(Component):
    """Named columns to a float feature matrix in the declared column order."""

    Params: ClassVar[type[BaseModel]] = ColumnsParams
    params: ColumnsParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        p = self.params
        unknown = set(p.datatypes) - set(p.columns)
        if unknown:
            raise ComponentError(f"'datatypes' names {', '.join(sorted(unknown))}, which are not columns")
        if p.source == "tensors":
            bad = [c for c in p.columns if not PORT_NAME.match(c)]
            if bad:
                raise ComponentError(f"columns {', '.join(bad)} are not valid port names (they must match "
                                     f"{PORT_NAME.pattern}); rename them, or take JSON rows (source: rows)")
            self.inputs = {c: Port(p.datatypes.get(c, p.datatype), [-1]) for c in p.columns}  # type: ignore[misc]
        else:
            self.inputs = {"rows": Port("BYTES", [-1], doc="one JSON object per row")}  # type: ignore[misc]
        if not PORT_NAME.match(p.output):
            raise ComponentError(f"output '{p.output}' is not a valid port name")
        self.outputs = {p.output: Port(p.output_datatype, [-1, len(p.columns)])}  # type: ignore[misc]
        self._dtype = np.float32 if p.output_datatype == "FP32" else np.float64

    def process(self, batch: Batch) -> Result:
        if self.params.source == "tensors":
            x = np.stack([np.asarray(batch[c], dtype=self._dtype) for c in self.params.columns], axis=1)
            return Result({self.params.output: x})
        x = np.zeros((batch.rows, len(self.params.columns)), dtype=self._dtype)
        errors: dict[int, str] = {}
        for i, raw in enumerate(batch["rows"]):
            try:
                x[i] = self._row(raw)
            except ValueError as exc:
                errors[i] = f"node '{self.node}': row {i}: {exc}"
        return Result({self.params.output: x}, errors=errors)

    def _row(self, raw: object) -> list[float]:
        text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc.msg} at character {exc.pos})") from None
        if not isinstance(record, dict):
            raise ValueError(f"a JSON {type(record).__name__}, not an object of columns")
        values = []
        for column in self.params.columns:
            value = record.get(column)
            if value is None:
                if self.params.missing is None:
                    raise ValueError(f"no value for column '{column}' (set 'missing' to fill one in)")
                value = self.params.missing
            if not isinstance(value, bool | int | float):  # booleans count as 0 and 1
                raise ValueError(f"column '{column}' holds {json.dumps(value)[:40]}, not a number")
            values.append(float(value))
            if math.isinf(values[-1]):
                raise ValueError(f"column '{column}' is not finite")
        return values
