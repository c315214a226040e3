"""The 8x8 handwritten digits of scikit-learn (bundled, no download): data split, sampler, normaliser.

Training (:mod:`flowserve_components.models`) and :func:`sample` share one deterministic split, so sampled
requests are always held-out data::

    requests, labels = sample(4, seed=1)
    requests[0]["pixels"].shape   # (1, 64), float32 in [0, 16]
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from flowserve.component import Batch, Component, Port

#: Pixel intensities of the raw data run from 0 to this.
PIXEL_MAX = 16.0
TEST_SIZE = 0.25
SPLIT_SEED = 0

Split = Literal["train", "test"]
Shift = Literal["noise", "brightness"]


@functools.cache
def _split() -> dict[Split, tuple[np.ndarray, np.ndarray]]:
    # sklearn takes about a second to import; the CLI and the workers that never sample must not pay it.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = data.data.astype(np.float32)
    y = data.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=TEST_SIZE, random_state=SPLIT_SEED, stratify=y
    )
    out: dict[Split, tuple[np.ndarray, np.ndarray]] = {"train": (x_train, y_train), "test": (x_test, y_test)}
    for arrays in out.values():
        for a in arrays:
            a.setflags(write=False)  # cached and shared between callers
    return out


def load_split(split: Split = "test") -> tuple[np.ndarray, np.ndarray]:
    """Raw pixels (float32 [n, 64], 0..16) and labels (int64 [n]) of one side of the fixed split."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    return _split()[split]


def apply_shift(
    pixels: np.ndarray, shift: Shift | None, amount: float, rng: np.random.Generator
) -> np.ndarray:
    """Distort raw pixels the way a drifting input source might; the result stays within 0..16.

    ``noise``: add Gaussian noise with standard deviation ``amount`` (in pixel units).
    ``brightness``: add ``amount`` to every pixel.
    """
    if shift is None:
        return pixels
    if shift == "noise":
        shifted = pixels + rng.normal(0.0, amount, size=pixels.shape)
    elif shift == "brightness":
        shifted = pixels + amount
    else:
        raise ValueError(f"unknown shift {shift!r}; use 'noise', 'brightness' or None")
    return np.clip(shifted, 0.0, PIXEL_MAX).astype(np.float32)


def sample(
    n: int,
    seed: int = 0,
    *,
    split: Split = "test",
    shift: Shift | None = None,
    amount: float = 0.0,
) -> tuple[list[dict[str, np.ndarray]], list[int]]:
    """``n`` single-image requests ``{"pixels": float32 [1, 64]}`` and their labels, drawn by ``seed``.

    Draws without replacement while ``n`` fits the split (450 test images), with replacement beyond.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    x, y = load_split(split)
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(x), size=n, replace=n > len(x))
    pixels = apply_shift(x[picks], shift, amount, rng)
    requests = [{"pixels": np.array(row, dtype=np.float32).reshape(1, -1)} for row in pixels]
    return requests, [int(label) for label in y[picks]]


class Normalize(Component):
    """Scale raw pixels (0..16) to the 0..1 range the zoo models were trained on."""

    inputs = {"pixels": Port("FP32", [-1, 64], doc="raw 8x8 image, row-major, 0..16")}
    outputs = {"x": Port("FP32", [-1, 64], doc="pixels / 16")}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"x": batch["pixels"] / np.float32(PIXEL_MAX)}

    def torch_forward(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """``process`` in torch, for explanations through the graph (flowserve.explain.Differentiable)."""
        return {"x": inputs["pixels"] / PIXEL_MAX}
