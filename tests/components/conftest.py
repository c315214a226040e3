"""Fixtures for the component library: a model cache trained once per session, batch helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flowserve.component import Batch, Component

REPO = Path(__file__).resolve().parents[2]


def _make_batch(sizes: list[int], **tensors: np.ndarray) -> Batch:
    for name, array in tensors.items():
        assert len(array) == sum(sizes), f"tensor {name} has {len(array)} rows, sizes add up to {sum(sizes)}"
    return Batch(dict(tensors), list(sizes), [f"r{i}" for i in range(len(sizes))])


@pytest.fixture
def make_batch() -> Callable[..., Batch]:
    """``make_batch(sizes, **tensors)``: a batch of requests r0, r1, ... whose rows are ``tensors``."""
    return _make_batch


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    """Every zoo model, trained once into a session-wide cache: (cache dir, held-out accuracies)."""
    from components import models

    cache = tmp_path_factory.mktemp("flowserve-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLOWSERVE_CACHE", str(cache))
        accuracies = {name: models.train(name, quiet=True)[1] for name in models.ZOO}
    return cache, accuracies


@pytest.fixture
def model_cache(trained: tuple[Path, dict[str, float]], monkeypatch: pytest.MonkeyPatch) -> Path:
    """FLOWSERVE_CACHE pointing at the trained session cache for this test only."""
    monkeypatch.setenv("FLOWSERVE_CACHE", str(trained[0]))
    return trained[0]


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FLOWSERVE_CACHE", str(cache))
    return cache


@pytest.fixture
def torch_threads() -> Iterator[None]:
    """Restore torch's thread count (of the test's thread), which TorchClassifier sets."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _configure(cls: type[Component], params: dict[str, Any] | None = None, node: str = "test") -> Component:
    component = cls.configure(params or {}, node=node)
    assert type(component) is cls
    return component


@pytest.fixture
def configure() -> Callable[..., Any]:
    """``configure(cls, params, node)``: ``cls.configure`` checked to return a ``cls``."""
    return _configure
