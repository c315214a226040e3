"""The model and samples of ``topologies/image-classifier.yaml``: scikit-learn's 8x8 digits (bundled, no
download) rendered as PNG files, and a small CNN trained on them on first use, exported to ONNX.

Each digit is rendered grey at 24, 32 or 40 pixels square (the 0..16 intensities scaled to 0..255, enlarged
bilinearly) and encoded as PNG. The CNN sees what the served topology's pre-processing makes of those PNG
files (:data:`PRE`, the same :class:`~flowserve_components.images.DecodeImage`), trains for a few seconds
(seeded, one thread) on the training side of :mod:`flowserve_components.digits`' fixed split, and is
exported with a dynamic batch axis to ``<cache>/models/digit-images-cnn.onnx``::

    requests, labels = sample(2, seed=1)
    requests[0]["image"]           # array([b'\\x89PNG...'], dtype=object): one PNG file
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flowserve.component import Batch
from flowserve.errors import ComponentError
from flowserve_components.digits import PIXEL_MAX, Split, load_split
from flowserve_components.images import DecodeImage, DecodeImageParams
from flowserve_components.model_files import require
from flowserve_components.models import cache_dir
from flowserve_components.training import train_in_child

if TYPE_CHECKING:
    import torch

#: the topology's pre-processing (topologies/image-classifier.yaml repeats it; a test holds them equal)
PRE: dict[str, Any] = {"size": [16, 16], "mode": "L", "mean": [0.5], "std": [0.5]}
CLASSES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
SIZES = (24, 32, 40)
MODEL = "digit-images-cnn"
EPOCHS = 6
SEED = 0


def render(pixels: np.ndarray, size: int) -> bytes:
    """One 8x8 digit (raw 0..16 intensities, 64 values) as a grey PNG file ``size`` pixels square."""
    pil = require("PIL.Image", "vision")
    grey = np.clip(np.asarray(pixels, np.float32).reshape(8, 8) * (255.0 / PIXEL_MAX), 0, 255).round()
    image = pil.fromarray(grey.astype(np.uint8), mode="L").resize((size, size), pil.Resampling.BILINEAR)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


@functools.cache
def _rendered(split: Split) -> tuple[tuple[bytes, ...], np.ndarray]:
    pixels, labels = load_split(split)
    rng = np.random.default_rng(SEED)
    sizes = rng.choice(SIZES, size=len(pixels))
    return tuple(render(p, int(s)) for p, s in zip(pixels, sizes, strict=True)), labels


def load_pngs(split: Split = "test") -> tuple[list[bytes], np.ndarray]:
    """PNG files (one per digit, at a seeded size of :data:`SIZES`) and labels of one side of the split."""
    pngs, labels = _rendered(split)
    return list(pngs), labels


def preprocess(pngs: list[bytes]) -> np.ndarray:
    """PNG files as the topology's ``pre`` node turns them into the CNN's input, float32 [n, 1, 16, 16]."""
    pre = DecodeImage(DecodeImageParams(**PRE))
    result = pre.process(Batch({"image": np.array(pngs, dtype=object)}, [len(pngs)], ["train"]))
    if result.errors:
        raise ComponentError(f"rendered digits failed to decode: {result.errors}")
    return result.outputs["x"]


def build() -> torch.nn.Module:
    """The CNN: two 3x3 convolutions with pooling over 1x16x16, then a linear layer to 10 logits."""
    import torch
    from torch import nn

    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(16 * 4 * 4, len(CLASSES))).to(torch.float32)


def model_path() -> Path:
    return cache_dir() / "models" / f"{MODEL}.onnx"


def train(path: Path | None = None) -> Path:
    """Train the CNN (seeded, one thread, a few seconds) and export it to ONNX at ``path`` atomically."""
    import torch

    path = path or model_path()
    pngs, labels = load_pngs("train")
    x, y = torch.from_numpy(preprocess(pngs)), torch.from_numpy(np.array(labels, dtype=np.int64))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(SEED)
        model = build()
        optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
        order = torch.Generator().manual_seed(SEED)
        for _ in range(EPOCHS):
            for rows in torch.randperm(len(x), generator=order).split(64):
                optimiser.zero_grad()
                torch.nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
                optimiser.step()
        model.eval()
        path.parent.mkdir(parents=True, exist_ok=True)
        # Readers never see half a file: export beside the target, then rename over it (two processes
        # training at once write the same model; the last rename wins).
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".onnx")
        os.close(fd)
        try:
            with warnings.catch_warnings():  # the TorchScript-based exporter is deprecated; it needs no onnxscript
                warnings.simplefilter("ignore")
                torch.onnx.export(model, (x[:2],), tmp, input_names=["x"], output_names=["logits"],
                                  dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, dynamo=False)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    finally:
        torch.set_num_threads(threads)
    return path


def ensure_model() -> Path:
    """The cached ONNX model's path, training and exporting it first (in a child process) when it is missing."""
    path = model_path()
    if not path.exists():
        train_in_child(__name__)
    return path


def sample(n: int, seed: int = 0) -> tuple[list[dict[str, np.ndarray]], list[int]]:
    """``n`` single-image requests ``{"image": BYTES [1]}`` (held-out PNG files) and their labels."""
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    pngs, labels = load_pngs("test")
    picks = np.random.default_rng(seed).choice(len(pngs), size=n, replace=n > len(pngs))
    return [{"image": np.array([pngs[i]], dtype=object)} for i in picks], [int(labels[i]) for i in picks]


if __name__ == "__main__":  # ensure_model runs this in a child process: python -m flowserve_components.image_model
    train()
