"""Feedback records: the true outputs of an answered request, written to ``<base>.feedback``.

One format for every writer (the gateway's ``POST /v2/models/{name}/feedback``, ``flowserve`` tools,
and any Kafka client on the asynchronous path): key = the request id, value = V2 JSON::

    {"id": "<request id>", "outputs": [{"name": "label", "datatype": "INT64", "shape": [1], "data": [3]}],
     "parameters": {"context": "tenant-7"}}

``parameters.context`` is optional (per-context model selection). JSON rather than a tensor frame so
that kcat or a console producer can write feedback by hand.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowserve.errors import WireError
from flowserve.wire.envelope import H_ID, now_ms
from flowserve.wire.v2 import decode_response, tensor_to_v2

#: the largest feedback value accepted (bytes): feedback carries labels, not payloads.
MAX_FEEDBACK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Feedback:
    """The truth for one request: its id, the true outputs by name, and an optional context."""

    request_id: str
    outputs: dict[str, np.ndarray]
    context: str | None = None
    ts_ms: int = field(default_factory=now_ms)


def encode_feedback(request_id: str, outputs: Mapping[str, np.ndarray], *,
                    context: str | None = None) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """``(key, value, headers)`` of the feedback record for ``request_id``."""
    doc: dict[str, Any] = {"id": request_id,
                           "outputs": [tensor_to_v2(name, np.asarray(a)) for name, a in outputs.items()]}
    if context is not None:
        doc["parameters"] = {"context": context}
    value = json.dumps(doc, separators=(",", ":")).encode()
    return request_id.encode(), value, [(H_ID, request_id.encode())]


def decode_feedback(key: bytes | None, value: bytes | str | Mapping[str, Any] | None,
                    timestamp_ms: int | None = None) -> Feedback:
    """Read one feedback record; raises :class:`WireError` (kind ``invalid_input``) saying what is wrong."""
    if value is None:
        raise WireError("feedback record has no value")
    if isinstance(value, bytes | str) and len(value) > MAX_FEEDBACK_BYTES:
        raise WireError(f"feedback record is {len(value)} bytes; the limit is {MAX_FEEDBACK_BYTES}")
    doc: Any = value
    if isinstance(value, bytes | str):
        try:
            doc = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise WireError(f"feedback is not valid JSON: {exc}") from None
    if not isinstance(doc, Mapping):
        raise WireError("feedback must be a JSON object")
    request_id = doc.get("id") or (key.decode("utf-8", "replace") if key else None)
    if not isinstance(request_id, str) or not request_id:
        raise WireError("feedback needs the request id: a JSON 'id' or the record key")
    outputs = doc.get("outputs")
    if not isinstance(outputs, list) or not outputs:
        raise WireError("feedback needs 'outputs': a non-empty list of V2 tensors", request_id=request_id)
    try:
        tensors = decode_response(doc)
    except WireError as exc:
        raise WireError(f"feedback: {exc}", request_id=request_id) from None
    for name, array in tensors.items():
        if array.dtype.kind == "f" and not bool(np.isfinite(array).all()):
            raise WireError(f"feedback output {name!r} holds a non-finite number", request_id=request_id)
    params = doc.get("parameters") or {}
    context = params.get("context") if isinstance(params, Mapping) else None
    if context is not None and not isinstance(context, str):
        raise WireError("feedback 'parameters.context' must be a string", request_id=request_id)
    ts = timestamp_ms if timestamp_ms is not None and math.isfinite(timestamp_ms) else now_ms()
    return Feedback(request_id, tensors, context, int(ts))


__all__ = ["MAX_FEEDBACK_BYTES", "Feedback", "decode_feedback", "encode_feedback"]
