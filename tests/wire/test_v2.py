"""The Open Inference Protocol V2 JSON form of tensors and requests."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flowserve.errors import WireError
from flowserve.wire.tensors import DATATYPES
from flowserve.wire.v2 import make_response, parse_request, tensor_from_v2, tensor_to_v2

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
