"""The Open Inference Protocol V2 JSON form of tensors, accepted at a topology's edges."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from flowserve.errors import WireError
from flowserve.wire.tensors import DATATYPES, as_bytes_array, datatype_of


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    if not data or not isinstance(data[0], list):
        return data
    out: list[Any] = []
    stack = [data]
    # Iterative flatten: nested V2 data can be deep and recursion limits are an attack surface.
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


def tensor_from_v2(spec: Mapping[str, Any]) -> tuple[str, np.ndarray]:
    """One V2 input or output (``name``, ``shape``, ``datatype``, ``data``) as a named array."""
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise WireError("a V2 tensor needs a non-empty string 'name'")
    datatype = spec.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise WireError(f"input '{name}': datatype {datatype!r} is not one of {', '.join(DATATYPES)}")
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise WireError(f"input '{name}': 'shape' must be a list of non-negative integers, got {shape!r}")
    if "data" not in spec:
        raise WireError(f"input '{name}': no 'data'")
    flat = _flatten(spec["data"])
    expected = math.prod(shape)
    if len(flat) != expected:
        raise WireError(f"input '{name}': shape {shape} needs {expected} values, 'data' has {len(flat)}")
    try:
        if datatype == "BYTES":
            try:
                array = as_bytes_array(np.array(flat, dtype=object)).reshape(shape)
            except WireError as exc:
                raise WireError(f"input '{name}': {exc}") from None
        else:
            kinds = set(map(type, flat))  # one C-level pass; exact types, so a bool is not an int here
            if datatype == "BOOL" and not kinds <= {bool}:
                raise WireError(f"input '{name}': BOOL data must be true/false")
            if datatype != "BOOL" and not kinds <= {int, float}:
                raise WireError(f"input '{name}': {datatype} data must be numbers")
            if datatype != "BOOL" and datatype[:2] != "FP" and float in kinds:
                raise WireError(f"input '{name}': {datatype} data must be integers")
            dtype = DATATYPES[datatype]
            if dtype.kind in "iu" and flat:
                # numpy 1.x wraps out-of-range integers silently (numpy 2 raises); check for both.
                info = np.iinfo(dtype)
                low, high = min(flat), max(flat)
                if low < info.min or high > info.max:
                    raise OverflowError(f"values {low}..{high} are outside {info.min}..{info.max}")
            array = np.array(flat, dtype=dtype).reshape(shape)
    except (ValueError, TypeError, OverflowError) as exc:
        raise WireError(f"input '{name}': data does not fit {datatype}: {exc}") from exc
    return name, array


def tensor_to_v2(name: str, array: np.ndarray) -> dict[str, Any]:
    """A named array in V2 JSON form (flat row-major data)."""
    datatype = datatype_of(array)
    if datatype == "BYTES":
        data: list[Any] = [v.decode("utf-8", "replace") for v in as_bytes_array(array).reshape(-1)]
    else:
        data = array.reshape(-1).tolist()
    return {"name": name, "shape": list(array.shape), "datatype": datatype, "data": data}


def parse_request(body: bytes | str | Mapping[str, Any]) -> tuple[str | None, dict[str, np.ndarray], dict]:
    """A V2 inference request: ``(id or None, tensors by input name, parameters)``."""
    if isinstance(body, bytes | str):
        try:
            body = json.loads(body)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise WireError(f"request is not valid JSON: {exc}") from exc
    if not isinstance(body, Mapping):
        raise WireError("a V2 request must be a JSON object")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise WireError("a V2 request needs a non-empty 'inputs' list")
    tensors: dict[str, np.ndarray] = {}
    for spec in inputs:
        if not isinstance(spec, Mapping):
            raise WireError("each entry of 'inputs' must be an object")
        name, array = tensor_from_v2(spec)
        if name in tensors:
            raise WireError(f"input '{name}' is given twice")
        tensors[name] = array
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise WireError("'id' must be a string")
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, Mapping):
        raise WireError("'parameters' must be an object")
    return request_id, tensors, dict(parameters)


def make_response(
    model_name: str, request_id: str, tensors: Mapping[str, np.ndarray], model_version: str | None = None
) -> dict[str, Any]:
    """A V2 inference response body."""
    body: dict[str, Any] = {"model_name": model_name, "id": request_id}
    if model_version:
        body["model_version"] = model_version
    body["outputs"] = [tensor_to_v2(name, array) for name, array in tensors.items()]
    return body
