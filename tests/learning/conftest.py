"""Fixtures for continual learning: a digits-mlp trained once per session into its own model cache."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def mlp_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model cache holding digits-mlp (a few epochs: accurate enough, and quick)."""
    from flowserve_components import models

    cache = tmp_path_factory.mktemp("flowserve-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLOWSERVE_CACHE", str(cache))
        models.train("digits-mlp", epochs=8, quiet=True)
    return cache


@pytest.fixture
def cache(mlp_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """FLOWSERVE_CACHE for this test: the trained model, and a registry of its own (empty)."""
    mine = tmp_path / "cache"
    (mine / "models").mkdir(parents=True)
    for f in (mlp_cache / "models").glob("digits-mlp.pt"):
        (mine / "models" / f.name).write_bytes(f.read_bytes())
    monkeypatch.setenv("FLOWSERVE_CACHE", str(mine))
    return mine
