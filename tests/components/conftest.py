"""Fixtures for the component library: a model cache trained once per session (batch helpers: tests/conftest.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    """Every zoo model in a session-wide cache: (cache dir, held-out accuracies).

    Training is seeded, so a model already in the user's cache (``$FLOWSERVE_CACHE`` or
    ``~/.cache/flowserve``, where ``flowserve run`` and ``flowserve train`` put them) is the one this would
    train: it is copied and scored instead (the CNN alone takes most of a minute to train on two cores). What
    is missing is trained once here and left in the user's cache too, as ``flowserve run`` would."""
    from flowserve_components import models

    user = models.cache_dir() / "models"
    cache = tmp_path_factory.mktemp("flowserve-cache")
    (cache / "models").mkdir()
    accuracies = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLOWSERVE_CACHE", str(cache))
        for name in models.ZOO:
            cached = user / f"{name}.pt"
            if cached.exists():
                shutil.copyfile(cached, models.model_path(name))
                accuracies[name] = models.accuracy(models.load(name))
            else:
                path, accuracies[name] = models.train(name, quiet=True)
                user.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, cached.with_suffix(".pt.tmp"))
                cached.with_suffix(".pt.tmp").replace(cached)  # atomic: a concurrent flowserve run sees all or none
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
