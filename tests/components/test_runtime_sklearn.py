"""SklearnModel: outputs equal the estimator's own, ports from the estimator, pickles and untrusted types refused.

The estimators are fitted here on scikit-learn's bundled data and saved with ``skops.io.dump``.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_diabetes, load_iris
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from flowserve.component import Batch, Port
from flowserve.errors import ComponentError
from flowserve_components.sklearn_model import SklearnModel

sio = pytest.importorskip("skops.io")
TREE = "sklearn.tree._tree.Tree"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("sklearn")
    x, y = load_iris(return_X_y=True)
    xd, yd = load_diabetes(return_X_y=True)
    names = np.array(["setosa", "versicolor", "virginica"])
    fitted = {
        "pipeline": make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, y),
        "forest": RandomForestClassifier(n_estimators=5, random_state=0).fit(x, names[y]),  # string classes
        "ridge": Ridge().fit(xd, yd / 100.0),
    }
    made: dict[str, Any] = {"dir": folder}
    for name, estimator in fitted.items():
        sio.dump(estimator, folder / f"{name}.skops")
        made[name] = (estimator, folder / f"{name}.skops")
    (folder / "model.pkl").write_bytes(pickle.dumps(fitted["pipeline"]))
    return made


CASES = {
    "pipeline": ({}, "iris"),
    "forest": ({"trusted": [TREE]}, "iris"),
    "ridge": ({}, "diabetes"),
}


def run(component: SklearnModel, x: np.ndarray) -> dict[str, np.ndarray]:
    rows = len(x)
    sizes = [3] * (rows // 3) + ([rows % 3] if rows % 3 else [])
    out = component.process(Batch({"x": x}, sizes, [f"r{i}" for i in range(len(sizes))]))
    assert isinstance(out, dict)
    return out


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_outputs_equal_the_estimator_run_directly(models: dict[str, Any], case: str, rows: int) -> None:
    extra, data = CASES[case]
    estimator, path = models[case]
    component = SklearnModel.configure({"model": str(path), **extra}, node="model")
    component.setup()
    x_all = (load_iris if data == "iris" else load_diabetes)(return_X_y=True)[0].astype(np.float32)
    x = x_all[np.random.default_rng(rows).integers(0, len(x_all), rows)]
    out = run(component, x)
    assert component.inputs == {"x": Port("FP32", [-1, x.shape[1]])}
    if case == "ridge":
        assert component.outputs == {"prediction": Port("FP32", [-1])}
        np.testing.assert_allclose(out["prediction"], estimator.predict(x), atol=1e-5, rtol=0)
        return
    label = "BYTES" if case == "forest" else "INT64"
    assert component.outputs == {"label": Port(label, [-1]), "probs": Port("FP32", [-1, 3])}
    expected = estimator.predict(x)
    if case == "forest":
        expected = np.array([s.encode() for s in expected], dtype=object)
    assert out["label"].tolist() == expected.tolist()
    np.testing.assert_allclose(out["probs"], estimator.predict_proba(x), atol=1e-5, rtol=0)
    assert f"weights=sha256:{component.weights_hash}" in component.describe()


def test_methods_pick_the_outputs(models: dict[str, Any]) -> None:
    estimator, path = models["pipeline"]
    component = SklearnModel.configure({"model": str(path), "precision": "FP64",
                                        "methods": {"scores": "decision_function"}})
    assert component.outputs == {"scores": Port("FP64", [-1, 3])}
    x = load_iris(return_X_y=True)[0][:7].astype(np.float32)
    np.testing.assert_array_equal(run(component, x)["scores"], estimator.decision_function(x))
    with pytest.raises(ComponentError, match=r"Ridge has no method predict_proba \(output 'p'\)"):
        SklearnModel.configure({"model": str(models["ridge"][1]), "methods": {"p": "predict_proba"}})


def _error(params: dict[str, Any], path: Path) -> str:
    with pytest.raises(ComponentError) as info:
        SklearnModel.configure({"model": str(path), **params}, node="model")
    message = str(info.value)
    assert str(path) in message, message
    return message


def test_bad_models_fail_at_load_naming_the_file(models: dict[str, Any], tmp_path: Path) -> None:
    folder = models["dir"]
    assert "no such file" in _error({}, tmp_path / "gone.skops")
    message = _error({}, folder / "model.pkl")
    assert "is a pickle" in message and "so it is refused: save the estimator with skops.io.dump" in message
    (tmp_path / "model.zip").write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip archive
    assert "not a skops file" in _error({}, tmp_path / "model.zip")
    message = _error({}, folder / "forest.skops")
    assert f"holds types skops does not trust by default: {TREE}" in message
    assert "list them under 'trusted'" in message
    message = _error({"trusted": ["numpy.something_else"]}, folder / "forest.skops")
    assert TREE in message
