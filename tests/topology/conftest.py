from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def _test_components_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``fs_test_components`` importable by the YAML under test; the path is removed afterwards."""
    monkeypatch.syspath_prepend(str(HERE))
