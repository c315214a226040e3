"""The record envelope: one Kafka record per request per edge.

Key = request id. Headers carry the request id, the absolute deadline (epoch milliseconds), the W3C
``traceparent``, the topology name and version, and on error results and dead letters the error.
``X-`` headers given by callers travel unchanged. The value is a tensor frame
(:mod:`flowserve.wire.tensors`) or, at a topology's input edge only, a V2 JSON request.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from flowserve.errors import ErrorKind, Failure, WireError
from flowserve.wire.tensors import decode_tensors, encode_tensors
from flowserve.wire.v2 import parse_request

H_ID = "fs-id"
H_DEADLINE = "fs-deadline"
H_TRACEPARENT = "traceparent"
H_TOPOLOGY = "fs-topology"
H_VERSION = "fs-version"
H_ERROR = "fs-error"
#: the machine-readable kind of an error result (:class:`flowserve.errors.ErrorKind`); ``fs-error`` is for people
H_ERROR_KIND = "fs-error-kind"
H_NODE = "fs-node"
H_FORMAT = "fs-format"
H_VISITS = "fs-visits"
H_REPLY_TO = "fs-reply-to"
#: on an output rebuilt from a parity group (flowserve.parity) instead of computed: the group's id
H_RECONSTRUCTED = "fs-reconstructed"
#: on a parity query: its members as JSON ``[[request_id, {header: latin-1 value}], ...]``
H_PARITY_MEMBERS = "fs-parity-members"
#: on a record computed by a registered model version (flowserve.learning): ``<node>=<version>``, so a reply
#: says which version answered it
H_MODEL_VERSION = "fs-model-version"
#: on a request to a many-model node (flowserve.models): the model it asks for; on its answer, ``fs-served-by``
#: names the model that computed it
H_MODEL = "fs-model"
H_SERVED_BY = "fs-served-by"
#: on a request: ``1`` asks the topology's explain side branch (flowserve.explain) to explain it, sampled or not
H_EXPLAIN = "fs-explain"

#: Headers that are not copied from an input record to the records a node derives from it.
_NOT_INHERITED = frozenset({H_ERROR, H_ERROR_KIND, H_NODE})

Headers = list[tuple[str, bytes]]


def new_request_id() -> str:
    """A random 128-bit request id, as 32 hex digits."""
    return os.urandom(16).hex()


def new_traceparent() -> str:
    """A W3C ``traceparent`` for a new, sampled trace: random trace id and parent span id."""
    r = os.urandom(24).hex()
    return f"00-{r[:32]}-{r[32:]}-01"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class Envelope:
    """A decoded record: the request it belongs to, its tensors, and its metadata headers."""

    request_id: str
    tensors: dict[str, np.ndarray]
    headers: dict[str, bytes] = field(default_factory=dict)

    @property
    def deadline_ms(self) -> int | None:
        return deadline_of(self.headers.get(H_DEADLINE))

    @property
    def error(self) -> Failure | None:
        """Why the request failed upstream, when this record is an error result."""
        return failure_of(self.headers)

    def expired(self, at_ms: int | None = None) -> bool:
        deadline = self.deadline_ms
        return deadline is not None and (at_ms if at_ms is not None else now_ms()) > deadline


def failure_of(headers: Mapping[str, bytes]) -> Failure | None:
    """The failure an error result's headers carry (``fs-error`` and ``fs-error-kind``), None when there is none."""
    raw = headers.get(H_ERROR)
    if raw is None:
        return None
    return Failure(ErrorKind.parse(headers.get(H_ERROR_KIND)), raw.decode("utf-8", "replace"))


def error_headers(failure: Failure, node: str) -> dict[str, bytes]:
    """The headers that make a record an error result: the reason (capped), its kind and the node."""
    return {H_ERROR: failure.reason.encode()[:4096], H_ERROR_KIND: failure.kind.value.encode(), H_NODE: node.encode()}


def deadline_of(raw: bytes | None) -> int | None:
    """The ``fs-deadline`` header as epoch ms; None when absent or unreadable (never raises)."""
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def inherit(headers: Mapping[str, bytes], **extra: bytes) -> Headers:
    """Headers for a record derived from one with ``headers``: metadata carries over, errors do not."""
    if not extra and H_ERROR not in headers and H_NODE not in headers:
        return list(headers.items())  # the common case, once per record on the hot path
    out = [(k, v) for k, v in headers.items() if k not in _NOT_INHERITED and k not in extra]
    out.extend(extra.items())
    return out


def make_headers(
    request_id: str,
    *,
    topology: str,
    version: str = "1",
    deadline_ms: int | None = None,
    traceparent: str | None = None,
    extra: Mapping[str, str | bytes] | None = None,
) -> Headers:
    """Headers for a new request entering a topology."""
    headers: Headers = [(H_ID, request_id.encode()), (H_TOPOLOGY, topology.encode()), (H_VERSION, version.encode())]
    if deadline_ms is not None:
        headers.append((H_DEADLINE, str(int(deadline_ms)).encode()))
    if traceparent:
        headers.append((H_TRACEPARENT, traceparent.encode()))
    for key, value in (extra or {}).items():
        headers.append((key, value.encode() if isinstance(value, str) else value))
    return headers


def header_dict(raw: Sequence[tuple[str, bytes]] | None) -> dict[str, bytes]:
    return dict(raw) if raw else {}


def decode_record(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]] | None,
                  *, accept_json: bool = False) -> Envelope:
    """Decode a consumed record. ``accept_json`` allows a V2 JSON request as the value (input edges)."""
    hdrs = header_dict(headers)
    request_id = key.decode("utf-8", "replace") if key else None
    if not request_id and H_ID in hdrs:
        request_id = hdrs[H_ID].decode("utf-8", "replace")
    if value is None:
        raise WireError("record has no value", request_id=request_id)
    if hdrs.get(H_ERROR) is not None:
        return Envelope(request_id or "", {}, hdrs)
    if accept_json and value[:1] == b"{":
        json_id, tensors, parameters = parse_request(value)
        request_id = request_id or json_id
        hdrs.setdefault(H_FORMAT, b"json")
        timeout = parameters.get("timeout_ms")
        if isinstance(timeout, int | float) and math.isfinite(timeout) and H_DEADLINE not in hdrs:
            hdrs[H_DEADLINE] = str(now_ms() + int(timeout)).encode()
    else:
        try:
            tensors = decode_tensors(value)
        except WireError as exc:
            raise WireError(str(exc), request_id=request_id) from None
    if not request_id:
        raise WireError("record has neither a key nor an 'fs-id' header nor a JSON 'id'")
    hdrs[H_ID] = request_id.encode()
    return Envelope(request_id, tensors, hdrs)


def encode_value(tensors: Mapping[str, np.ndarray]) -> bytes:
    return encode_tensors(tensors)
