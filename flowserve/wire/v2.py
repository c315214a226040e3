"""The Open Inference Protocol V2 codec: tensors, requests and responses in JSON and the binary extension.

The one place where V2 bodies are parsed and built, for every edge that speaks V2: a topology's Kafka
input edge (:func:`parse_request`, :func:`make_response`), the gateway (:func:`parse_infer`,
:func:`encode_response`) and the HTTP client (:func:`build_request`, :func:`decode_response`).

With the binary tensor data extension a body is a JSON header of ``Inference-Header-Content-Length``
bytes followed by the raw bytes of every tensor whose ``parameters.binary_data_size`` is set, in order.
The raw layout is a tensor frame's payload (:func:`encode_raw`, :func:`decode_raw`): little-endian
row-major values, and for BYTES a u32 length before each element. Every decoder here takes untrusted
bytes and raises only :class:`~flowserve.errors.WireError`::

    >>> import numpy as np
    >>> body, headers = build_request({"x": np.array([[1, 2]], np.int32)}, binary=True, request_id="r1")
    >>> parsed = parse_infer(body, headers["Inference-Header-Content-Length"])
    >>> parsed.id, parsed.tensors["x"].tolist()
    ('r1', [[1, 2]])
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowserve.errors import WireError
from flowserve.wire import jsoncodec
from flowserve.wire.tensors import DATATYPES, as_bytes_array, datatype_of, encode_payload

#: The binary extension's header (lower-cased, as HTTP header lookups here use it).
HEADER_LENGTH = "inference-header-content-length"
_U32 = struct.Struct("<I")

# -- tensors ----------------------------------------------------------------------------------------


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


def _header(spec: Mapping[str, Any]) -> tuple[str, str, list[int]]:
    """A V2 tensor's checked ``name``, ``datatype`` and ``shape`` (JSON and binary tensors alike)."""
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise WireError("a V2 tensor needs a non-empty string 'name'")
    datatype = spec.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise WireError(f"input '{name}': datatype {datatype!r} is not one of {', '.join(DATATYPES)}")
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise WireError(f"input '{name}': 'shape' must be a list of non-negative integers, got {shape!r}")
    return name, datatype, shape


def tensor_from_v2(spec: Mapping[str, Any]) -> tuple[str, np.ndarray]:
    """One V2 input or output (``name``, ``shape``, ``datatype``, ``data``) as a named array."""
    name, datatype, shape = _header(spec)
    if "data" not in spec:
        raise WireError(f"input '{name}': no 'data'")
    flat = _flatten(spec["data"])
    expected = math.prod(shape)
    if len(flat) != expected:
        raise WireError(f"input '{name}': shape {shape} needs {expected} values, 'data' has {len(flat)}")
    try:
        if datatype == "BYTES":
            if _content_type(spec) == "base64":  # MLServer's codec: binary bytes survive JSON as base64
                flat = _unbase64(name, flat)
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


def _content_type(spec: Mapping[str, Any]) -> str | None:
    parameters = spec.get("parameters")
    return parameters.get("content_type") if isinstance(parameters, Mapping) else None


def _unbase64(name: str, flat: list[Any]) -> list[bytes]:
    """The elements of a BYTES tensor sent with ``parameters.content_type: base64``, decoded."""
    try:
        return [base64.b64decode(v, validate=True) for v in flat]
    except (binascii.Error, ValueError, TypeError) as exc:
        raise WireError(f"input '{name}': content_type base64, but an element is not base64: {exc}") from None


def tensor_to_v2(name: str, array: np.ndarray) -> dict[str, Any]:
    """A named array in V2 JSON form (flat row-major data)."""
    datatype = datatype_of(array)
    if datatype == "BYTES":
        data: list[Any] = [v.decode("utf-8", "replace") for v in as_bytes_array(array).reshape(-1)]
    else:
        data = array.reshape(-1).tolist()
    return {"name": name, "shape": list(array.shape), "datatype": datatype, "data": data}


def encode_raw(array: np.ndarray) -> bytes:
    """The binary extension's layout of a tensor (BYTES: a u32 length before each element)."""
    return encode_payload(array)


def decode_raw(datatype: str, shape: Sequence[int], raw: bytes | memoryview, *,
               label: str = "tensor") -> np.ndarray:
    """A tensor from its binary-extension bytes; ``label`` (e.g. ``input 'x'``) starts every error message.

    Safe on untrusted bytes: every length is checked before use, so short or stray data, an unknown
    datatype or an impossible shape raise :class:`WireError`, never ``struct.error`` or a huge allocation.
    Fixed-width arrays are read-only views of ``raw``.
    """
    if datatype not in DATATYPES:
        raise WireError(f"{label}: datatype {datatype!r} is not one of {', '.join(DATATYPES)}")
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise WireError(f"{label}: 'shape' must be a list of non-negative integers, got {list(shape)!r}")
    count, end = math.prod(shape), len(raw)
    if datatype == "BYTES":
        items: list[bytes] = []
        pos = 0
        for i in range(count):  # ends after at most end / 4 rounds, however large ``count`` claims to be
            if pos + 4 > end:
                raise WireError(f"{label}: binary BYTES element {i} runs past its binary_data_size")
            (n,) = _U32.unpack_from(raw, pos)
            pos += 4
            if pos + n > end:
                raise WireError(f"{label}: binary BYTES element {i} runs past its binary_data_size")
            items.append(bytes(raw[pos : pos + n]))
            pos += n
        if pos != end:
            raise WireError(f"{label}: {end - pos} stray bytes after {count} BYTES elements")
        flat = np.empty(count, dtype=object)
        flat[:] = items
    else:
        dtype = DATATYPES[datatype]
        if count * dtype.itemsize != end:
            raise WireError(f"{label}: shape {list(shape)} of {datatype} needs {count * dtype.itemsize} bytes, "
                            f"binary_data_size is {end}")
        flat = np.frombuffer(raw, dtype=dtype)
        if datatype == "BOOL" and count and flat.view(np.uint8).max() > 1:
            raise WireError(f"{label}: BOOL binary data holds bytes other than 0 and 1")
    try:
        return flat.reshape(shape)
    except ValueError as exc:  # e.g. [0, 2**62, 2**62]: no elements, but numpy refuses the shape
        raise WireError(f"{label}: shape {list(shape)} is not a valid array shape: {exc}") from None


# -- bodies -----------------------------------------------------------------------------------------


def _split(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """A body's JSON header and its binary part (empty without ``Inference-Header-Content-Length``)."""
    if header_length is None:
        return body, memoryview(b"")
    if not (header_length.isascii() and header_length.isdigit()) or int(header_length) > len(body):
        raise WireError(f"Inference-Header-Content-Length {header_length!r} does not fit a body of "
                        f"{len(body)} bytes")
    n = int(header_length)
    return body[:n], memoryview(body)[n:]


def _object(body: bytes | str | Mapping[str, Any], what: str, kind: str = "request") -> Mapping[str, Any]:
    if isinstance(body, bytes | str):
        try:
            body = jsoncodec.loads(body)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise WireError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(body, Mapping):
        raise WireError(f"a V2 {kind} must be a JSON object")
    return body


def _tensors(specs: list[Any], binary: memoryview | None, what: str) -> dict[str, np.ndarray]:
    """Named tensors of a request's ``inputs`` or a response's ``outputs`` (``what``: "input" or "output").

    With ``binary`` (the extension), a tensor with a ``binary_data_size`` is read from it, in order.
    """
    tensors: dict[str, np.ndarray] = {}
    pos = 0
    for spec in specs:
        if not isinstance(spec, Mapping):
            raise WireError(f"each entry of '{what}s' must be an object")
        params = spec.get("parameters") if binary is not None else None
        size = params.get("binary_data_size") if isinstance(params, Mapping) else None
        if size is None:
            name, array = tensor_from_v2(spec)
        else:
            assert binary is not None
            name, datatype, shape = _header(spec)
            if not isinstance(size, int) or size < 0 or pos + size > len(binary):
                raise WireError(f"{what} '{name}': binary_data_size {size!r} runs past the binary part "
                                f"({len(binary) - pos} bytes left)")
            array = decode_raw(datatype, shape, binary[pos : pos + size], label=f"{what} '{name}'")
            pos += size
        if name in tensors:
            raise WireError(f"{what} '{name}' is given twice")
        tensors[name] = array
    if binary is not None and pos != len(binary):
        raise WireError(f"{len(binary) - pos} bytes of binary data after the last binary {what}")
    return tensors


def _inputs(inputs: Any, binary: memoryview | None) -> dict[str, np.ndarray]:
    """A request's ``inputs``; with ``binary`` (the extension), those with a binary_data_size are read from it."""
    if not isinstance(inputs, list) or not inputs:
        raise WireError("a V2 request needs a non-empty 'inputs' list")
    return _tensors(inputs, binary, "input")


def _parameters(doc: Mapping[str, Any]) -> dict[str, Any]:
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, Mapping):
        raise WireError("'parameters' must be an object")
    return dict(parameters)


def parse_request(body: bytes | str | Mapping[str, Any]) -> tuple[str | None, dict[str, np.ndarray], dict]:
    """A V2 JSON inference request (a topology's Kafka input edge): ``(id or None, tensors, parameters)``."""
    doc = _object(body, "request")
    tensors = _inputs(doc.get("inputs"), None)
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise WireError("'id' must be a string")
    return request_id, tensors, _parameters(doc)


@dataclass(slots=True)
class InferRequest:
    """A parsed, validated V2 request."""

    id: str | None
    tensors: dict[str, np.ndarray]
    parameters: dict[str, Any]
    #: output name -> wants binary data; empty = every output, in the request-level binary mode.
    outputs: dict[str, bool] = field(default_factory=dict)
    binary_outputs: bool = False


def parse_infer(body: bytes, header_length: str | None) -> InferRequest:
    """Parse a V2 request body (JSON, or JSON + binary when ``header_length`` is given)."""
    head, binary = _split(body, header_length)
    doc = _object(head, "request body")
    tensors = _inputs(doc.get("inputs"), binary)
    request_id = doc.get("id")
    if request_id is not None and (not isinstance(request_id, str) or not request_id):
        raise WireError("'id' must be a non-empty string")
    parameters = _parameters(doc)
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
    return InferRequest(request_id, tensors, parameters, wanted, binary_all)


def make_response(
    model_name: str, request_id: str, tensors: Mapping[str, np.ndarray], model_version: str | None = None
) -> dict[str, Any]:
    """A V2 inference response body in JSON form (a topology's answer to a JSON request on Kafka)."""
    body: dict[str, Any] = {"model_name": model_name, "id": request_id}
    if model_version:
        body["model_version"] = model_version
    body["outputs"] = [tensor_to_v2(name, array) for name, array in tensors.items()]
    return body


def _binary_spec(name: str, array: np.ndarray, raw: bytes) -> dict[str, Any]:
    return {"name": name, "shape": list(array.shape), "datatype": datatype_of(array),
            "parameters": {"binary_data_size": len(raw)}}


def encode_response(model: str, version: str, request_id: str, tensors: Mapping[str, np.ndarray],
                    request: InferRequest, parameters: Mapping[str, Any] | None = None) -> tuple[bytes, int | None]:
    """The response body and, when some output is binary, the JSON header's length. ``parameters``: the
    response's ``parameters`` object (e.g. ``reconstructed``), left out when empty."""
    names = list(request.outputs) or list(tensors)
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    finite = True
    for name in names:
        array = tensors.get(name)
        if array is None:
            continue  # conditional routing: this output was not emitted for this request
        if request.outputs.get(name, request.binary_outputs):
            raw = encode_raw(array)
            outputs.append(_binary_spec(name, array, raw))
            blobs.append(raw)
        else:
            outputs.append(tensor_to_v2(name, array))
            finite = finite and (array.dtype.kind != "f" or bool(np.isfinite(array).all()))
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "id": request_id}
    if parameters:
        doc["parameters"] = dict(parameters)
    doc["outputs"] = outputs
    body = jsoncodec.dumps(doc, finite=finite)
    if not blobs:
        return body, None
    return body + b"".join(blobs), len(body)


def build_request(tensors: Mapping[str, np.ndarray], *, request_id: str | None = None, binary: bool = False,
                  binary_outputs: bool = False, outputs: list[str] | None = None,
                  parameters: Mapping[str, Any] | None = None) -> tuple[bytes, dict[str, str]]:
    """The body and extra HTTP headers of a V2 inference request."""
    doc: dict[str, Any] = {}
    if request_id is not None:
        doc["id"] = request_id
    params = dict(parameters or {})
    if binary_outputs:
        params["binary_data_output"] = True
    if params:
        doc["parameters"] = params
    inputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, array in tensors.items():
        array = np.asarray(array)
        if binary:
            raw = encode_raw(array)
            inputs.append(_binary_spec(name, array, raw))
            blobs.append(raw)
        else:
            inputs.append(tensor_to_v2(name, array))
    doc["inputs"] = inputs
    if outputs is not None:
        doc["outputs"] = [{"name": n, "parameters": {"binary_data": binary_outputs}} for n in outputs]
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(blobs), {"Content-Type": "application/octet-stream",
                                    "Inference-Header-Content-Length": str(len(head))}


def decode_response(body: bytes | str | Mapping[str, Any],
                    header_length: str | None = None) -> dict[str, np.ndarray]:
    """The output tensors of a V2 response, by name: JSON ``data``, or binary after the JSON header."""
    head: bytes | str | Mapping[str, Any] = body
    binary = memoryview(b"")
    if isinstance(body, bytes):
        head, binary = _split(body, header_length)
    doc = _object(head, "response", "response")
    outputs = doc.get("outputs", [])
    if not isinstance(outputs, list):
        raise WireError("a V2 response's 'outputs' must be a list")
    return _tensors(outputs, binary, "output")


__all__ = [
    "HEADER_LENGTH",
    "InferRequest",
    "build_request",
    "decode_raw",
    "decode_response",
    "encode_raw",
    "encode_response",
    "make_response",
    "parse_infer",
    "parse_request",
    "tensor_from_v2",
    "tensor_to_v2",
]
