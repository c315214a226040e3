"""scikit-learn's bundled iris data (no download) for ``topologies/tabular.yaml``: split, model, sampler.

The tabular topology scores flowers with an XGBoost classifier that :func:`ensure_model` trains on first
use into the model cache; :func:`sample` draws requests from the held-out side of the same fixed split,
one V2 tensor per column::

    requests, labels = sample(2, seed=1)
    sorted(requests[0])        # ['petal_length', 'petal_width', 'sepal_length', 'sepal_width']
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from pathlib import Path
from typing import Literal

import numpy as np

from flowserve_components.models import cache_dir

COLUMNS = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
CLASSES = ["setosa", "versicolor", "virginica"]
TEST_SIZE = 0.3
SPLIT_SEED = 0
MODEL = "iris-xgb"

Split = Literal["train", "test"]


@functools.cache
def _split() -> dict[Split, tuple[np.ndarray, np.ndarray]]:
    # sklearn takes about a second to import; workers that never sample or train must not pay it.
    from sklearn.datasets import load_iris
    from sklearn.model_selection import train_test_split

    data = load_iris()
    x, y = data.data.astype(np.float32), data.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=TEST_SIZE, random_state=SPLIT_SEED,
                                                        stratify=y)
    out: dict[Split, tuple[np.ndarray, np.ndarray]] = {"train": (x_train, y_train), "test": (x_test, y_test)}
    for arrays in out.values():
        for a in arrays:
            a.setflags(write=False)  # cached and shared between callers
    return out


def load_split(split: Split = "test") -> tuple[np.ndarray, np.ndarray]:
    """Features (float32 [n, 4], in :data:`COLUMNS` order) and labels (int64 [n]) of one side of the split."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    return _split()[split]


def model_path() -> Path:
    return cache_dir() / "models" / f"{MODEL}.json"


def train(path: Path | None = None) -> Path:
    """Train the XGBoost classifier on the train split (seeded, one thread) and save it as JSON at ``path``."""
    import xgboost

    path = path or model_path()
    x, y = load_split("train")
    model = xgboost.XGBClassifier(n_estimators=20, max_depth=3, learning_rate=0.3, n_jobs=1, random_state=0)
    model.fit(x, y)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Readers must never see half a file: save beside the target (XGBoost picks the format by the suffix),
    # then rename over it. Two processes training at once write the same model, and the last rename wins.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".json")
    os.close(fd)
    try:
        model.save_model(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def ensure_model() -> Path:
    """The cached model's path, training it first when it is missing (``model_from`` of the topology)."""
    path = model_path()
    return path if path.exists() else train(path)


def sample(n: int, seed: int = 0) -> tuple[list[dict[str, np.ndarray]], list[int]]:
    """``n`` single-row requests from the held-out split (drawn with replacement past its 45 rows), labels."""
    x, y = load_split("test")
    rng = np.random.default_rng(seed)
    picks = rng.permutation(len(x))[:n] if n <= len(x) else rng.integers(0, len(x), n)
    requests = [{c: x[i, j : j + 1].copy() for j, c in enumerate(COLUMNS)} for i in picks]
    return requests, [int(y[i]) for i in picks]
