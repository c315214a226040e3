"""The gateway's admission check: a request's tensors must fit the topology's input ports (no broker)."""

from __future__ import annotations

import numpy as np
import pytest

from flowserve.component import Port
from flowserve.errors import ErrorKind, WireError
from flowserve.gateway.admission import check_inputs

PORTS = {"x": Port("FP32", (-1, 4), allow_nan=False), "tag": Port("BYTES", (-1,))}
GOOD = {"x": np.ones((2, 4), np.float32), "tag": np.array([b"a", b"b"], dtype=object)}


def test_matching_tensors_pass() -> None:
    check_inputs(GOOD, PORTS)
    check_inputs({"x": np.ones((0, 4), np.float32), "tag": np.array([], dtype=object)}, PORTS)


@pytest.mark.parametrize(("tensors", "message"), [
    ({**GOOD, "extra": np.ones(1)}, r"input 'extra' is not an input of this model \(inputs: x, tag\)"),
    ({"x": GOOD["x"]}, r"input 'tag' is missing \(BYTES \[-1\]\)"),
    ({**GOOD, "x": np.ones((2, 4), np.float64)}, "input 'x': datatype FP64 does not match the model's FP32"),
    ({**GOOD, "x": np.ones((2, 5), np.float32)}, r"input 'x': shape \[2, 5\] does not fit the model's \[-1, 4\]"),
    ({**GOOD, "x": np.ones((8,), np.float32)}, r"input 'x': shape \[8\] does not fit"),
    ({**GOOD, "x": np.array([[1, np.nan, 3, 4]] * 2, np.float32)}, "input 'x' does not accept NaN or infinite values"),
    ({**GOOD, "x": np.array([[1, np.inf, 3, 4]] * 2, np.float32)}, "input 'x' does not accept NaN or infinite values"),
    ({**GOOD, "tag": np.array([b"a"], dtype=object)}, r"inputs disagree on the batch dimension \(1, 2 rows\)"),
])
def test_mismatches_name_the_input(tensors: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(WireError, match=message) as info:
        check_inputs(tensors, PORTS)
    assert info.value.kind == ErrorKind.INVALID_INPUT


def test_a_json_number_too_large_for_its_datatype_is_refused_where_nan_is() -> None:
    from flowserve.wire.v2 import parse_infer

    body = (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [1, 1e400, 3, 4, 5, 6, 7, 8]},'
            b' {"name": "tag", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}]}')
    parsed = parse_infer(body, None)
    assert np.isinf(parsed.tensors["x"][0, 1])  # what JSON gives: infinity, not an error of its own
    with pytest.raises(WireError, match="input 'x' does not accept NaN or infinite values"):
        check_inputs(parsed.tensors, PORTS)
