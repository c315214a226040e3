"""TorchProgram and TorchStateDict: outputs equal the module's own, ports from the file, bad models refused.

The models are built here with random weights: a small two-headed network saved as a TorchScript file, a
``torch.export`` program (with a dynamic batch), a safetensors state dict and a ``torch.save`` state dict.
The architecture entry point is a module this test writes to a temporary directory on ``sys.path``.
"""

from __future__ import annotations

import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from flowserve.component import Batch, Port
from flowserve.errors import ComponentError
from flowserve_components.torch_program import TorchProgram, TorchStateDict

save_file = pytest.importorskip("safetensors.torch").save_file

ARCH = '''\
import torch


class TwoHeads(torch.nn.Module):
    """logits and probabilities of a linear layer over 6 features."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, classes)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.fc(features)
        return logits, torch.softmax(logits, dim=1)


class Named(TwoHeads):
    def forward(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.fc(features)
        return {"logits": logits, "probs": torch.softmax(logits, dim=1)}
'''
PORTS: dict[str, Any] = {
    "inputs": {"features": {"datatype": "FP32", "shape": [-1, 6]}},
    "outputs": {"logits": {"datatype": "FP32", "shape": [-1, 3]}, "probs": {"datatype": "FP32", "shape": [-1, 3]}},
}


@pytest.fixture(scope="module")
def arch(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("arch")
    (folder / "fs_test_arch.py").write_text(ARCH)
    sys.path.insert(0, str(folder))
    try:
        import fs_test_arch

        yield fs_test_arch
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("fs_test_arch", None)


@pytest.fixture(scope="module")
def files(arch: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("torch-models")
    torch.manual_seed(0)
    module = arch.TwoHeads().eval()
    named = arch.Named().eval()
    named.load_state_dict(module.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(module), folder / "model.ts")
    batch = torch.export.Dim("batch")
    example = (torch.zeros(2, 6),)
    torch.export.save(torch.export.export(module, example, dynamic_shapes={"features": {0: batch}}),
                      folder / "model.pt2")
    torch.export.save(torch.export.export(named, example, dynamic_shapes={"features": {0: batch}}),
                      folder / "named.pt2")
    torch.export.save(torch.export.export(module, example), folder / "fixed.pt2")
    save_file(module.state_dict(), folder / "model.safetensors")
    torch.save(module.state_dict(), folder / "state.pt")
    torch.save(module, folder / "whole.pt")  # a pickled module: must be refused
    (folder / "model.pkl").write_bytes(pickle.dumps({"weights": [1.0]}))
    return {"module": module, "dir": folder}


def direct(module: torch.nn.Module, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.inference_mode():
        logits, probs = module(torch.from_numpy(x.copy()))
    return logits.numpy(), probs.numpy()


def run(component: Any, x: np.ndarray) -> dict[str, np.ndarray]:
    # requests of up to 3 rows each, all in one batch: one forward call for all of them
    rows = len(x)
    sizes = [3] * (rows // 3) + ([rows % 3] if rows % 3 else [])
    out = component.process(Batch({"features": x}, sizes, [f"r{i}" for i in range(len(sizes))]))
    assert isinstance(out, dict)
    return out


CASES = {
    "torchscript": (TorchProgram, lambda d: {"model": str(d / "model.ts"), **PORTS}),
    "export": (TorchProgram, lambda d: {"model": str(d / "model.pt2"), "outputs": {"logits": {}, "probs": {}}}),
    "export-dict": (TorchProgram, lambda d: {"model": str(d / "named.pt2")}),
    "safetensors": (TorchStateDict, lambda d: {"weights": str(d / "model.safetensors"),
                                               "architecture": "fs_test_arch:TwoHeads", **PORTS}),
    "state-dict": (TorchStateDict, lambda d: {"weights": str(d / "state.pt"), "arguments": {"classes": 3},
                                              "architecture": "fs_test_arch:TwoHeads", **PORTS}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_outputs_equal_the_module_run_directly(files: dict[str, Any], case: str, rows: int, torch_threads) -> None:
    cls, params = CASES[case]
    component = cls.configure(params(files["dir"]), node="model")
    assert component.inputs == {"features": Port("FP32", [-1, 6])}
    assert component.outputs == {"logits": Port("FP32", [-1, 3]), "probs": Port("FP32", [-1, 3])}
    component.setup()
    try:
        x = np.random.default_rng(rows).standard_normal((rows, 6)).astype(np.float32)
        x.setflags(write=False)  # as arrays decoded from the wire are
        out = run(component, x)
    finally:
        component.close()
    logits, probs = direct(files["module"], x)
    assert out["logits"].shape == (rows, 3) and out["logits"].dtype == np.float32
    np.testing.assert_allclose(out["logits"], logits, atol=1e-5, rtol=0)
    np.testing.assert_allclose(out["probs"], probs, atol=1e-5, rtol=0)
    assert f"weights=sha256:{component.weights_hash}" in component.describe()


def test_export_ports_default_to_numbered_outputs(files: dict[str, Any]) -> None:
    component = TorchProgram.configure({"model": str(files["dir"] / "model.pt2")})
    assert component.outputs == {"output0": Port("FP32", [-1, 3]), "output1": Port("FP32", [-1, 3])}


def _error(cls: Any, params: dict[str, Any], named: Path, *, setup: bool = False) -> str:
    with pytest.raises(ComponentError) as info:
        component = cls.configure(params, node="model")
        if setup:
            component.setup()
    message = str(info.value)
    assert str(named) in message, message
    return message


def test_bad_programs_fail_at_load_naming_the_file(files: dict[str, Any], tmp_path: Path, torch_threads) -> None:
    d = files["dir"]
    assert "no such file" in _error(TorchProgram, {"model": str(d / "gone.pt2")}, d / "gone.pt2")
    message = _error(TorchProgram, {"model": str(d / "model.pkl")}, d / "model.pkl")
    assert "is a pickle" in message and "runs whatever code it names, so it is refused" in message
    message = _error(TorchProgram, {"model": str(d / "whole.pt")}, d / "whole.pt")
    assert "torch.save archive (a pickle)" in message and "refused" in message
    (tmp_path / "text.pt2").write_text("not a model")
    assert "neither a TorchScript nor" in _error(TorchProgram, {"model": str(tmp_path / "text.pt2")},
                                                 tmp_path / "text.pt2")
    fixed = d / "fixed.pt2"
    assert "no batch dimension" in _error(TorchProgram, {"model": str(fixed)}, fixed)
    model = d / "model.pt2"
    message = _error(TorchProgram, {"model": str(model), "inputs": {"pixels": {}}}, model)
    assert "'inputs' declares pixels, but the program takes features" in message
    message = _error(TorchProgram, {"model": str(model), "inputs": {"features": {"datatype": "FP64"}}}, model)
    assert "input 'features' is FP32 in the program, but params declare FP64" in message
    message = _error(TorchProgram, {"model": str(model), "outputs": {"logits": {}}}, model)
    assert "returns 2 tensor(s), but 'outputs' declares 1" in message
    script = d / "model.ts"
    message = _error(TorchProgram, {"model": str(script), "inputs": {"features": {"datatype": "FP32"}},
                                    "outputs": PORTS["outputs"]}, script)
    assert "needs a datatype and a shape" in message


def test_wrong_names_and_dtypes_fail_at_setup_naming_the_file(files: dict[str, Any], torch_threads) -> None:
    script = files["dir"] / "model.ts"
    wrong_name = {**PORTS, "inputs": {"pixels": {"datatype": "FP32", "shape": [-1, 6]}}}
    message = _error(TorchProgram, {"model": str(script), **wrong_name}, script, setup=True)
    assert "forward takes (features), but 'inputs' declares pixels" in message
    wrong_dtype = {**PORTS, "inputs": {"features": {"datatype": "INT64", "shape": [-1, 6]}}}
    message = _error(TorchProgram, {"model": str(script), **wrong_dtype}, script, setup=True)
    assert "a probe with one row of zeros as declared (features INT64 [1, 6]) failed" in message
    wrong_shape = {**PORTS, "inputs": {"features": {"datatype": "FP32", "shape": [-1, 5]}}}
    assert "probe" in _error(TorchProgram, {"model": str(script), **wrong_shape}, script, setup=True)
    wrong_out = {**PORTS, "outputs": {"logits": {"datatype": "FP64", "shape": [-1, 3]},
                                      "probs": {"datatype": "FP32", "shape": [-1, 3]}}}
    message = _error(TorchProgram, {"model": str(script), **wrong_out}, script, setup=True)
    assert "output 'logits' is float32, but 'outputs' declares FP64" in message
    one_out = {**PORTS, "outputs": {"logits": {"datatype": "FP32", "shape": [-1, 3]}}}
    message = _error(TorchProgram, {"model": str(script), **one_out}, script, setup=True)
    assert "returned 2 tensor(s), but 'outputs' declares 1" in message


def test_bad_state_dicts_fail_naming_the_file(files: dict[str, Any], tmp_path: Path, torch_threads) -> None:
    d = files["dir"]
    base = {"architecture": "fs_test_arch:TwoHeads", **PORTS}
    message = _error(TorchStateDict, {**base, "weights": str(d / "model.pkl")}, d / "model.pkl")
    assert "is a pickle" in message and "refused" in message
    whole = d / "whole.pt"
    message = _error(TorchStateDict, {**base, "weights": str(whole)}, whole, setup=True)
    assert "holds more than plain tensors, so it is refused (torch.load with weights_only=True" in message
    assert "save model.state_dict(), not the model" in message
    other = {**base, "arguments": {"classes": 4}}
    message = _error(TorchStateDict, {**other, "weights": str(d / "model.safetensors")}, d / "model.safetensors",
                     setup=True)
    assert "does not fit 'fs_test_arch:TwoHeads'" in message and "size mismatch" in message
    with pytest.raises(ComponentError, match="module 'fs_test_arch' has no 'Nope'"):
        TorchStateDict.configure({**base, "architecture": "fs_test_arch:Nope", "weights": str(d / "state.pt")})
    extra = tmp_path / "extra.safetensors"
    save_file({**files["module"].state_dict(), "head.weight": torch.zeros(2)}, extra)
    message = _error(TorchStateDict, {**base, "weights": str(extra)}, extra, setup=True)
    assert "weights without parameters: head.weight" in message
