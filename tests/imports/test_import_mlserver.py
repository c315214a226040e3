"""`flowserve import` on an MLServer model repository made here: a scikit-learn model saved with skops, an
XGBoost JSON model, a LightGBM text model and an ONNX model are served through the gateway with the original
models' outputs; a joblib pickle and a custom runtime are listed as not mapped, with why."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from imports_support import run_cli, serving
from onnx import TensorProto, helper

from flowserve.imports import RepositoryError, import_repository
from flowserve.kafka.settings import KafkaSettings

skops_io = pytest.importorskip("skops.io")
xgboost = pytest.importorskip("xgboost")
lightgbm = pytest.importorskip("lightgbm")
pytest.importorskip("sklearn")

from sklearn.datasets import load_iris  # noqa: E402 - after the skips: scikit-learn is the components' extra
from sklearn.linear_model import LogisticRegression  # noqa: E402


def _settings(folder: Path, settings: dict) -> None:
    folder.mkdir(parents=True)
    (folder / "model-settings.json").write_text(json.dumps(settings))


@pytest.fixture
def repository(tmp_path: Path) -> tuple[Path, dict[str, object], str]:
    """An MLServer repository: iris as skops (sklearn) and JSON (XGBoost), a joblib pickle, a custom runtime."""
    iris = load_iris()
    x, y = iris.data, iris.target
    tag = uuid.uuid4().hex[:8]  # topology names (and so topics) unique to this test
    repo = tmp_path / "models"
    sk = LogisticRegression(max_iter=500).fit(x, y)
    _settings(repo / "iris-sk", {"name": f"iris-sk-{tag}", "implementation": "mlserver_sklearn.SKLearnModel",
                                 "parameters": {"uri": "./model.skops"},
                                 "inputs": [{"name": "features", "datatype": "FP64", "shape": [-1, 4]}],
                                 "outputs": [{"name": "predict"}, {"name": "predict_proba"}]})
    skops_io.dump(sk, repo / "iris-sk" / "model.skops")
    xgb = xgboost.XGBClassifier(n_estimators=8, max_depth=3, random_state=0).fit(x, y)
    _settings(repo / "iris-xgb", {"name": f"iris-xgb-{tag}", "implementation": "mlserver_xgboost.XGBoostModel",
                                  "inputs": [{"name": "input-0", "datatype": "FP32", "shape": [-1, 4]}]})
    xgb.save_model(repo / "iris-xgb" / "model.json")  # no uri: found by MLServer's well-known name
    binary = lightgbm.train({"objective": "binary", "num_leaves": 4, "verbose": -1, "num_threads": 1},
                            lightgbm.Dataset(x, (y == 2).astype(int)), num_boost_round=5)
    _settings(repo / "virginica", {"name": f"virginica-{tag}", "implementation": "mlserver_lightgbm.LightGBMModel",
                                   "parameters": {"uri": "./model.bst"}})
    binary.save_model(repo / "virginica" / "model.bst")
    graph = helper.make_graph([helper.make_node("Softmax", ["scores"], ["probs"], axis=1)], "softmax",
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 4])])
    _settings(repo / "softmax", {"name": f"softmax-{tag}", "implementation": "mlserver_onnx.OnnxRuntime",
                                 "parameters": {"uri": "./model.onnx"}})
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, repo / "softmax" / "model.onnx")
    import joblib

    _settings(repo / "churn", {"name": "churn", "implementation": "mlserver_sklearn.SKLearnModel"})
    joblib.dump(sk, repo / "churn" / "model.joblib")
    _settings(repo / "custom", {"name": "custom", "implementation": "models.MyRuntime"})
    return repo, {"sk": sk, "xgb": xgb, "lgb": binary}, tag


def test_writes_a_topology_per_model_and_lists_what_it_cannot_map(repository, tmp_path: Path) -> None:
    repo, _, tag = repository
    report = import_repository(repo, tmp_path / "out")
    assert sorted(report.written) == [f"iris-sk-{tag}", f"iris-xgb-{tag}", f"softmax-{tag}", f"virginica-{tag}"]
    sk = yaml.safe_load(report.written[f"iris-sk-{tag}"].read_text())
    node = sk["nodes"][f"iris-sk-{tag}"]
    assert node["component"] == "flowserve_components.sklearn_model:SklearnModel"
    assert node["params"]["methods"] == {"predict": "predict", "predict_proba": "predict_proba"}
    assert node["inputs"] == {"x": "input.features"} and node["params"]["datatype"] == "FP64"
    assert sk["outputs"] == {"predict": f"iris-sk-{tag}.predict", "predict_proba": f"iris-sk-{tag}.predict_proba"}
    xgb = yaml.safe_load(report.written[f"iris-xgb-{tag}"].read_text())
    assert xgb["outputs"] == {"predict": f"iris-xgb-{tag}.label", "predict_proba": f"iris-xgb-{tag}.probs"}
    assert Path(xgb["nodes"][f"iris-xgb-{tag}"]["params"]["model"]) == (repo / "iris-xgb" / "model.json").resolve()
    unmapped = {u.model: u for u in report.unmapped}
    assert sorted(unmapped) == ["churn", "custom"]
    assert "a pickle (.joblib)" in unmapped["churn"].why and "skops.io.dump(model, 'model.skops')" in unmapped[
        "churn"].why
    assert unmapped["custom"].what == "implementation 'models.MyRuntime'"
    assert "custom runtime" in unmapped["custom"].why
    lgb = yaml.safe_load(report.written[f"virginica-{tag}"].read_text())
    assert lgb["outputs"] == {"predict": f"virginica-{tag}.probs"}
    notes = {n.what: n for n in report.notes if n.model == f"virginica-{tag}"}
    assert sorted(notes) == ["inputs", "output 'predict'"] and len(report.notes) == 2
    assert "P(positive), [-1]" in notes["output 'predict'"].why  # MLServer answers one column; the topology both
    assert "the topology's input is named 'input-0'" in notes["inputs"].why
    onnx_node = yaml.safe_load(report.written[f"softmax-{tag}"].read_text())["nodes"][f"softmax-{tag}"]
    assert onnx_node["component"] == "flowserve_components.onnx:OnnxModel"
    assert onnx_node["inputs"] == {"scores": "input.scores"}


def test_cli_prints_what_it_wrote_and_what_it_could_not_map(repository, tmp_path: Path, capsys) -> None:
    repo, _, tag = repository
    out = tmp_path / "out"
    assert run_cli(["import", str(repo), "--out", str(out), "--name", f"iris-xgb-{tag}", "--name", "nope"]) == 1
    printed = capsys.readouterr().out
    assert f"iris-xgb-{tag}: {out / f'iris-xgb-{tag}.yaml'}" in printed
    assert "nope: --name: no model or ensemble of that name" in printed and "churn" not in printed
    assert sorted(p.name for p in out.iterdir()) == [f"iris-xgb-{tag}.yaml"]
    assert run_cli(["import", str(repo), "--out", str(out), "--name", f"iris-xgb-{tag}"]) == 1  # exists
    assert "exists; remove it or pass --force" in capsys.readouterr().out
    assert run_cli(["import", str(repo), "--out", str(out), "--name", f"iris-xgb-{tag}", "--force"]) == 0
    assert run_cli(["import", str(tmp_path / "out")]) == 2  # not a repository
    with pytest.raises(RepositoryError, match="not a model repository"):
        import_repository(out, tmp_path)


async def test_imported_models_answer_v2_requests_as_the_originals(repository, tmp_path: Path,
                                                                   kafka: KafkaSettings) -> None:
    repo, originals, tag = repository
    report = import_repository(repo, tmp_path / "out")
    x = load_iris().data
    rng = np.random.default_rng(5)
    softmax = ort.InferenceSession(str(repo / "softmax" / "model.onnx"), providers=["CPUExecutionProvider"])
    async with serving(list(report.written.values()), kafka) as client:
        for rows in (1, 7, 64):
            batch = x[rng.integers(0, len(x), rows)]
            reply = (await client.infer(f"iris-sk-{tag}", {"features": batch})).raise_for_status().outputs()
            np.testing.assert_array_equal(reply["predict"], originals["sk"].predict(batch))
            np.testing.assert_allclose(reply["predict_proba"], originals["sk"].predict_proba(batch), atol=1e-5,
                                       rtol=0)
            features = batch.astype(np.float32)
            reply = (await client.infer(f"iris-xgb-{tag}", {"input-0": features})).raise_for_status().outputs()
            np.testing.assert_array_equal(reply["predict"], originals["xgb"].predict(features))
            np.testing.assert_allclose(reply["predict_proba"], originals["xgb"].predict_proba(features), atol=1e-5,
                                       rtol=0)
            reply = (await client.infer(f"virginica-{tag}", {"input-0": features})).raise_for_status().outputs()
            np.testing.assert_allclose(reply["predict"][:, 1], originals["lgb"].predict(features), atol=1e-5, rtol=0)
            reply = (await client.infer(f"softmax-{tag}", {"scores": features})).raise_for_status().outputs()
            np.testing.assert_allclose(reply["probs"], softmax.run(None, {"scores": features})[0], atol=1e-5, rtol=0)
