"""`flowserve import` on a Triton model repository made here: two ONNX models and an ensemble of the two,
served through the gateway with the outputs ONNX Runtime gives on the original files; a Python backend and a
TensorRT plan are listed as not mapped, with why."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from imports_support import serving
from onnx import TensorProto, helper, numpy_helper

from flowserve.imports import import_repository
from flowserve.kafka.settings import KafkaSettings

LINEAR = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ {{ name: "input.1", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "logits" data_type: TYPE_FP32 dims: [ 3 ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
"""
SOFTMAX = """# the backend form of the same platform
name: "{name}"
backend: "onnxruntime"
max_batch_size: 64
input: [ {{ name: "logits" data_type: TYPE_FP32 dims: [ 3 ] }} ]
output: [ {{ name: "probs" data_type: TYPE_FP32 dims: [ 3 ] }} ]
version_policy: {{ latest: {{ num_versions: 1 }} }}
"""
ENSEMBLE = """name: "{name}"
platform: "ensemble"
max_batch_size: 64
input [ {{ name: "IMAGE" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "CLASS_PROBS" data_type: TYPE_FP32 dims: [ 3 ] }} ]
ensemble_scheduling {{
  step [
    {{ model_name: "{softmax}" model_version: -1
       input_map {{ key: "logits" value: "scores" }}
       output_map {{ key: "probs" value: "CLASS_PROBS" }} }},
    {{ model_name: "{linear}" model_version: -1
       input_map {{ key: "input.1" value: "IMAGE" }}
       output_map {{ key: "logits" value: "scores" }} }}
  ]
}}
"""
PYTHON = 'name: "pre"\nbackend: "python"\nmax_batch_size: 8\n'
TENSORRT = 'name: "trt"\nplatform: "tensorrt_plan"\nmax_batch_size: 8\n'


def _onnx_model(path: Path, graph: onnx.GraphProto) -> None:
    path.parent.mkdir(parents=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every ONNX Runtime in use reads
    onnx.checker.check_model(model)
    onnx.save(model, path)


def _tensor(name: str, width: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width])


@pytest.fixture
def repository(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """Triton's layout: <model>/config.pbtxt and <model>/<version>/model.onnx; names unique to this test."""
    tag = uuid.uuid4().hex[:8]
    names = {"linear": f"linear-{tag}", "softmax": f"softmax-{tag}", "ensemble": f"pipeline-{tag}"}
    repo = tmp_path / "triton"
    rng = np.random.default_rng(3)
    weights = [numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "W"),
               numpy_helper.from_array(rng.normal(size=3).astype(np.float32), "b")]
    linear = helper.make_graph([helper.make_node("MatMul", ["input.1", "W"], ["xw"]),
                                helper.make_node("Add", ["xw", "b"], ["logits"])],
                               "linear", [_tensor("input.1", 4)], [_tensor("logits", 3)], weights)
    _onnx_model(repo / names["linear"] / "1" / "model.onnx", linear)
    _onnx_model(repo / names["linear"] / "3" / "model.onnx", linear)  # the newest version is served
    (repo / names["linear"] / "2").mkdir()
    softmax = helper.make_graph([helper.make_node("Softmax", ["logits"], ["probs"], axis=1)],
                                "softmax", [_tensor("logits", 3)], [_tensor("probs", 3)])
    _onnx_model(repo / names["softmax"] / "1" / "model.onnx", softmax)
    (repo / names["linear"] / "config.pbtxt").write_text(LINEAR.format(name=names["linear"]))
    (repo / names["softmax"] / "config.pbtxt").write_text(SOFTMAX.format(name=names["softmax"]))
    (repo / names["ensemble"] / "1").mkdir(parents=True)  # Triton wants a version folder, empty, for an ensemble
    (repo / names["ensemble"] / "config.pbtxt").write_text(ENSEMBLE.format(name=names["ensemble"], **names))
    (repo / "pre" / "1").mkdir(parents=True)
    (repo / "pre" / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (repo / "pre" / "config.pbtxt").write_text(PYTHON)
    (repo / "trt" / "1").mkdir(parents=True)
    (repo / "trt" / "config.pbtxt").write_text(TENSORRT)
    return repo, names


def test_writes_a_topology_per_model_and_one_per_ensemble(repository, tmp_path: Path) -> None:
    repo, names = repository
    report = import_repository(repo, tmp_path / "out")
    assert sorted(report.written) == sorted(names.values())
    linear = yaml.safe_load(report.written[names["linear"]].read_text())
    node = linear["nodes"][names["linear"]]
    assert node["params"] == {"model": str((repo / names["linear"] / "3" / "model.onnx").resolve()),
                              "names": {"input.1": "input_1"}}
    assert node["inputs"] == {"input_1": "input.input_1"} and node["replicas"] == 2
    ensemble = yaml.safe_load(report.written[names["ensemble"]].read_text())
    assert ensemble["nodes"][names["linear"]]["inputs"] == {"input_1": "input.IMAGE"}
    assert ensemble["nodes"][names["softmax"]]["inputs"] == {"logits": f"{names['linear']}.logits"}
    assert ensemble["outputs"] == {"CLASS_PROBS": f"{names['softmax']}.probs"}
    unmapped = {u.model: u for u in report.unmapped}
    assert sorted(unmapped) == ["pre", "trt"]
    assert unmapped["pre"].what == "platform/backend 'python'" and "runs model.py" in unmapped["pre"].why
    assert "TensorRT engine" in unmapped["trt"].why
    assert [str(n) for n in report.notes] == [f"{names['linear']}: tensor 'input.1': requests name it 'input_1' "
                                              "(a port name)"]


def test_a_config_that_disagrees_with_the_model_file(repository, tmp_path: Path) -> None:
    repo, names = repository
    config = repo / names["softmax"] / "config.pbtxt"
    config.write_text(config.read_text().replace(
        'input: [ { name: "logits" data_type: TYPE_FP32 dims: [ 3 ] } ]', 'input: [ { name: "logits" '
        'data_type: TYPE_INT64 dims: [ 5 ] }, { name: "mask" data_type: TYPE_BOOL dims: [ 3 ] } ]'))
    report = import_repository(repo, tmp_path / "out", names=[names["softmax"]])
    assert [str(n) for n in report.notes] == [f"{names['softmax']}: input 'logits': the config says INT64 [-1, 5], "
                                              "the model file FP32 [-1, 3]: the topology follows the model file"]
    assert [str(u) for u in report.unmapped] == [f"{names['softmax']}: input 'mask': the config declares it, the "
                                                 "model file has no such input (its inputs: logits)"]
    config.write_text('name: "x"\nplatform: "onnxruntime_onnx"\ninput [ { name: "logits" ')
    report = import_repository(repo, tmp_path / "out", names=[names["softmax"]], force=True)
    assert [u.why for u in report.unmapped] == [f"cannot be read ({config}:3:26: expected '}}' before the end)"]


async def test_imported_models_and_ensemble_answer_as_onnx_runtime_does(repository, tmp_path: Path,
                                                                        kafka: KafkaSettings) -> None:
    repo, names = repository
    report = import_repository(repo, tmp_path / "out")
    linear = ort.InferenceSession(str(repo / names["linear"] / "3" / "model.onnx"), providers=["CPUExecutionProvider"])
    softmax = ort.InferenceSession(str(repo / names["softmax"] / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(8)
    async with serving(list(report.written.values()), kafka) as client:
        for rows in (1, 7, 64):
            x = rng.normal(size=(rows, 4)).astype(np.float32)
            logits = linear.run(None, {"input.1": x})[0]
            probs = softmax.run(None, {"logits": logits})[0]
            reply = (await client.infer(names["linear"], {"input_1": x})).raise_for_status().outputs()
            np.testing.assert_allclose(reply["logits"], logits, atol=1e-5, rtol=0)
            reply = (await client.infer(names["softmax"], {"logits": logits})).raise_for_status().outputs()
            np.testing.assert_allclose(reply["probs"], probs, atol=1e-5, rtol=0)
            reply = (await client.infer(names["ensemble"], {"IMAGE": x})).raise_for_status().outputs()
            assert list(reply) == ["CLASS_PROBS"]
            np.testing.assert_allclose(reply["CLASS_PROBS"], probs, atol=1e-5, rtol=0)


@pytest.mark.filterwarnings("ignore:`torch.jit.* is deprecated:FutureWarning")
def test_a_torchscript_model_takes_its_ports_from_the_config(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    class Scale(torch.nn.Module):
        def forward(self, image: torch.Tensor) -> torch.Tensor:
            return image * 2

    repo = tmp_path / "triton"
    for name, tensor in (("named", "image"), ("positional", "INPUT__0")):
        (repo / name / "1").mkdir(parents=True)
        torch.jit.save(torch.jit.script(Scale()), str(repo / name / "1" / "model.pt"))
        (repo / name / "config.pbtxt").write_text(
            f'platform: "pytorch_libtorch"\nmax_batch_size: 16\ninput [ {{ name: "{tensor}" data_type: TYPE_FP32 '
            'dims: [ 2, 2 ] } ]\noutput [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]\n')
    report = import_repository(repo, tmp_path / "out")
    assert list(report.written) == ["named"]
    params = yaml.safe_load(report.written["named"].read_text())["nodes"]["named"]["params"]
    assert params["inputs"] == {"image": {"datatype": "FP32", "shape": [-1, 2, 2]}}
    assert params["outputs"] == {"OUTPUT__0": {"datatype": "FP32", "shape": [-1, 2, 2]}}
    assert [u.model for u in report.unmapped] == ["positional"]
    assert "forward takes (image), but 'inputs' declares INPUT__0" in report.unmapped[0].why
    assert [u.what for u in report.notes] == ["input(s) INPUT__0"] and "by position" in report.notes[0].why


def test_a_model_folder_without_config_and_a_name_that_is_not_an_id(repository, tmp_path: Path) -> None:
    repo, names = repository
    auto = tmp_path / "auto" / "scores.v2"  # Triton completes an ONNX model's config from the file
    (auto / "1").mkdir(parents=True)
    (auto / "1" / "model.onnx").write_bytes((repo / names["softmax"] / "1" / "model.onnx").read_bytes())
    report = import_repository(auto.parent, tmp_path / "out")
    assert list(report.written) == ["scores_v2"] and not report.unmapped
    assert [(n.what, n.why) for n in report.notes] == [
        ("config.pbtxt", "none: read as an ONNX model, its ports from the file"),
        ("name", "served as 'scores_v2' (topology names are ids: letters, digits, '_' and '-', a letter first)")]
    one_model = import_repository(repo / names["softmax"], tmp_path / "one")  # the folder of one model
    assert list(one_model.written) == [names["softmax"]] and not one_model.unmapped
