from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import numpy as np
import pytest

from flowserve.component import Component, Port
from flowserve.errors import ComponentError
from flowserve_components import models
from flowserve_components.digits import PIXEL_MAX, load_split
from flowserve_components.torch_stage import TorchClassifier

pytestmark = pytest.mark.usefixtures("torch_threads")


def _ready(params: dict, node: str = "model") -> TorchClassifier:
    component = TorchClassifier.configure(params, node=node)
    assert isinstance(component, TorchClassifier)
    component.setup()
    return component


def test_ports_and_batch_size() -> None:
    assert TorchClassifier.inputs == {"x": Port("FP32", [-1, 64], doc=TorchClassifier.inputs["x"].doc)}
    assert TorchClassifier.outputs == {"logits": Port("FP32", [-1, 10])}
    assert TorchClassifier.configure({"model": "digits-mlp"}).max_batch == TorchClassifier.max_batch
    assert TorchClassifier.configure({"model": "digits-mlp", "max_batch": 32}).max_batch == 32
    assert TorchClassifier.max_batch == 256
    assert TorchClassifier.offload  # torch work runs beside the worker's event loop


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"model": "resnet"}, "model: Value error, unknown model 'resnet'; the zoo has digits-mlp"),
        ({}, "give 'model' \\(a zoo name\\), 'path' \\(a weights file\\), or both"),
        ({"model": "digits-mlp", "threads": 0}, "threads"),
        ({"model": "digits-mlp", "device": "cuda"}, "device"),
    ],
)
def test_bad_params(params: dict, message: str) -> None:
    with pytest.raises(ComponentError, match=f"bad params for TorchClassifier: .*{message}"):
        TorchClassifier.configure(params)


def test_classifies_held_out_digits(model_cache: Path, make_batch) -> None:
    import torch

    component = _ready({"model": "digits-mlp", "threads": 1})
    assert component.device in ("cpu", "cuda")
    if component.device == "cpu":
        assert torch.get_num_threads() == 1
    x, y = load_split("test")
    # Decoded wire tensors are read-only views; that must work without torch's warning.
    frozen = np.frombuffer((np.array(x[:40]) / np.float32(PIXEL_MAX)).tobytes(), dtype=np.float32).reshape(40, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = component.process(make_batch([1] * 10 + [30], x=frozen))
    assert set(out) == {"logits"}
    assert out["logits"].dtype == np.float32 and out["logits"].shape == (40, 10)
    component.outputs["logits"].check("logits", out["logits"])
    assert (out["logits"].argmax(axis=1) == y[:40]).mean() >= 0.9
    reference = models.load("digits-mlp", "cpu")
    with torch.inference_mode():
        expected = reference(torch.from_numpy(frozen.copy())).numpy()
    np.testing.assert_allclose(out["logits"], expected, rtol=1e-4, atol=1e-5)
    component.close()


def test_empty_batch(model_cache: Path, make_batch) -> None:
    component = _ready({"model": "digits-cnn"})
    out = component.process(make_batch([], x=np.zeros((0, 64), dtype=np.float32)))
    assert out["logits"].shape == (0, 10)


def test_a_batch_runs_on_the_configured_threads_whichever_thread_runs_it(model_cache: Path, make_batch) -> None:
    """torch's thread count is per OS thread: the worker runs setup() in a helper thread, and a thread at
    the default (one per core) makes every op a team whose idle member spins (~2x a worker's CPU)."""
    import threading

    import torch

    component = TorchClassifier.configure({"model": "digits-mlp", "threads": 1}, node="model")
    assert isinstance(component, TorchClassifier)
    helper = threading.Thread(target=component.setup)
    helper.start()
    helper.join()
    seen: list[int] = []

    def run() -> None:
        torch.set_num_threads(2)  # what a thread that never set it may have
        component.process(make_batch([1], x=np.zeros((1, 64), dtype=np.float32)))
        seen.append(torch.get_num_threads())

    run()
    other = threading.Thread(target=run)
    other.start()
    other.join()
    assert seen == [1, 1]


def test_weights_hash_for_lineage(model_cache: Path) -> None:
    component = TorchClassifier.configure({"model": "digits-cnn"}, node="cnn")
    assert isinstance(component, TorchClassifier)
    assert component.weights_hash is None
    assert component.describe() == "flowserve_components.torch_stage:TorchClassifier(model=digits-cnn)"
    component.setup()
    digest = hashlib.sha256(models.model_path("digits-cnn").read_bytes()).hexdigest()
    assert component.weights_hash == digest
    assert component.describe() == (
        f"flowserve_components.torch_stage:TorchClassifier(model=digits-cnn, weights=sha256:{digest})"
    )


def test_user_torchscript_path(model_cache: Path, tmp_path: Path, make_batch) -> None:
    import torch

    scripted = tmp_path / "mlp.ts"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.script(models.load("digits-mlp", "cpu")).save(str(scripted))
    component = _ready({"path": str(scripted)})
    digest = hashlib.sha256(scripted.read_bytes()).hexdigest()
    assert component.describe().endswith(f"(model=user, path={scripted}, weights=sha256:{digest})")
    x = np.array(load_split("test")[0][:5]) / np.float32(PIXEL_MAX)
    zoo = _ready({"model": "digits-mlp"})
    batch = make_batch([5], x=x)
    np.testing.assert_allclose(component.process(batch)["logits"], zoo.process(batch)["logits"], rtol=1e-5)


def test_setup_errors_name_the_node(tmp_path: Path) -> None:
    component = TorchClassifier.configure({"model": "digits-mlp", "path": str(tmp_path / "nope.pt")}, node="m1")
    with pytest.raises(ComponentError, match="node 'm1': cannot read weights"):
        component.setup()


def test_process_before_setup(make_batch) -> None:
    component: Component = TorchClassifier.configure({"model": "digits-mlp"}, node="m2")
    with pytest.raises(ComponentError, match="node 'm2': TorchClassifier.process called before setup"):
        component.process(make_batch([1], x=np.zeros((1, 64), dtype=np.float32)))


def test_cuda_path_matches_cpu(model_cache: Path, make_batch) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    component = _ready({"model": "digits-cnn"})
    assert component.device == "cuda"
    x = np.array(load_split("test")[0]) / np.float32(PIXEL_MAX)
    reference = models.load("digits-cnn", "cpu")
    with torch.inference_mode():
        expected = reference(torch.from_numpy(x.copy())).numpy()
    for rows in (3, 450, 7):  # grows, then reuses, the pinned staging buffer
        out = component.process(make_batch([rows], x=x[:rows]))["logits"]
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, expected[:rows], rtol=1e-3, atol=1e-3)
