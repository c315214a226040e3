"""Columnar decoding gives exactly what per-record decoding gives, or declines."""

from __future__ import annotations

import numpy as np

from flowserve.runtime.intake import decode_column
from flowserve.wire.tensors import decode_tensors, encode_tensors


def test_same_layout_decodes_as_one_array() -> None:
    arrays = [np.full((2, 3), i, np.float32) for i in range(5)]
    values = [encode_tensors({"x": a}) for a in arrays]
    name, stacked, rows = decode_column(values)
    assert name == "x" and rows == 2
    assert stacked.shape == (10, 3)
    for i, v in enumerate(values):
        np.testing.assert_array_equal(stacked[i * rows : (i + 1) * rows], decode_tensors(v)["x"])


def test_declines_mixed_layouts_and_special_types() -> None:
    a = encode_tensors({"x": np.zeros((1, 3), np.float32)})
    assert decode_column([a, encode_tensors({"x": np.zeros((1, 4), np.float32)})]) is None
    assert decode_column([a, encode_tensors({"y": np.zeros((1, 3), np.float32)})]) is None
    assert decode_column([a, encode_tensors({"x": np.zeros((1, 3), np.int32)})]) is None
    assert decode_column([a, b"garbage"]) is None
    assert decode_column([encode_tensors({"x": np.zeros((1, 3), bool)})]) is None
    assert decode_column([encode_tensors({"x": np.array([[b"a"]], dtype=object)})]) is None
    assert decode_column([encode_tensors({"x": np.zeros((1,)), "y": np.zeros((1,))})]) is None
    assert decode_column([b"\x00bad"]) is None
    assert decode_column([]) is None


def test_payload_bytes_differ_but_header_is_shared() -> None:
    values = [encode_tensors({"x": np.array([[i, -i]], np.int64)}) for i in range(100)]
    _, stacked, _ = decode_column(values)
    np.testing.assert_array_equal(stacked[:, 0], np.arange(100))
