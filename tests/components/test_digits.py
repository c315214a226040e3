from __future__ import annotations

import numpy as np
import pytest

from flowserve.component import Port
from flowserve_components import digits
from flowserve_components.digits import Normalize, load_split, sample


def test_split_is_fixed_and_disjoint() -> None:
    x_train, y_train = load_split("train")
    x_test, y_test = load_split("test")
    assert x_train.shape == (1347, 64) and x_test.shape == (450, 64)
    assert x_train.dtype == np.float32 and y_test.dtype == np.int64
    assert sorted(set(y_test.tolist())) == list(range(10))
    train_rows = {row.tobytes() for row in x_train}
    assert not any(row.tobytes() in train_rows for row in x_test)
    with pytest.raises(ValueError, match="read-only"):
        x_test[0, 0] = 1.0


def test_sample_is_deterministic_held_out_data() -> None:
    requests, labels = sample(20, seed=3)
    again, labels_again = sample(20, seed=3)
    other, _ = sample(20, seed=4)
    assert labels == labels_again
    assert all(np.array_equal(a["pixels"], b["pixels"]) for a, b in zip(requests, again, strict=True))
    assert not all(np.array_equal(a["pixels"], b["pixels"]) for a, b in zip(requests, other, strict=True))
    x_test, y_test = load_split("test")
    for request, label in zip(requests, labels, strict=True):
        assert set(request) == {"pixels"}
        pixels = request["pixels"]
        assert pixels.shape == (1, 64) and pixels.dtype == np.float32
        Port("FP32", [-1, 64]).check("pixels", pixels)
        row = np.flatnonzero((x_test == pixels).all(axis=1))
        assert len(row) >= 1 and label in y_test[row].tolist()


def test_sample_without_replacement_then_with() -> None:
    requests, _ = sample(450, seed=0)
    assert len({r["pixels"].tobytes() for r in requests}) == 450  # every test image once
    more, labels = sample(1000, seed=0)
    assert len(more) == 1000 and len(labels) == 1000
    assert sample(0) == ([], [])


def test_sample_from_train_split() -> None:
    requests, _ = sample(5, seed=0, split="train")
    train_rows = {row.tobytes() for row in load_split("train")[0]}
    assert all(r["pixels"].reshape(-1).tobytes() in train_rows for r in requests)


@pytest.mark.parametrize("shift", ["noise", "brightness"])
def test_shifts_change_pixels_within_range(shift: digits.Shift) -> None:
    plain, labels = sample(30, seed=1)
    shifted, shifted_labels = sample(30, seed=1, shift=shift, amount=4.0)
    assert labels == shifted_labels
    a = np.concatenate([r["pixels"] for r in plain])
    b = np.concatenate([r["pixels"] for r in shifted])
    assert b.dtype == np.float32 and b.min() >= 0.0 and b.max() <= 16.0
    assert not np.array_equal(a, b)
    if shift == "brightness":
        np.testing.assert_array_equal(b, np.clip(a + 4.0, 0, 16))
    else:
        assert abs(float((b - a).mean())) < 2.0  # noise, not an offset


def test_zero_shift_changes_nothing() -> None:
    plain, _ = sample(10, seed=2)
    noisy, _ = sample(10, seed=2, shift="noise", amount=0.0)
    assert all(np.array_equal(a["pixels"], b["pixels"]) for a, b in zip(plain, noisy, strict=True))


def test_bad_sample_arguments() -> None:
    with pytest.raises(ValueError, match="unknown shift 'blur'"):
        sample(3, shift="blur", amount=1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="split must be"):
        sample(3, split="validation")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n must be"):
        sample(-1)


def test_normalize(configure, make_batch) -> None:
    node = configure(Normalize, {}, node="pre")
    assert node.inputs == {"pixels": Port("FP32", [-1, 64], doc=node.inputs["pixels"].doc)}
    assert list(node.outputs) == ["x"]
    pixels = np.arange(3 * 64, dtype=np.float32).reshape(3, 64) % 17
    out = node.process(make_batch([1, 2], pixels=pixels))
    assert set(out) == {"x"}
    assert out["x"].dtype == np.float32 and out["x"].shape == (3, 64)
    np.testing.assert_array_equal(out["x"], pixels / 16)
    node.outputs["x"].check("x", out["x"])
