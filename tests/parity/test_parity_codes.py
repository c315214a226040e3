"""Parity encoders: the sum, and concat's tiling of shrunken images (no broker)."""

from __future__ import annotations

import numpy as np
import pytest

from flowserve.parity import Encoder, Member
from flowserve.parity.codes import encode
from flowserve.topology.parity import concat_layout


def _images(k: int, rows: int = 1, side: int = 4, seed: int = 0) -> np.ndarray:
    """``[rows, k, side*side]``: member j's rows at ``[:, j]``."""
    return np.random.default_rng(seed).random((rows, k, side * side)).astype(np.float32)


def test_sum_adds_the_members_in_float64_and_keeps_the_dtype() -> None:
    stacked = _images(3, rows=2)
    query = encode("sum", stacked)
    assert query.dtype == np.float32 and query.shape == (2, 16)
    np.testing.assert_allclose(query, stacked.astype(np.float64).sum(axis=1), rtol=1e-6)


def test_concat_of_two_puts_half_width_images_side_by_side() -> None:
    stacked = _images(2)
    query = encode("concat", stacked).reshape(4, 4)
    a, b = (stacked[0, j].reshape(4, 4).astype(np.float64) for j in range(2))
    halve = lambda img: img.reshape(4, 2, 2).mean(axis=2)  # noqa: E731 - average pixel pairs along the width
    np.testing.assert_allclose(query[:, :2], halve(a), rtol=1e-6)
    np.testing.assert_allclose(query[:, 2:], halve(b), rtol=1e-6)


def test_concat_of_three_tiles_a_two_by_two_grid_and_leaves_the_last_slot_zero() -> None:
    stacked = _images(3, rows=2, side=8)
    query = encode("concat", stacked).reshape(2, 8, 8)
    for row in range(2):
        for slot, (r, c) in enumerate([(0, 0), (0, 1), (1, 0)]):
            quarter = stacked[row, slot].reshape(8, 8).astype(np.float64).reshape(4, 2, 4, 2).mean(axis=(1, 3))
            np.testing.assert_allclose(query[row, r * 4:(r + 1) * 4, c * 4:(c + 1) * 4], quarter, rtol=1e-6)
        assert not query[row, 4:, 4:].any()


def test_concat_keeps_channels_apart() -> None:
    # rows of 2 channels of 4x2 images: each channel is tiled on its own
    stacked = np.arange(2 * 16, dtype=np.float32).reshape(1, 2, 16)
    query = encode("concat", stacked, image=(4, 2)).reshape(2, 4, 2)
    for channel in range(2):
        a = stacked[0, 0].reshape(2, 4, 2)[channel]
        b = stacked[0, 1].reshape(2, 4, 2)[channel]
        np.testing.assert_allclose(query[channel, :, 0], a.mean(axis=1))
        np.testing.assert_allclose(query[channel, :, 1], b.mean(axis=1))


def test_the_layout_says_why_an_input_cannot_be_tiled() -> None:
    layout = concat_layout(2, 64, None)
    assert (layout.rows, layout.cols, layout.channels, layout.height, layout.width) == (1, 2, 1, 8, 8)
    with pytest.raises(ValueError, match="not a square image"):
        concat_layout(2, 10, None)
    with pytest.raises(ValueError, match="width of 2"):
        concat_layout(2, 15, (5, 3))
    with pytest.raises(ValueError, match="whole 3x3 images"):
        concat_layout(2, 10, (3, 3))


def test_the_concat_encoder_tiles_its_members_in_arrival_order() -> None:
    enc = Encoder(k=2, wait_ms=20, partitions=4, encoding="concat")
    first, second = (np.full((1, 16), v, np.float32) for v in (1.0, 5.0))
    assert enc.add(2, Member("a", 2), {"x": first}, now_ms=0) is None
    group = enc.add(0, Member("b", 0), {"x": second}, now_ms=1)
    assert group is not None and [m.request_id for m in group.members] == ["a", "b"]
    query = group.query["x"].reshape(4, 4)
    assert (query[:, :2] == 1).all() and (query[:, 2:] == 5).all()
