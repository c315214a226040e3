"""Property tests of the wire decoders, which read untrusted input: any input gives a result or a WireError,
never a crash (another exception) or a hang. Each decoder also round-trips what its encoder wrote."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowserve.errors import WireError
from flowserve.wire.envelope import decode_record
from flowserve.wire.tensors import DATATYPES, decode_tensors, encode_tensors
from flowserve.wire.v2 import decode_raw, decode_response, encode_raw, parse_infer, parse_request

PROPERTIES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_NUMERIC = [d for d in DATATYPES if d != "BYTES"]


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    datatype = draw(st.sampled_from(list(DATATYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)))
    count = int(np.prod(shape))
    if datatype == "BYTES":
        values = draw(st.lists(st.binary(max_size=8), min_size=count, max_size=count))
        out = np.empty(count, dtype=object)
        out[:] = values
        return out.reshape(shape)
    size = count * DATATYPES[datatype].itemsize
    raw = draw(st.binary(min_size=size, max_size=size))
    if datatype == "BOOL":  # numpy bools hold 0 or 1 (frombuffer would keep any byte)
        return (np.frombuffer(raw, dtype=np.uint8) % 2).astype(bool).reshape(shape)
    return np.frombuffer(raw, dtype=DATATYPES[datatype]).reshape(shape)


names = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=12)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind == "O" or b.dtype.kind == "O":
        return a.shape == b.shape and [bytes(x) for x in a.reshape(-1)] == [bytes(x) for x in b.reshape(-1)]
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# -- the binary tensor frame --------------------------------------------------------------------------

@PROPERTIES
@given(st.dictionaries(names, arrays(), min_size=1, max_size=3))
def test_frames_round_trip(tensors: dict[str, np.ndarray]) -> None:
    decoded = decode_tensors(encode_tensors(tensors))
    assert list(decoded) == list(tensors)
    assert all(_same(decoded[k], v) for k, v in tensors.items())


@PROPERTIES
@given(st.binary(max_size=256))
def test_any_bytes_decode_to_tensors_or_a_wire_error(data: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_tensors(data)


@PROPERTIES
@given(st.dictionaries(names, arrays(), min_size=1, max_size=2), st.data())
def test_a_damaged_frame_decodes_or_is_a_wire_error(tensors: dict[str, np.ndarray], data: st.DataObject) -> None:
    frame = bytearray(encode_tensors(tensors))
    for _ in range(data.draw(st.integers(1, 4))):
        frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(frame)))
    with contextlib.suppress(WireError):
        decode_tensors(bytes(frame[:cut]))


@PROPERTIES
@given(st.one_of(st.none(), st.binary(max_size=40)), st.one_of(st.none(), st.binary(max_size=200)),
       st.lists(st.tuples(st.text(max_size=12), st.binary(max_size=40)), max_size=5), st.booleans())
def test_any_record_is_an_envelope_or_a_wire_error(key: bytes | None, value: bytes | None,
                                                   headers: list[tuple[str, bytes]], accept_json: bool) -> None:
    with contextlib.suppress(WireError):
        decode_record(key, value, headers, accept_json=accept_json)


# -- the V2 codec -------------------------------------------------------------------------------------

@PROPERTIES
@given(arrays())
def test_raw_layouts_round_trip(array: np.ndarray) -> None:
    from flowserve.wire.tensors import datatype_of

    datatype = datatype_of(array)
    assert _same(decode_raw(datatype, list(array.shape), encode_raw(array)), array)


@PROPERTIES
@given(st.sampled_from(list(DATATYPES)), st.lists(st.integers(0, 2**40), max_size=3), st.binary(max_size=64))
def test_any_raw_bytes_decode_or_are_a_wire_error(datatype: str, shape: list[int], raw: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_raw(datatype, shape, raw)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def v2_requests(draw: st.DrawFn) -> Any:
    """Mostly well-formed V2 requests with hostile parts: wrong types, shapes, datatypes and data."""
    inputs = []
    for _ in range(draw(st.integers(0, 3))):
        spec: dict[str, Any] = {
            "name": draw(st.one_of(names, json_values)),
            "datatype": draw(st.one_of(st.sampled_from(list(DATATYPES)), json_values)),
            "shape": draw(st.one_of(st.lists(st.integers(-2, 5), max_size=3), json_values)),
            "data": draw(st.one_of(st.lists(st.one_of(st.integers(-300, 300), st.floats(), st.booleans(),
                                                      st.text(max_size=4)), max_size=12), json_values)),
        }
        if draw(st.booleans()):
            spec["parameters"] = draw(st.one_of(st.fixed_dictionaries({"binary_data_size": st.integers(-2, 64)}),
                                                json_values))
        inputs.append(spec)
    doc: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        doc["id"] = draw(json_values)
    if draw(st.booleans()):
        doc["parameters"] = draw(json_values)
    if draw(st.booleans()):
        doc["outputs"] = draw(st.one_of(st.lists(st.fixed_dictionaries({"name": names}), max_size=2), json_values))
    return draw(st.one_of(st.just(doc), json_values))


@PROPERTIES
@given(v2_requests(), st.binary(max_size=64), st.one_of(st.none(), st.integers(-5, 400).map(str), st.text(max_size=5)))
def test_any_v2_request_parses_or_is_a_wire_error(doc: Any, binary: bytes, header_length: str | None) -> None:
    body = json.dumps(doc).encode()
    for parse in (lambda: parse_request(body), lambda: parse_infer(body + binary, header_length),
                  lambda: decode_response(body + binary, header_length)):
        with contextlib.suppress(WireError):
            parse()


@PROPERTIES
@given(st.binary(max_size=200))
def test_any_body_bytes_parse_or_are_a_wire_error(body: bytes) -> None:
    for parse in (lambda: parse_request(body), lambda: parse_infer(body, None), lambda: decode_response(body)):
        with contextlib.suppress(WireError):
            parse()
