"""Read an MLServer model repository: each folder with a ``model-settings.json`` is one model.

``implementation`` picks the runtime: ``mlserver_sklearn.SKLearnModel`` (a skops file: flowserve loads no
pickles, and MLServer's usual ``model.joblib`` is one), ``mlserver_xgboost.XGBoostModel``,
``mlserver_lightgbm.LightGBMModel`` and an ONNX runtime (any implementation whose module names onnx).
``parameters.uri`` is the model file (relative to the settings' folder; a folder is searched for the file
names MLServer looks for). Outputs are named as MLServer names them: ``predict``, and ``predict_proba``
where the model has it (MLServer answers it when a request asks; a topology always answers both).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flowserve.component import Port
from flowserve.imports.plan import ImportReport, ModelNode, Unmapped, safe_id

SETTINGS = "model-settings.json"
#: implementation -> runtime; ONNX runtimes are matched by module name (MLServer ships none of its own).
RUNTIMES = {"mlserver_sklearn.SKLearnModel": "sklearn", "mlserver_xgboost.XGBoostModel": "xgboost",
            "mlserver_lightgbm.LightGBMModel": "lightgbm"}
#: file names searched in a folder ``uri``: MLServer's own, then the safe formats flowserve reads.
WELL_KNOWN = {"sklearn": ["model.skops", "model.joblib", "model.pickle", "model.pkl"],
              "xgboost": ["model.json", "model.ubj", "model.bst"], "lightgbm": ["model.txt", "model.bst"],
              "onnx": ["model.onnx"]}
COMPONENTS = {"sklearn": "flowserve_components.sklearn_model:SklearnModel",
              "xgboost": "flowserve_components.boosting:XGBoostModel",
              "lightgbm": "flowserve_components.boosting:LightGBMModel", "onnx": "flowserve_components.onnx:OnnxModel"}
PICKLES = (".joblib", ".pkl", ".pickle")
RESAVE = {"sklearn": "skops.io.dump(model, 'model.skops')", "xgboost": "model.save_model('model.json')",
          "lightgbm": "model.booster_.save_model('model.txt')", "onnx": "torch.onnx.export or skl2onnx"}
#: why other runtimes MLServer ships are not imported, by the implementation's module
REFUSED = {
    "mlserver_mlflow": "an MLflow model runs its flavour's Python code to predict; export the model to ONNX (or "
                       "its native format) and serve that",
    "mlserver_huggingface": "a Hugging Face pipeline is Python code around the model; export the model to ONNX "
                            "and put the tokenizer in a component of its own",
    "mlserver_alibi_detect": "an alibi-detect detector is pickled Python objects; flowserve's drift detectors "
                             "are components (flowserve_components.drift)",
    "mlserver_alibi_explain": "an explainer runs Python code around the model; no runtime maps it",
}
#: port a flowserve runtime gives -> the method MLServer's sklearn runtime calls for it
SKLEARN_METHODS = {"label": "predict", "prediction": "predict", "probs": "predict_proba", "transformed": "transform"}
#: MLServer's sklearn runtime answers these outputs only
SKLEARN_OUTPUTS = ("predict", "predict_proba", "transform")


def find(root: Path) -> list[Path]:
    """Every ``model-settings.json`` under ``root`` (MLServer searches the repository recursively)."""
    return sorted(root.rglob(SETTINGS))


def read(settings_path: Path, report: ImportReport) -> ModelNode | None:
    """The node serving one model, or None with why under ``report.unmapped``."""
    try:
        return _read(settings_path, report)
    except (AttributeError, TypeError, ValueError) as exc:  # e.g. "parameters": [] or "inputs": "x"
        report.unmapped.append(Unmapped(settings_path.parent.name, str(settings_path), f"a field holds the wrong "
                                        f"kind of value ({exc})"))
        return None


def _read(settings_path: Path, report: ImportReport) -> ModelNode | None:
    folder = settings_path.parent
    try:
        settings = json.loads(settings_path.read_text())
        if not isinstance(settings, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        report.unmapped.append(Unmapped(folder.name, str(settings_path), f"cannot be read ({exc})"))
        return None
    name = str(settings.get("name") or folder.name)
    implementation = str(settings.get("implementation") or "")
    runtime = RUNTIMES.get(implementation) or ("onnx" if "onnx" in implementation.split(".")[0].lower() else None)
    if runtime is None:
        module = implementation.split(".")[0]
        why = REFUSED.get(module, "a custom runtime: its own Python class, which flowserve does not run; write its "
                                  "predict as a flowserve component (a Component with a process method)")
        report.unmapped.append(Unmapped(name, f"implementation '{implementation or '(none)'}'", why))
        return None
    parameters = settings.get("parameters") or {}
    model_file = _model_file(folder, parameters.get("uri"), runtime)
    if isinstance(model_file, str):
        report.unmapped.append(Unmapped(name, "parameters.uri", model_file))
        return None
    if model_file.suffix.lower() in PICKLES:
        report.unmapped.append(Unmapped(name, str(model_file), f"a pickle ({model_file.suffix}): loading one runs "
                                        "whatever code it names, so flowserve refuses it; re-save the model with "
                                        f"{RESAVE[runtime]} beside it (parameters.uri naming it, or left out)"))
        return None
    inputs = [i for i in settings.get("inputs") or [] if isinstance(i, dict)]
    outputs = [o for o in settings.get("outputs") or [] if isinstance(o, dict)]
    node = ModelNode(name=name, source=settings_path, server="MLServer", component=COMPONENTS[runtime],
                     params={"model": str(model_file)})
    if runtime == "onnx":  # ports are the graph's; requests name the graph's inputs and get its outputs
        return node
    if len(inputs) > 1:
        report.unmapped.append(Unmapped(name, "inputs", f"{len(inputs)} inputs: MLServer decodes several as a "
                                        "table's columns; put flowserve_components.tabular:Columns before the "
                                        "model (its 'columns' in the training order) and wire them to it"))
        return None
    tensor = safe_id(str(inputs[0].get("name") or "input-0")) if inputs else "input-0"
    if not inputs:
        report.notes.append(Unmapped(name, "inputs", "model-settings.json declares none: the topology's input is "
                                     "named 'input-0' (MLServer takes one tensor of any name)"))
    datatype = str(inputs[0].get("datatype") or "FP32") if inputs else "FP32"
    if datatype not in ("FP32", "FP64"):
        report.notes.append(Unmapped(name, f"input '{tensor}'", f"declared {datatype}; the runtime takes a float "
                                     "matrix (FP32), so requests send floats"))
        datatype = "FP32"
    node.params.update(datatype=datatype)
    node.inputs = {"x": tensor}
    if runtime == "sklearn":
        declared = [str(o.get("name")) for o in outputs]
        for other in (d for d in declared if d not in SKLEARN_OUTPUTS):
            report.notes.append(Unmapped(name, f"output '{other}'", "MLServer's sklearn runtime answers only "
                                         f"{', '.join(SKLEARN_OUTPUTS)}; left out"))
        node.params.update(precision="FP64")  # MLServer answers what numpy gives: float64
        node.refine = _sklearn_methods
        node.outputs = lambda ports: {p: p for p in ports}
    else:
        node.outputs = _boosting_outputs(name, runtime, report)
    return node


def _sklearn_methods(ports: dict[str, Port]) -> dict[str, Any]:
    """The methods behind MLServer's output names, from what the estimator has (probed with the defaults)."""
    methods = {SKLEARN_METHODS[p]: SKLEARN_METHODS[p] for p in ports if p in SKLEARN_METHODS}
    return {"methods": dict(sorted(methods.items(), key=lambda kv: SKLEARN_OUTPUTS.index(kv[0])))}


def _boosting_outputs(name: str, runtime: str, report: ImportReport) -> Any:
    def outputs(ports: dict[str, Port]) -> dict[str, str]:
        if runtime == "lightgbm":  # MLServer answers booster.predict(x): probabilities for a classifier
            if "probs" in ports and ports["probs"].shape == (-1, 2):
                report.notes.append(Unmapped(name, "output 'predict'", "MLServer answers a binary LightGBM model's "
                                             "P(positive), [-1]; the topology answers both classes' probabilities, "
                                             "[-1, 2] (the positive is column 1)"))
            return {"predict": "probs" if "probs" in ports else "prediction"}
        # MLServer loads an XGBoost classifier through XGBClassifier: predict gives labels, predict_proba probs
        if "label" in ports:
            return {"predict": "label", **({"predict_proba": "probs"} if "probs" in ports else {})}
        return {"predict": "prediction"}

    return outputs


def _model_file(folder: Path, uri: Any, runtime: str) -> Path | str:
    """The model file ``parameters.uri`` names (a folder: searched for well-known names), or why there is none."""
    path = folder / str(uri) if uri else folder  # an absolute uri stays itself
    if path.is_dir():
        found = next((path / n for n in WELL_KNOWN[runtime] if (path / n).is_file()), None)
        if found is None:
            return f"{path} holds none of {', '.join(WELL_KNOWN[runtime])}; point parameters.uri at the model file"
        path = found
    if not path.is_file():
        return f"{path}: no such file"
    return path.resolve()


def iterate(root: Path, report: ImportReport) -> Iterator[ModelNode]:
    for settings_path in find(root):
        node = read(settings_path, report)
        if node is not None:
            yield node
