"""Fixtures for the component library: a model cache trained once per session (batch helpers: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    """Every zoo model, trained once into a session-wide cache: (cache dir, held-out accuracies)."""
    from flowserve_components import models

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
