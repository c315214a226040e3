"""V2 inference requests and responses over HTTP, with the binary tensor data extension.

A request body is JSON, or (binary extension) a JSON header of ``Inference-Header-Content-Length`` bytes
followed by the raw bytes of every input whose ``parameters.binary_data_size`` is set, in input order.
Raw layouts are those of the tensor frame: little-endian row-major values, and for BYTES a u32 length
before each element. Inputs are checked against the topology's input ports before anything is produced.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowserve.component import Port
from flowserve.errors import WireError
from flowserve.wire.tensors import DATATYPES, as_bytes_array, datatype_of
from flowserve.wire.v2 import tensor_from_v2, tensor_to_v2

HEADER_LENGTH = "inference-header-content-length"
_U32 = struct.Struct("<I")


@dataclass(slots=True)
class InferRequest:
    """A parsed, validated V2 request."""

    id: str | None
    tensors: dict[str, np.ndarray]
    parameters: dict[str, Any]
    #: output name -> wants binary data; empty = every output, in the request-level binary mode.
    outputs: dict[str, bool] = field(default_factory=dict)
    binary_outputs: bool = False


def _decode_binary(name: str, datatype: str, shape: list[int], raw: bytes) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        out = np.empty(count, dtype=object)
        pos = 0
        for i in range(count):
            if pos + 4 > len(raw):
                raise WireError(f"input '{name}': binary BYTES element {i} runs past its binary_data_size")
            (n,) = _U32.unpack_from(raw, pos)
            pos += 4
            if pos + n > len(raw):
                raise WireError(f"input '{name}': binary BYTES element {i} runs past its binary_data_size")
            out[i] = raw[pos : pos + n]
            pos += n
        if pos != len(raw):
            raise WireError(f"input '{name}': {len(raw) - pos} stray bytes after {count} BYTES elements")
        return out.reshape(shape)
    dtype = DATATYPES[datatype]
    if count * dtype.itemsize != len(raw):
        raise WireError(f"input '{name}': shape {shape} of {datatype} needs {count * dtype.itemsize} bytes, "
                        f"binary_data_size is {len(raw)}")
    if datatype == "BOOL" and raw.translate(None, b"\x00\x01"):
        raise WireError(f"input '{name}': BOOL binary data holds bytes other than 0 and 1")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def parse_infer(body: bytes, header_length: str | None) -> InferRequest:
    """Parse a V2 request body (JSON, or JSON + binary when ``header_length`` is given)."""
    binary = b""
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise WireError(f"Inference-Header-Content-Length {header_length!r} does not fit a body of "
                            f"{len(body)} bytes")
        n = int(header_length)
        body, binary = body[:n], body[n:]
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise WireError("a V2 request must be a JSON object")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise WireError("a V2 request needs a non-empty 'inputs' list")
    tensors: dict[str, np.ndarray] = {}
    pos = 0
    for spec in inputs:
        if not isinstance(spec, dict):
            raise WireError("each entry of 'inputs' must be an object")
        params = spec.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is not None:
            name = spec.get("name")
            if not isinstance(name, str) or not name:
                raise WireError("a V2 tensor needs a non-empty string 'name'")
            datatype, shape = spec.get("datatype"), spec.get("shape")
            if not isinstance(datatype, str) or datatype not in DATATYPES:
                raise WireError(f"input '{name}': datatype {datatype!r} is not one of {', '.join(DATATYPES)}")
            if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
                raise WireError(f"input '{name}': 'shape' must be a list of non-negative integers, got {shape!r}")
            if not isinstance(size, int) or size < 0 or pos + size > len(binary):
                raise WireError(f"input '{name}': binary_data_size {size!r} runs past the binary part "
                                f"({len(binary) - pos} bytes left)")
            array = _decode_binary(name, datatype, shape, binary[pos : pos + size])
            pos += size
        else:
            name, array = tensor_from_v2(spec)
        if name in tensors:
            raise WireError(f"input '{name}' is given twice")
        tensors[name] = array
    if pos != len(binary):
        raise WireError(f"{len(binary) - pos} bytes of binary data after the last binary input")
    request_id = doc.get("id")
    if request_id is not None and (not isinstance(request_id, str) or not request_id):
        raise WireError("'id' must be a non-empty string")
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise WireError("'parameters' must be an object")
    binary_all = bool(parameters.get("binary_data_output", False))
    wanted: dict[str, bool] = {}
    outputs = doc.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise WireError("'outputs' must be a list")
        for out in outputs:
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise WireError("each entry of 'outputs' must be an object with a 'name'")
            oparams = out.get("parameters") or {}
            wanted[out["name"]] = bool(oparams.get("binary_data", binary_all)) if isinstance(oparams, dict) \
                else binary_all
    return InferRequest(request_id, tensors, dict(parameters), wanted, binary_all)


def check_inputs(tensors: Mapping[str, np.ndarray], ports: Mapping[str, Port]) -> None:
    """Raise :class:`WireError` naming the input unless ``tensors`` match ``ports`` exactly."""
    for name in tensors:
        if name not in ports:
            raise WireError(f"input '{name}' is not an input of this model (inputs: {', '.join(ports)})")
    for name, port in ports.items():
        array = tensors.get(name)
        if array is None:
            raise WireError(f"input '{name}' is missing ({port.datatype} {list(port.shape)})")
        datatype = datatype_of(array)
        if datatype != port.datatype:
            raise WireError(f"input '{name}': datatype {datatype} does not match the model's {port.datatype}")
        if array.ndim != len(port.shape) or any(w != -1 and g != w for g, w in zip(array.shape, port.shape,
                                                                                        strict=True)):
            raise WireError(f"input '{name}': shape {list(array.shape)} does not fit the model's "
                            f"{list(port.shape)} (-1 = any size)")
        if not port.allow_nan and array.dtype.kind == "f" and np.isnan(array).any():
            raise WireError(f"input '{name}' does not accept NaN values")
    rows = {a.shape[0] for a in tensors.values() if a.ndim}
    if len(rows) > 1:
        raise WireError(f"inputs disagree on the batch dimension ({', '.join(map(str, sorted(rows)))} rows)")


def _raw(array: np.ndarray) -> bytes:
    if datatype_of(array) == "BYTES":
        return b"".join(_U32.pack(len(v)) + v for v in as_bytes_array(array).reshape(-1))
    return np.ascontiguousarray(array, dtype=DATATYPES[datatype_of(array)]).tobytes()


def encode_response(model: str, version: str, request_id: str, tensors: Mapping[str, np.ndarray],
                    request: InferRequest) -> tuple[bytes, int | None]:
    """The response body and, when some output is binary, the JSON header's length."""
    names = list(request.outputs) or list(tensors)
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name in names:
        array = tensors.get(name)
        if array is None:
            continue  # conditional routing: this output was not emitted for this request
        if request.outputs.get(name, request.binary_outputs):
            raw = _raw(array)
            outputs.append({"name": name, "shape": list(array.shape), "datatype": datatype_of(array),
                            "parameters": {"binary_data_size": len(raw)}})
            blobs.append(raw)
        else:
            outputs.append(tensor_to_v2(name, array))
    body = json.dumps({"model_name": model, "model_version": version, "id": request_id, "outputs": outputs},
                      separators=(",", ":")).encode()
    if not blobs:
        return body, None
    return body + b"".join(blobs), len(body)
