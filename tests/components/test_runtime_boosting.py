"""XGBoostModel and LightGBMModel: outputs equal the estimators' own, ports by objective, bad files refused.

The models are trained here on scikit-learn's bundled data (breast cancer: binary; iris: three classes;
diabetes: regression), a few trees each, and saved in the libraries' native formats.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flowserve.component import Batch, Port
from flowserve.errors import ComponentError, ErrorKind, TopologyError
from flowserve.topology import load_topology
from flowserve_components.boosting import LightGBMModel, XGBoostModel

xgboost = pytest.importorskip("xgboost")
lightgbm = pytest.importorskip("lightgbm")
datasets = pytest.importorskip("sklearn.datasets")


def _data(name: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    if name == "diabetes":
        y = y / 100.0  # targets of a few units: FP32 outputs then hold them to within 1e-5
    return x.astype(np.float32), y


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("boosting")
    made: dict[str, Any] = {}
    for data in ("breast_cancer", "iris", "diabetes"):
        x, y = _data(data)
        if data == "diabetes":
            xgb: Any = xgboost.XGBRegressor(n_estimators=8, max_depth=3, n_jobs=1, random_state=0).fit(x, y)
            lgb: Any = lightgbm.LGBMRegressor(n_estimators=8, n_jobs=1, verbose=-1, random_state=0).fit(x, y)
        else:
            xgb = xgboost.XGBClassifier(n_estimators=8, max_depth=3, n_jobs=1, random_state=0).fit(x, y)
            lgb = lightgbm.LGBMClassifier(n_estimators=8, n_jobs=1, verbose=-1, random_state=0).fit(x, y)
        suffix = "ubj" if data == "iris" else "json"  # both native XGBoost formats
        xgb.save_model(folder / f"{data}.{suffix}")
        lgb.booster_.save_model(str(folder / f"{data}.txt"))
        made[data] = {"xgboost": (xgb, folder / f"{data}.{suffix}"), "lightgbm": (lgb, folder / f"{data}.txt")}
    (folder / "model.pkl").write_bytes(pickle.dumps(made["iris"]["xgboost"][0]))
    made["dir"] = folder
    return made


RUNTIMES = {"xgboost": XGBoostModel, "lightgbm": LightGBMModel}


def run(component: Any, x: np.ndarray) -> dict[str, np.ndarray]:
    rows = len(x)
    sizes = [3] * (rows // 3) + ([rows % 3] if rows % 3 else [])
    out = component.process(Batch({"x": x}, sizes, [f"r{i}" for i in range(len(sizes))]))
    assert isinstance(out, dict)
    return out


@pytest.mark.parametrize("library", list(RUNTIMES))
@pytest.mark.parametrize("data", ["breast_cancer", "iris", "diabetes"])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_outputs_equal_the_estimator_run_directly(models: dict[str, Any], library: str, data: str,
                                                  rows: int) -> None:
    estimator, path = models[data][library]
    component = RUNTIMES[library].configure({"model": str(path)}, node="model")
    x, _ = _data(data)
    x = x[np.random.default_rng(rows).integers(0, len(x), rows)]
    x[0, 0] = np.nan  # a missing value, routed as in training
    component.setup()
    out = run(component, x)
    assert component.inputs == {"x": Port("FP32", [-1, x.shape[1]])}
    if data == "diabetes":
        assert set(component.outputs) == {"prediction"}
        np.testing.assert_allclose(out["prediction"], estimator.predict(x), atol=1e-5, rtol=0)
        return
    classes = 2 if data == "breast_cancer" else 3
    assert component.outputs == {"label": Port("INT64", [-1]), "probs": Port("FP32", [-1, classes])}
    np.testing.assert_array_equal(out["label"], estimator.predict(x))
    np.testing.assert_allclose(out["probs"], estimator.predict_proba(x), atol=1e-5, rtol=0)
    assert f"weights=sha256:{component.weights_hash}" in component.describe()


def test_xgboost_booster_direct_and_label_only_objectives(models: dict[str, Any], tmp_path: Path) -> None:
    _, path = models["iris"]["xgboost"]
    x, y = _data("iris")
    booster = xgboost.Booster(model_file=str(path))
    out = run(XGBoostModel.configure({"model": str(path)}), x)
    np.testing.assert_allclose(out["probs"], booster.predict(xgboost.DMatrix(x)), atol=1e-5, rtol=0)
    softmax = xgboost.XGBClassifier(n_estimators=4, objective="multi:softmax", n_jobs=1).fit(x, y)
    softmax.save_model(tmp_path / "softmax.json")
    component = XGBoostModel.configure({"model": str(tmp_path / "softmax.json")})
    assert component.outputs == {"label": Port("INT64", [-1])}
    np.testing.assert_array_equal(run(component, x)["label"], softmax.predict(x))


def test_model_from_names_a_function_returning_the_path(empty_cache: Path) -> None:
    component = XGBoostModel.configure({"model_from": "flowserve_components.iris:ensure_model"})
    assert component.outputs["probs"] == Port("FP32", [-1, 3])
    assert component.file.path == empty_cache / "models" / "iris-xgb.json"  # trained there on first use
    with pytest.raises(ComponentError, match="either 'model'"):
        XGBoostModel.configure({})
    with pytest.raises(ComponentError, match="module 'flowserve_components.iris' has no 'nope'"):
        XGBoostModel.configure({"model_from": "flowserve_components.iris:nope"})


def _error(cls: Any, path: Path) -> str:
    with pytest.raises(ComponentError) as info:
        cls.configure({"model": str(path)}, node="model")
    message = str(info.value)
    assert str(path) in message, message
    return message


@pytest.mark.parametrize("library", list(RUNTIMES))
def test_bad_files_fail_at_load_naming_the_file(models: dict[str, Any], library: str, tmp_path: Path) -> None:
    cls = RUNTIMES[library]
    assert "no such file" in _error(cls, tmp_path / "gone.json")
    message = _error(cls, models["dir"] / "model.pkl")
    assert "is a pickle" in message and "so it is refused" in message and "save_model" in message
    (tmp_path / "text.json").write_text("this is not a model\n")
    message = _error(cls, tmp_path / "text.json")
    assert "cannot read it" in message or "not a LightGBM text model" in message
    other = models["iris"]["lightgbm" if library == "xgboost" else "xgboost"][1]  # the other library's file
    message = _error(cls, other)
    assert "XGBoost cannot read it" in message or "not a LightGBM text model" in message


def test_a_pickled_model_in_a_topology_is_an_invalid_topology(models: dict[str, Any], write_topology) -> None:
    pickled = models["dir"] / "model.pkl"
    path = write_topology(f"name: NAME\nnodes:\n  model:\n    component: flowserve_components.boosting:XGBoostModel\n"
                          f"    params: {{model: {pickled}}}\n    inputs: {{x: input.x}}\noutputs:\n"
                          "  label: model.label\n")
    with pytest.raises(TopologyError, match=f"{pickled}: is a pickle") as info:
        load_topology(path)
    assert info.value.kind is ErrorKind.INVALID_TOPOLOGY and "model" in str(info.value)
