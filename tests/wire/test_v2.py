"""The Open Inference Protocol V2 codec: JSON tensors, requests and responses, and the binary extension."""

from __future__ import annotations

import base64
import json
import random
import struct

import numpy as np
import pytest

from flowserve.errors import WireError
from flowserve.wire.tensors import DATATYPES, decode_tensors, encode_tensors
from flowserve.wire.v2 import (
    InferRequest,
    build_request,
    decode_raw,
    decode_response,
    encode_raw,
    encode_response,
    make_response,
    parse_infer,
    parse_request,
    tensor_from_v2,
    tensor_to_v2,
)

#: Per datatype, flat JSON values (extremes included) for a [2, 2] tensor.
VALUES: dict[str, list] = {
    "BOOL": [True, False, False, True],
    "UINT8": [0, 1, 254, 255],
    "UINT16": [0, 1, 65534, 65535],
    "UINT32": [0, 1, 2**32 - 2, 2**32 - 1],
    "UINT64": [0, 1, 2**64 - 2, 2**64 - 1],
    "INT8": [-128, -1, 0, 127],
    "INT16": [-(2**15), -1, 0, 2**15 - 1],
    "INT32": [-(2**31), -1, 0, 2**31 - 1],
    "INT64": [-(2**63), -1, 0, 2**63 - 1],
    "FP16": [0.5, -1.5, 65504.0, 0],
    "FP32": [0.25, -3.5, 2.0**100, 7],
    "FP64": [0.1, -1e300, 5e-324, 2],
    "BYTES": ["", "caf\u00e9", "a b", "\u2603"],
}


def spec(datatype: str, shape: list[int], data: object, name: str = "x") -> dict:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def request(*inputs: dict, **extra: object) -> dict:
    return {"inputs": list(inputs), **extra}


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_every_datatype_round_trips_through_v2(datatype: str) -> None:
    flat = VALUES[datatype]
    name, array = tensor_from_v2(spec(datatype, [2, 2], flat))
    assert name == "x"
    assert array.shape == (2, 2)
    if datatype == "BYTES":
        assert array.dtype == object
        assert array.reshape(-1).tolist() == [v.encode() for v in flat]
    else:
        assert array.dtype == DATATYPES[datatype]
        assert array.reshape(-1).tolist() == flat
    back = tensor_to_v2("x", array)
    assert back == {"name": "x", "shape": [2, 2], "datatype": datatype, "data": flat}
    assert json.loads(json.dumps(back)) == back


@pytest.mark.parametrize("datatype", ["INT32", "FP32", "BOOL", "BYTES"])
def test_nested_and_flat_data_give_the_same_array(datatype: str) -> None:
    flat = VALUES[datatype]
    nested = [flat[:2], flat[2:]]
    _, from_flat = tensor_from_v2(spec(datatype, [2, 2], flat))
    _, from_nested = tensor_from_v2(spec(datatype, [2, 2], nested))
    assert from_nested.dtype == from_flat.dtype
    assert from_nested.tolist() == from_flat.tolist()


def test_deeply_nested_data_is_flattened_in_row_major_order() -> None:
    _, array = tensor_from_v2(spec("INT16", [2, 2, 2], [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]))
    assert array.tolist() == [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]
    very_deep: list = [7]
    for _ in range(5000):  # far past the recursion limit: the flatten is iterative
        very_deep = [very_deep]
    _, one = tensor_from_v2(spec("INT8", [1], very_deep))
    assert one.tolist() == [7]


def test_scalar_and_empty_tensors() -> None:
    _, scalar = tensor_from_v2(spec("FP64", [], [2.5]))
    assert scalar.shape == () and scalar.item() == 2.5
    _, bare = tensor_from_v2(spec("INT32", [], 4))
    assert bare.shape == () and bare.item() == 4
    _, empty = tensor_from_v2(spec("FP32", [0, 64], []))
    assert empty.shape == (0, 64) and empty.dtype == np.float32
    assert tensor_to_v2("e", empty) == {"name": "e", "shape": [0, 64], "datatype": "FP32", "data": []}
    assert tensor_to_v2("s", scalar)["shape"] == []


def test_to_v2_replaces_non_utf8_bytes_and_keeps_nan() -> None:
    out = tensor_to_v2("b", np.array([b"ok", b"\xff"], dtype=object))
    assert out["data"] == ["ok", "\ufffd"]
    floats = tensor_to_v2("f", np.array([np.nan, np.inf], dtype=np.float32))["data"]
    assert np.isnan(floats[0]) and floats[1] == float("inf")


@pytest.mark.parametrize(("shape", "data", "message"), [
    ([2, 2], [1, 2, 3], r"shape \[2, 2\] needs 4 values, 'data' has 3"),
    ([3], [[1, 2], [3, 4]], r"shape \[3\] needs 3 values, 'data' has 4"),
    ([], [], r"shape \[\] needs 1 values, 'data' has 0"),
    ([2**62, 2**62], [1], "needs 21267647932558653966460912964485513216 values"),
])
def test_shape_and_data_count_mismatch(shape: list[int], data: list, message: str) -> None:
    with pytest.raises(WireError, match=message):
        tensor_from_v2(spec("INT32", shape, data))


@pytest.mark.parametrize("shape", [None, "2", [2, -1], [1.0], [[2]]])
def test_bad_shape_is_rejected(shape: object) -> None:
    with pytest.raises(WireError, match="'shape' must be a list of non-negative integers"):
        tensor_from_v2(spec("INT32", shape, [1, 2]))  # type: ignore[arg-type]


def test_empty_but_impossible_shape_is_a_wire_error() -> None:
    with pytest.raises(WireError, match="data does not fit FP32"):
        tensor_from_v2(spec("FP32", [0, 2**62, 2**62], []))


@pytest.mark.parametrize("datatype", ["fp32", "FLOAT32", "STRING", "", None, 3, ["FP32"], {"t": 1}])
def test_wrong_datatype_names(datatype: object) -> None:
    with pytest.raises(WireError, match=r"input 'x': datatype .* is not one of BOOL, UINT8"):
        tensor_from_v2(spec(datatype, [1], [1]))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [None, "", 3])
def test_name_must_be_a_non_empty_string(name: object) -> None:
    with pytest.raises(WireError, match="non-empty string 'name'"):
        tensor_from_v2(spec("FP32", [1], [1.0], name=name))  # type: ignore[arg-type]


def test_missing_data() -> None:
    with pytest.raises(WireError, match="input 'x': no 'data'"):
        tensor_from_v2({"name": "x", "datatype": "FP32", "shape": [1]})


@pytest.mark.parametrize("data", [[1, 0], [True, 1], ["true", False], [None, True]])
def test_bool_data_must_be_json_booleans(data: list) -> None:
    with pytest.raises(WireError, match="input 'x': BOOL data must be true/false"):
        tensor_from_v2(spec("BOOL", [2], data))


@pytest.mark.parametrize("datatype", ["UINT8", "INT32", "INT64", "UINT64"])
@pytest.mark.parametrize("data", [[1.5, 2], [1.0, 2]])
def test_integer_types_reject_floats(datatype: str, data: list) -> None:
    with pytest.raises(WireError, match=f"input 'x': {datatype} data must be integers"):
        tensor_from_v2(spec(datatype, [2], data))


@pytest.mark.parametrize("datatype", ["INT32", "FP32", "FP64"])
@pytest.mark.parametrize("data", [["1.5", 2], [None, 1], [True, 1], [{"v": 1}, 2]])
def test_numeric_types_reject_non_numbers(datatype: str, data: list) -> None:
    with pytest.raises(WireError, match=f"input 'x': {datatype} data must be numbers"):
        tensor_from_v2(spec(datatype, [2], data))


def test_float_types_accept_integers() -> None:
    _, array = tensor_from_v2(spec("FP16", [3], [1, 2, -3]))
    assert array.dtype == np.float16 and array.tolist() == [1.0, 2.0, -3.0]


@pytest.mark.parametrize(("datatype", "value"), [
    ("UINT8", 256), ("UINT8", -1), ("INT8", 128), ("INT64", 2**63), ("UINT64", -1), ("UINT64", 2**64),
])
def test_integers_out_of_range_are_rejected(datatype: str, value: int) -> None:
    with pytest.raises(WireError, match=f"input 'x': data does not fit {datatype}"):
        tensor_from_v2(spec(datatype, [1], [value]))


@pytest.mark.parametrize("data", [[1, "y"], [None, "y"], [{"a": 1}, "y"], [["z"], 2.5]])
def test_bytes_reject_non_strings(data: list) -> None:
    with pytest.raises(WireError, match="input 'x': BYTES tensor holds a"):
        tensor_from_v2(spec("BYTES", [2], data))


def test_ragged_flat_list_is_rejected() -> None:
    with pytest.raises(WireError, match="input 'x'"):
        tensor_from_v2(spec("INT32", [2], [1, [2, 3]]))


# --- requests ----------------------------------------------------------------------------------------


def test_parse_request_from_bytes_str_and_mapping() -> None:
    body = request(spec("FP32", [1, 2], [1, 2], name="a"), spec("BYTES", [1], ["hi"], name="b"),
                   id="req-1", parameters={"timeout_ms": 50})
    for form in (json.dumps(body).encode(), json.dumps(body), body):
        request_id, tensors, parameters = parse_request(form)
        assert request_id == "req-1"
        assert list(tensors) == ["a", "b"]
        assert tensors["a"].dtype == np.float32 and tensors["a"].tolist() == [[1.0, 2.0]]
        assert tensors["b"].tolist() == [b"hi"]
        assert parameters == {"timeout_ms": 50}


def test_parse_request_without_id_or_parameters() -> None:
    assert parse_request(request(spec("INT8", [1], [1])))[0] is None
    assert parse_request(request(spec("INT8", [1], [1])))[2] == {}


@pytest.mark.parametrize("body", [b"not json", "{", b"\xff\xfe{", b"[" * 100_000])
def test_parse_request_rejects_invalid_json(body: bytes | str) -> None:
    with pytest.raises(WireError, match="request is not valid JSON"):
        parse_request(body)


@pytest.mark.parametrize("body", ["[]", "3", '"x"', "null"])
def test_parse_request_rejects_non_objects(body: str) -> None:
    with pytest.raises(WireError, match="a V2 request must be a JSON object"):
        parse_request(body)


@pytest.mark.parametrize("body", [{}, {"inputs": []}, {"inputs": {"name": "x"}}, {"inputs": None}])
def test_parse_request_needs_inputs(body: dict) -> None:
    with pytest.raises(WireError, match="needs a non-empty 'inputs' list"):
        parse_request(body)


def test_parse_request_rejects_non_object_inputs() -> None:
    with pytest.raises(WireError, match="each entry of 'inputs' must be an object"):
        parse_request({"inputs": ["x"]})


def test_parse_request_rejects_duplicate_input_names() -> None:
    with pytest.raises(WireError, match="input 'a' is given twice"):
        parse_request(request(spec("INT8", [1], [1], name="a"), spec("INT8", [1], [2], name="a")))


@pytest.mark.parametrize("request_id", [1, 1.5, ["a"], {"a": 1}, True])
def test_parse_request_rejects_non_string_id(request_id: object) -> None:
    with pytest.raises(WireError, match="'id' must be a string"):
        parse_request(request(spec("INT8", [1], [1]), id=request_id))


@pytest.mark.parametrize("parameters", ["fast", [1], 3])
def test_parse_request_rejects_non_object_parameters(parameters: object) -> None:
    with pytest.raises(WireError, match="'parameters' must be an object"):
        parse_request(request(spec("INT8", [1], [1]), parameters=parameters))


def test_parse_request_reports_the_bad_input() -> None:
    with pytest.raises(WireError, match="input 'b': shape"):
        parse_request(request(spec("INT8", [1], [1], name="a"), spec("INT8", [2], [1], name="b")))


def test_make_response_shape() -> None:
    tensors = {"label": np.array([3, 1], dtype=np.int64), "proba": np.array([[0.5, 0.5]], dtype=np.float32)}
    body = make_response("digits", "req-9", tensors)
    assert body == {
        "model_name": "digits",
        "id": "req-9",
        "outputs": [
            {"name": "label", "shape": [2], "datatype": "INT64", "data": [3, 1]},
            {"name": "proba", "shape": [1, 2], "datatype": "FP32", "data": [0.5, 0.5]},
        ],
    }
    assert list(body) == ["model_name", "id", "outputs"]
    versioned = make_response("digits", "req-9", {}, model_version="3")
    assert versioned == {"model_name": "digits", "id": "req-9", "model_version": "3", "outputs": []}


# --- the binary extension: raw layouts ----------------------------------------------------------------


def array_of(datatype: str) -> np.ndarray:
    """A [2, 2] array of ``datatype`` holding the extremes of :data:`VALUES`."""
    if datatype == "BYTES":
        return np.array([v.encode() for v in VALUES[datatype]], dtype=object).reshape(2, 2)
    return np.array(VALUES[datatype], dtype=DATATYPES[datatype]).reshape(2, 2)


def same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.dtype == object:
        assert got.reshape(-1).tolist() == want.reshape(-1).tolist()
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_raw_layout_is_the_tensor_frame_payload_and_round_trips(datatype: str) -> None:
    array = array_of(datatype)
    raw = encode_raw(array)
    assert encode_tensors({"x": array}).endswith(raw)  # one layout for the frame and the extension
    same(decode_raw(datatype, [2, 2], raw), array)
    same(decode_tensors(encode_tensors({"x": decode_raw(datatype, [2, 2], raw)}))["x"], array)


def test_raw_bytes_layout() -> None:
    raw = encode_raw(np.array([b"ab", b"", "\u00e9"], dtype=object))
    assert raw == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0) + struct.pack("<I", 2) + "\u00e9".encode()
    assert decode_raw("BYTES", [3], raw).tolist() == [b"ab", b"", "\u00e9".encode()]


@pytest.mark.parametrize(("datatype", "shape", "raw", "message"), [
    ("BYTES", [1], b"\x05\x00", r"tensor: binary BYTES element 0 runs past its binary_data_size"),
    ("BYTES", [2], struct.pack("<I", 1) + b"a" + struct.pack("<I", 9) + b"b",
     "binary BYTES element 1 runs past its binary_data_size"),
    ("BYTES", [1], struct.pack("<I", 1) + b"ab", "1 stray bytes after 1 BYTES elements"),
    ("BYTES", [2**62], b"", "binary BYTES element 0 runs past"),  # no allocation of 2**62 slots first
    ("FP32", [2], b"\x00" * 7, r"shape \[2\] of FP32 needs 8 bytes, binary_data_size is 7"),
    ("INT64", [2**62, 2**62], b"", f"of INT64 needs {2**127} bytes, binary_data_size is 0"),
    ("FP32", [0, 2**62, 2**62], b"", "is not a valid array shape"),
    ("BOOL", [2], b"\x01\x02", "BOOL binary data holds bytes other than 0 and 1"),
    ("FLOAT", [1], b"\x00" * 4, "datatype 'FLOAT' is not one of BOOL"),
    ("INT8", [-1], b"", "'shape' must be a list of non-negative integers"),
])
def test_decode_raw_rejects_bad_bytes_with_a_wire_error(datatype: str, shape: list[int], raw: bytes,
                                                         message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_raw(datatype, shape, raw)


def test_decode_raw_names_the_tensor() -> None:
    with pytest.raises(WireError, match=r"^output 'y': binary BYTES element 0 runs past"):
        decode_raw("BYTES", [1], b"\x01", label="output 'y'")


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_decode_raw_on_random_bytes_decodes_exactly_or_raises_a_wire_error(datatype: str) -> None:
    rng = random.Random(datatype)
    outcomes = {"decoded": 0, "rejected": 0}
    for _ in range(500):
        shape = [rng.randrange(0, 4) for _ in range(rng.randrange(0, 3))]
        size = rng.choice([rng.randrange(0, 24), int(np.prod(shape)) * DATATYPES[datatype].itemsize])
        raw = bytes(rng.choice([0, 1, 2, 255]) for _ in range(size))
        try:
            array = decode_raw(datatype, shape, raw)
        except WireError:
            outcomes["rejected"] += 1
            continue
        outcomes["decoded"] += 1
        assert list(array.shape) == shape and encode_raw(array) == raw
    assert outcomes["decoded"] and outcomes["rejected"]


# --- the binary extension: requests and responses -------------------------------------------------------


def test_binary_request_round_trip_and_errors() -> None:
    tensors = {"a": np.arange(6, dtype=np.int16).reshape(2, 3), "b": np.array([b"x", b""], dtype=object)}
    body, headers = build_request(tensors, binary=True, request_id="r")
    parsed = parse_infer(body, headers["Inference-Header-Content-Length"])
    assert parsed.id == "r"
    np.testing.assert_array_equal(parsed.tensors["a"], tensors["a"])
    assert list(parsed.tensors["b"]) == [b"x", b""]
    with pytest.raises(WireError, match="does not fit a body"):
        parse_infer(body, str(len(body) + 1))
    with pytest.raises(WireError, match="stray|after the last binary input"):
        parse_infer(body + b"\x00", headers["Inference-Header-Content-Length"])
    with pytest.raises(WireError, match="not valid JSON"):
        parse_infer(b"{", None)


@pytest.mark.parametrize("binary", [False, True])
def test_every_datatype_round_trips_through_a_request(binary: bool) -> None:
    tensors = {f"t_{d.lower()}": array_of(d) for d in DATATYPES}
    body, headers = build_request(tensors, binary=binary, binary_outputs=True, outputs=["t_int8"],
                                  parameters={"timeout_ms": 5})
    assert ("Inference-Header-Content-Length" in headers) == binary
    parsed = parse_infer(body, headers.get("Inference-Header-Content-Length"))
    assert parsed.id is None and list(parsed.tensors) == list(tensors)
    for name, array in tensors.items():
        same(parsed.tensors[name], array)
    assert parsed.parameters == {"timeout_ms": 5, "binary_data_output": True}
    assert (parsed.outputs, parsed.binary_outputs) == ({"t_int8": True}, True)


def test_parse_infer_reads_only_sized_inputs_from_the_binary_part() -> None:
    head = json.dumps({"id": "r", "inputs": [
        {"name": "a", "datatype": "INT32", "shape": [1], "data": [7]},
        {"name": "b", "datatype": "INT32", "shape": [2], "parameters": {"binary_data_size": 8}},
    ], "outputs": [{"name": "a"}, {"name": "b", "parameters": {"binary_data": True}}]}).encode()
    parsed = parse_infer(head + np.array([1, 2], "<i4").tobytes(), str(len(head)))
    assert parsed.tensors["a"].tolist() == [7] and parsed.tensors["b"].tolist() == [1, 2]
    assert parsed.outputs == {"a": False, "b": True}


@pytest.mark.parametrize(("header_length", "message"), [
    ("-1", "does not fit a body"), ("\u00b2", "does not fit a body"), ("x", "does not fit a body"),
])
def test_parse_infer_rejects_bad_header_lengths(header_length: str, message: str) -> None:
    body, _ = build_request({"a": np.ones(1, np.int8)}, binary=True)
    with pytest.raises(WireError, match=message):
        parse_infer(body, header_length)


@pytest.mark.parametrize(("size", "message"), [
    (9, r"input 'b': binary_data_size 9 runs past the binary part \(8 bytes left\)"),
    (-1, "binary_data_size -1 runs past"),
    ("8", "binary_data_size '8' runs past"),
    (4, "input 'b': shape \\[2\\] of INT32 needs 8 bytes, binary_data_size is 4"),
])
def test_parse_infer_checks_binary_data_sizes(size: object, message: str) -> None:
    head = json.dumps({"inputs": [{"name": "b", "datatype": "INT32", "shape": [2],
                                   "parameters": {"binary_data_size": size}}]}).encode()
    with pytest.raises(WireError, match=message):
        parse_infer(head + b"\x00" * 8, str(len(head)))


@pytest.mark.parametrize(("doc", "message"), [
    ({"id": "", "inputs": [spec("INT8", [1], [1])]}, "'id' must be a non-empty string"),
    ({"inputs": [spec("INT8", [1], [1])], "outputs": {"name": "x"}}, "'outputs' must be a list"),
    ({"inputs": [spec("INT8", [1], [1])], "outputs": [{"id": "x"}]}, "with a 'name'"),
    ({"inputs": [spec("INT8", [1], [1])], "parameters": [1]}, "'parameters' must be an object"),
    ({"inputs": [spec("INT8", [1], [1]), spec("INT8", [1], [1])]}, "input 'x' is given twice"),
    ([], "a V2 request must be a JSON object"),
])
def test_parse_infer_rejects_bad_documents(doc: object, message: str) -> None:
    with pytest.raises(WireError, match=message):
        parse_infer(json.dumps(doc).encode(), None)


def test_parse_request_ignores_binary_data_sizes() -> None:
    """On Kafka a V2 request is JSON only: a binary_data_size is a parameter like any other."""
    doc = request({**spec("INT8", [1], [3]), "parameters": {"binary_data_size": 1}})
    assert parse_request(doc)[1]["x"].tolist() == [3]


def test_binary_response_layout() -> None:
    out = {"y": np.array([[1.5, 2.5]], np.float32)}
    body, n = encode_response("m", "1", "r", out, InferRequest("r", {}, {}, binary_outputs=True))
    assert n is not None and body[n:] == out["y"].tobytes()


@pytest.mark.parametrize("binary", [False, True])
def test_every_datatype_round_trips_through_a_response(binary: bool) -> None:
    tensors = {f"t_{d.lower()}": array_of(d) for d in DATATYPES}
    body, n = encode_response("m", "1", "r", tensors, InferRequest("r", {}, {}, binary_outputs=binary))
    assert (n is not None) == binary
    doc = json.loads(body[:n] if n else body)
    assert (doc["model_name"], doc["model_version"], doc["id"]) == ("m", "1", "r")
    got = decode_response(body, str(n) if n else None)
    assert list(got) == list(tensors)
    for name, array in tensors.items():
        same(got[name], array)


def test_response_output_selection_skips_missing_outputs() -> None:
    tensors = {"a": np.array([1], np.int8), "b": np.array([2.0], np.float32)}
    request_ = InferRequest("r", {}, {}, {"b": True, "gone": False, "a": False})
    body, n = encode_response("m", "1", "r", tensors, request_)
    assert n is not None
    assert [o["name"] for o in json.loads(body[:n])["outputs"]] == ["b", "a"]
    assert {k: v.tolist() for k, v in decode_response(body, str(n)).items()} == {"b": [2.0], "a": [1]}


def test_decode_response_reads_a_json_response_body() -> None:
    body = make_response("m", "r", {"y": np.array([[1, 2]], np.int64)})
    assert decode_response(json.dumps(body).encode())["y"].tolist() == [[1, 2]]
    assert decode_response(body)["y"].dtype == np.int64
    assert decode_response(b'{"id": "r"}') == {}


@pytest.mark.parametrize(("body", "header_length", "message"), [
    (b'{"outputs": [{"name": "y", "datatype": "INT8", "shape": [2], "parameters": {"binary_data_size": 2}}]}\x01',
     "108", "output 'y': binary_data_size 2 runs past the binary part"),
    (b'{"outputs": {"name": "y"}}', None, "'outputs' must be a list"),
    (b'{"outputs": [3]}', None, "each entry of 'outputs' must be an object"),
    (b"[]", None, "a V2 response must be a JSON object"),
    (b"{", None, "response is not valid JSON"),
    (b"{}", "9", "does not fit a body"),
])
def test_decode_response_rejects_bad_bodies(body: bytes, header_length: str | None, message: str) -> None:
    if header_length == "108":
        header_length = str(body.index(b"}]}") + 3)
    with pytest.raises(WireError, match=message):
        decode_response(body, header_length)


def test_response_parameters_say_an_output_was_reconstructed() -> None:
    tensors = {"label": np.array([[3]], np.int64)}
    body, n = encode_response("m", "1", "r", tensors, InferRequest("r", {}, {}),
                              {"reconstructed": True, "parity_group": "g1"})
    assert n is None
    doc = json.loads(body)
    assert doc["parameters"] == {"reconstructed": True, "parity_group": "g1"}
    assert doc["outputs"][0]["name"] == "label"
    plain, _ = encode_response("m", "1", "r", tensors, InferRequest("r", {}, {}))
    assert "parameters" not in json.loads(plain)


def test_bytes_sent_as_base64_arrive_as_the_binary_they_encode() -> None:
    # MLServer's codec (parameters.content_type: base64): a PNG's bytes survive JSON, and one request body
    # serves both servers
    png = b"\x89PNG\r\n\x1a\n\x00\xff\xfe"
    spec = {"name": "image", "datatype": "BYTES", "shape": [2], "parameters": {"content_type": "base64"},
            "data": [base64.b64encode(png).decode(), base64.b64encode(b"").decode()]}
    name, array = tensor_from_v2(spec)
    assert name == "image" and array.tolist() == [png, b""]
    with pytest.raises(WireError, match="input 'image': content_type base64, but an element is not base64"):
        tensor_from_v2({**spec, "data": ["not base64!", ""]})
    # without the parameter, the strings are the bytes (UTF-8)
    assert tensor_from_v2({**spec, "parameters": {}})[1][0] == base64.b64encode(png)
