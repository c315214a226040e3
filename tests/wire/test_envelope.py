"""Decoding consumed records into envelopes, and the headers derived records carry."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flowserve.errors import ErrorKind, Failure, WireError
from flowserve.wire import envelope as envelope_module
from flowserve.wire.envelope import (
    H_DEADLINE,
    H_ERROR,
    H_ERROR_KIND,
    H_FORMAT,
    H_ID,
    H_NODE,
    H_TOPOLOGY,
    H_TRACEPARENT,
    H_VERSION,
    Envelope,
    decode_record,
    encode_value,
    error_headers,
    failure_of,
    inherit,
    make_headers,
)
from flowserve.wire.tensors import encode_tensors

NOW = 1_700_000_000_000
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(envelope_module, "now_ms", lambda: NOW)
    return NOW


def frame() -> bytes:
    return encode_tensors({"x": np.arange(4, dtype=np.float32).reshape(1, 4)})


def v2_body(**extra: object) -> bytes:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}], **extra}
    return json.dumps(body).encode()


def test_make_headers() -> None:
    headers = make_headers("r1", topology="digits", version="7", deadline_ms=123.9, traceparent=TRACE,
                           extra={"X-User": "ann", "X-Raw": b"\x00"})
    assert headers == [
        (H_ID, b"r1"), (H_TOPOLOGY, b"digits"), (H_VERSION, b"7"), (H_DEADLINE, b"123"),
        (H_TRACEPARENT, TRACE.encode()), ("X-User", b"ann"), ("X-Raw", b"\x00"),
    ]
    assert make_headers("r2", topology="t") == [(H_ID, b"r2"), (H_TOPOLOGY, b"t"), (H_VERSION, b"1")]


def test_decode_record_with_key_and_headers() -> None:
    headers = make_headers("ignored", topology="digits", deadline_ms=NOW + 5, extra={"X-User": "ann"})
    env = decode_record(b"req-1", frame(), headers)
    assert env.request_id == "req-1"
    assert list(env.tensors) == ["x"] and env.tensors["x"].tolist() == [[0.0, 1.0, 2.0, 3.0]]
    assert env.headers[H_ID] == b"req-1"  # the key wins and is written back
    assert env.headers["X-User"] == b"ann"
    assert env.deadline_ms == NOW + 5
    assert env.error is None
    assert not env.expired(NOW + 5) and env.expired(NOW + 6)


def test_request_id_falls_back_to_the_id_header() -> None:
    env = decode_record(None, frame(), [(H_ID, b"from-header")])
    assert env.request_id == "from-header"
    assert decode_record(b"", frame(), [(H_ID, b"h")]).request_id == "h"


def test_missing_request_id_is_an_error() -> None:
    with pytest.raises(WireError, match="record has neither a key nor an 'fs-id' header nor a JSON 'id'"):
        decode_record(None, frame(), None)
    with pytest.raises(WireError, match="neither a key"):
        decode_record(None, v2_body(), [], accept_json=True)


def test_missing_value_is_an_error_naming_the_request() -> None:
    with pytest.raises(WireError, match="request r1: record has no value") as info:
        decode_record(b"r1", None, [])
    assert info.value.request_id == "r1"


def test_bad_frame_error_carries_the_request_id() -> None:
    with pytest.raises(WireError, match="request r1: frame of 3 bytes is too short") as info:
        decode_record(b"r1", b"FST", [])
    assert info.value.request_id == "r1"


def test_json_value_is_rejected_unless_accept_json() -> None:
    with pytest.raises(WireError, match="request r1: not a flowserve tensor frame"):
        decode_record(b"r1", v2_body(), [])


def test_json_value_is_accepted_with_accept_json(frozen_clock: int) -> None:
    env = decode_record(None, v2_body(id="json-id"), [], accept_json=True)
    assert env.request_id == "json-id"
    assert env.headers[H_ID] == b"json-id"
    assert env.headers[H_FORMAT] == b"json"
    assert env.tensors["x"].dtype == np.float32 and env.tensors["x"].tolist() == [[1.0, 2.0]]
    assert env.deadline_ms is None
    keyed = decode_record(b"key-id", v2_body(id="json-id"), [], accept_json=True)
    assert keyed.request_id == "key-id"


def test_frames_still_decode_with_accept_json() -> None:
    assert decode_record(b"r", frame(), [], accept_json=True).tensors["x"].shape == (1, 4)


def test_invalid_json_request_is_a_wire_error() -> None:
    with pytest.raises(WireError, match="a V2 request needs a non-empty 'inputs' list"):
        decode_record(b"r", b'{"inputs": []}', [], accept_json=True)


def test_timeout_ms_sets_a_deadline_header(frozen_clock: int) -> None:
    env = decode_record(b"r", v2_body(parameters={"timeout_ms": 250}), [], accept_json=True)
    assert env.headers[H_DEADLINE] == str(NOW + 250).encode()
    assert env.deadline_ms == NOW + 250
    fractional = decode_record(b"r", v2_body(parameters={"timeout_ms": 99.9}), [], accept_json=True)
    assert fractional.deadline_ms == NOW + 99


def test_timeout_ms_does_not_override_a_deadline_header(frozen_clock: int) -> None:
    env = decode_record(b"r", v2_body(parameters={"timeout_ms": 250}), [(H_DEADLINE, b"42")], accept_json=True)
    assert env.deadline_ms == 42


@pytest.mark.parametrize("timeout", ['"250"', "null", "NaN", "Infinity", "-Infinity", "[1]"])
def test_unusable_timeout_ms_sets_no_deadline(frozen_clock: int, timeout: str) -> None:
    body = v2_body().replace(b'"inputs"', b'"parameters": {"timeout_ms": ' + timeout.encode() + b'}, "inputs"')
    env = decode_record(b"r", body, [], accept_json=True)
    assert H_DEADLINE not in env.headers
    assert env.deadline_ms is None


def test_error_record_decodes_to_an_envelope_with_error() -> None:
    headers = [(H_ID, b"r1"), (H_ERROR, "node 'b': boom \u2603".encode()), (H_ERROR_KIND, b"component_failure"),
               (H_NODE, b"b")]
    env = decode_record(b"r1", b"", headers)
    assert env.request_id == "r1"
    assert env.tensors == {}
    assert env.error == Failure(ErrorKind.COMPONENT_FAILURE, "node 'b': boom \u2603")
    # an error value is never parsed, even when it is not a frame
    assert decode_record(b"r1", b"garbage", headers).error == env.error
    # a reason that is not UTF-8, and an error result without a kind (or with one this version does not know)
    assert decode_record(b"r1", b"", [(H_ERROR, b"\xff")]).error == Failure(ErrorKind.UNKNOWN, "\ufffd")
    assert decode_record(b"r1", b"", [(H_ERROR, b"x"), (H_ERROR_KIND, b"novel")]).error == Failure(ErrorKind.UNKNOWN,
                                                                                                 "x")


def test_error_headers_carry_reason_kind_and_node() -> None:
    headers = error_headers(Failure(ErrorKind.DEADLINE, "late" * 2000), "b")
    assert headers[H_ERROR_KIND] == b"deadline" and headers[H_NODE] == b"b" and len(headers[H_ERROR]) == 4096
    assert failure_of(headers) == Failure(ErrorKind.DEADLINE, ("late" * 2000)[:4096])


def test_unparseable_deadline_header_reads_as_none() -> None:
    env = Envelope("r", {}, {H_DEADLINE: b"soon"})
    assert env.deadline_ms is None
    assert not env.expired(NOW)


def test_inherit_drops_error_and_node_and_applies_extra() -> None:
    headers = {H_ID: b"r1", H_DEADLINE: b"9", H_ERROR: b"boom", H_NODE: b"a", "X-User": b"ann"}
    assert inherit(headers) == [(H_ID, b"r1"), (H_DEADLINE, b"9"), ("X-User", b"ann")]
    derived = inherit(headers, **{H_NODE: b"b", H_DEADLINE: b"5"})
    assert dict(derived) == {H_ID: b"r1", "X-User": b"ann", H_NODE: b"b", H_DEADLINE: b"5"}
    assert len(derived) == 4


def test_encode_value_is_a_tensor_frame() -> None:
    value = encode_value({"x": np.ones(2, dtype=np.int8)})
    assert decode_record(b"r", value, []).tensors["x"].tolist() == [1, 1]
