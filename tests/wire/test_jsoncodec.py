"""The V2 JSON codec reads and writes what the standard library did, with orjson or without."""

from __future__ import annotations

import json

import numpy as np

from flowserve.wire import jsoncodec
from flowserve.wire.v2 import InferRequest, encode_response


def test_reads_what_json_reads() -> None:
    for text in ['{"a": [1, 2.5, "x", -9223372036854775808, 18446744073709551615]}', '{"x": NaN, "y": -Infinity}']:
        assert repr(jsoncodec.loads(text)) == repr(json.loads(text))
        assert repr(jsoncodec.loads(text.encode())) == repr(json.loads(text))
    # beyond 64 bits orjson gives the nearest float (json an int): refused by every V2 integer datatype
    assert float(jsoncodec.loads("[123456789012345678901234567890]")[0]) == 1.2345678901234568e29


def test_refuses_what_json_refuses() -> None:
    for text in ["{", "[1,]", b"\xff"]:
        try:
            jsoncodec.loads(text)
        except ValueError:
            continue
        raise AssertionError(f"{text!r} parsed")


def test_writes_compact_json_and_non_finite_as_before() -> None:
    assert jsoncodec.dumps({"a": [1, 2.5]}) == b'{"a":[1,2.5]}'
    assert jsoncodec.dumps({"big": 2**70}) == json.dumps({"big": 2**70}, separators=(",", ":")).encode()
    assert jsoncodec.dumps({"x": float("nan")}, finite=False) == b'{"x":NaN}'
    request = InferRequest(id=None, tensors={}, outputs={}, binary_outputs=False, parameters={})
    body, _ = encode_response("m", "1", "r", {"y": np.array([1.0, np.nan], np.float32)}, request)
    assert b"NaN" in body
    assert json.loads(body)["outputs"][0]["data"][0] == 1.0
