"""OnnxModel: ports read from the graph, outputs equal torch's, bad models refused at load, served on a broker.

The models are built here: a tiny CNN with random weights exported by ``torch.onnx.export`` with a dynamic
batch axis, and small graphs made with ``onnx.helper`` for the datatype and error cases.
"""

from __future__ import annotations

import asyncio
import pickle
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from flowserve.client import TopologyClient
from flowserve.component import Batch, Port
from flowserve.errors import ComponentError, ErrorKind, TopologyError
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology
from flowserve_components.onnx import OnnxModel


class TinyCNN(torch.nn.Module):
    """Conv -> ReLU -> pool -> linear over 1x8x8 images; returns logits and probabilities."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 4 * 4, 10)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv(image)), 2)
        logits = self.fc(x.flatten(1))
        return logits, torch.softmax(logits, dim=1)


def export(module: torch.nn.Module, path: Path, *, dynamic: bool = True, input_name: str = "image") -> Path:
    example = torch.zeros(2, 1, 8, 8)
    axes = {input_name: {0: "batch"}, "logits": {0: "batch"}, "probs": {0: "batch"}} if dynamic else None
    with warnings.catch_warnings():  # the TorchScript-based exporter is deprecated, and needs no onnxscript
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (example,), str(path), input_names=[input_name],
                          output_names=["logits", "probs"], dynamic_axes=axes, dynamo=False)
    return path


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[TinyCNN, Path]:
    torch.manual_seed(0)
    module = TinyCNN().eval()
    return module, export(module, tmp_path_factory.mktemp("onnx") / "cnn.onnx")


def torch_outputs(module: TinyCNN, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.inference_mode():
        logits, probs = module(torch.from_numpy(images))
    return logits.numpy(), probs.numpy()


def save(graph: onnx.GraphProto, path: Path, opset: int = 17) -> Path:
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def identity_graph(elem: int, shape: list[int | str], name: str = "x") -> onnx.GraphProto:
    return helper.make_graph([helper.make_node("Identity", [name], ["y"])], "g",
                             [helper.make_tensor_value_info(name, elem, shape)],
                             [helper.make_tensor_value_info("y", elem, shape)])


def run(component: OnnxModel, sizes: list[int], **tensors: np.ndarray) -> dict[str, np.ndarray]:
    out = component.process(Batch(tensors, sizes, [f"r{i}" for i in range(len(sizes))]))
    assert isinstance(out, dict)
    return out


def test_ports_are_read_from_the_graph(cnn: tuple[TinyCNN, Path]) -> None:
    component = OnnxModel.configure({"model": str(cnn[1])}, node="classify")
    assert component.inputs == {"image": Port("FP32", [-1, 1, 8, 8])}
    assert component.outputs == {"logits": Port("FP32", [-1, 10]), "probs": Port("FP32", [-1, 10])}


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_outputs_equal_torch(cnn: tuple[TinyCNN, Path], rows: int) -> None:
    module, path = cnn
    images = np.random.default_rng(rows).standard_normal((rows, 1, 8, 8)).astype(np.float32)
    component = OnnxModel.configure({"model": str(path)}, node="classify")
    component.setup()
    try:
        # one batch of several requests of up to 3 rows each: one session.run for all of them
        sizes = [3] * (rows // 3) + ([rows % 3] if rows % 3 else [])
        out = run(component, sizes, image=images)
    finally:
        component.close()
    logits, probs = torch_outputs(module, images)
    assert out["logits"].shape == (rows, 10) and out["logits"].dtype == np.float32
    np.testing.assert_allclose(out["logits"], logits, atol=1e-5, rtol=0)
    np.testing.assert_allclose(out["probs"], probs, atol=1e-5, rtol=0)
    assert component.device == "cpu" or torch.cuda.is_available()
    assert f"weights=sha256:{component.weights_hash}" in component.describe()


def test_datatypes_map_from_onnx_element_types(tmp_path: Path) -> None:
    for elem, datatype, values in [
        (TensorProto.INT64, "INT64", np.array([[1, -2, 3]], dtype=np.int64)),
        (TensorProto.UINT8, "UINT8", np.array([[0, 7, 255]], dtype=np.uint8)),
        (TensorProto.BOOL, "BOOL", np.array([[True, False, True]])),
        (TensorProto.DOUBLE, "FP64", np.array([[0.5, 1e300, -2.0]])),
        (TensorProto.FLOAT16, "FP16", np.array([[0.5, 2.0, -1.0]], dtype=np.float16)),
        (TensorProto.STRING, "BYTES", np.array([[b"a", "é".encode(), b""]], dtype=object)),
    ]:
        path = save(identity_graph(elem, ["n", 3]), tmp_path / f"{datatype}.onnx")
        component = OnnxModel.configure({"model": str(path)})
        assert component.inputs == {"x": Port(datatype, [-1, 3])}
        assert component.outputs == {"y": Port(datatype, [-1, 3])}
        component.setup()
        out = run(component, [1], x=values)["y"]
        assert out.dtype == values.dtype and out.tolist() == values.tolist(), datatype


def test_graph_names_that_are_not_port_names_are_renamed(tmp_path: Path) -> None:
    path = save(identity_graph(TensorProto.FLOAT, ["n", 2], name="input.1"), tmp_path / "dotted.onnx")
    with pytest.raises(ComponentError, match=r"graph input 'input\.1' is not a valid port name.*names"):
        OnnxModel.configure({"model": str(path)})
    component = OnnxModel.configure({"model": str(path), "names": {"input.1": "x", "y": "out"}})
    assert list(component.inputs) == ["x"] and list(component.outputs) == ["out"]
    component.setup()
    np.testing.assert_array_equal(run(component, [2], x=np.ones((2, 2), np.float32))["out"], np.ones((2, 2)))
    with pytest.raises(ComponentError, match=r"'names' maps nope, which the graph lacks \(inputs: input\.1"):
        OnnxModel.configure({"model": str(path), "names": {"nope": "x"}})


def _load_error(path: Path) -> str:
    with pytest.raises(ComponentError) as info:
        OnnxModel.configure({"model": str(path)}, node="classify")
    message = str(info.value)
    assert str(path) in message, message
    return message


def test_bad_models_fail_at_load_naming_the_file(tmp_path: Path, cnn: tuple[TinyCNN, Path]) -> None:
    assert "no such file" in _load_error(tmp_path / "missing.onnx")
    (tmp_path / "text.onnx").write_text("this is not a model\n" * 10)
    assert "not an ONNX file" in _load_error(tmp_path / "text.onnx")
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert "not an ONNX model" in _load_error(tmp_path / "empty.onnx")
    (tmp_path / "model.pkl").write_bytes(pickle.dumps({"weights": [1.0]}))
    assert "pickle" in _load_error(tmp_path / "model.pkl")
    torch.save(cnn[0].state_dict(), tmp_path / "model.pt")
    assert "refused" in _load_error(tmp_path / "model.pt")
    future = save(identity_graph(TensorProto.FLOAT, ["n", 3]), tmp_path / "future.onnx", opset=99)
    assert "unsupported opset 99" in _load_error(future)
    fixed = export(TinyCNN().eval(), tmp_path / "fixed.onnx", dynamic=False)
    assert "graph input 'image' has shape [2, 1, 8, 8]: no batch dimension" in _load_error(fixed)
    scalar = save(identity_graph(TensorProto.FLOAT, []), tmp_path / "scalar.onnx")
    assert "no batch dimension" in _load_error(scalar)
    complex_ = save(identity_graph(TensorProto.COMPLEX64, ["n"]), tmp_path / "complex.onnx")
    assert "holds COMPLEX64, which has no V2 datatype" in _load_error(complex_)


def test_a_provider_onnx_runtime_lacks_fails_at_setup(cnn: tuple[TinyCNN, Path]) -> None:
    component = OnnxModel.configure({"model": str(cnn[1]), "providers": ["NoSuchExecutionProvider"]}, node="m")
    with pytest.raises(ComponentError, match=r"node 'm': ONNX Runtime here has no NoSuchExecutionProvider "
                                             r"\(available: .*CPUExecutionProvider"):
        component.setup()


TOPOLOGY = """\
name: NAME
nodes:
  classify:
    component: flowserve_components.onnx:OnnxModel
    params: {{model: {model}, threads: 1}}
    inputs: {{{port}: input.image}}
outputs:
  logits: classify.logits
  probs: classify.probs
"""


def test_wiring_a_port_the_graph_lacks_is_an_invalid_topology(cnn: tuple[TinyCNN, Path], write_topology) -> None:
    path = write_topology(TOPOLOGY.format(model=cnn[1], port="pixels"))
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    assert info.value.kind is ErrorKind.INVALID_TOPOLOGY
    assert "unknown input port 'pixels'" in str(info.value) and "(its inputs: image)" in str(info.value)
    assert "classify" in str(info.value)
    bad = write_topology(TOPOLOGY.format(model=cnn[1].with_name("gone.onnx"), port="image"))
    with pytest.raises(TopologyError, match="gone.onnx: no such file") as info:
        load_topology(bad)
    assert info.value.kind is ErrorKind.INVALID_TOPOLOGY


async def test_onnx_topology_on_a_broker(kafka: KafkaSettings, cnn: tuple[TinyCNN, Path], write_topology) -> None:
    module, model = cnn
    topology = load_topology(write_topology(TOPOLOGY.format(model=model, port="image")))
    rng = np.random.default_rng(5)
    requests = [rng.standard_normal((rows, 1, 8, 8)).astype(np.float32) for rows in (1, 7, 64, 3, 1, 2)]
    async with InlineHost(topology, kafka), TopologyClient(topology, kafka) as client:
        futures = []
        for i, images in enumerate(requests):  # all at once, so the model runs on batches of several requests
            futures.append(client.expect(f"r{i}"))
            await client.queue({"image": images}, request_id=f"r{i}", timeout_ms=60_000)
        await client.flush()
        replies = await asyncio.wait_for(asyncio.gather(*futures), 120)
    for images, reply in zip(requests, replies, strict=True):
        assert reply.error is None, reply.error
        logits, probs = torch_outputs(module, images)
        np.testing.assert_allclose(reply.tensors["logits"], logits, atol=1e-5, rtol=0)
        np.testing.assert_allclose(reply.tensors["probs"], probs, atol=1e-5, rtol=0)
