"""TorchModels: real models from the version registry, loaded on demand, each answering as its variant run
alone; weights that are not plain tensors, or not the registered bytes, are refused."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest

from flowserve.errors import ComponentError, FlowserveError
from flowserve.learning import Registry, RegistryError
from flowserve.models import ModelSpec
from flowserve_components import digit_variants as dv
from flowserve_components.torch_models import TorchModels


@pytest.fixture
def variants(trained: tuple[Path, dict[str, float]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Three variants registered in a fresh cache (the base MLP copied from the session's trained cache)."""
    (tmp_path / "models").mkdir()
    shutil.copyfile(trained[0] / "models" / "digits-mlp.pt", tmp_path / "models" / "digits-mlp.pt")
    monkeypatch.setenv("FLOWSERVE_CACHE", str(tmp_path))
    made = dv.produce(3)
    assert made.trained == 3 and dv.produce(3).trained == 0  # registered once, kept after
    return made.names


def _spec(name: str) -> ModelSpec:
    return ModelSpec(name, 38_440, 0.002, {1: 1e-4}, "digits-mlp")


def test_each_variant_answers_as_itself_run_alone(variants: list[str], make_batch, torch_threads) -> None:  # noqa: ANN001
    component = TorchModels.configure({"device": "cpu"}, node="zoo")
    component.setup()
    x = dv.shift(np.eye(4, 64, dtype=np.float32), 0, 0)
    reference = dv.outputs(variants, x)
    for name in variants:
        component.load_model(_spec(name))
    assert component.resident() == variants
    for name in variants:
        got = component.run_model(_spec(name), make_batch([1, 1, 2], x=x))["logits"]
        np.testing.assert_allclose(got, reference[name], rtol=1e-5, atol=1e-5)
    assert not np.allclose(reference[variants[0]], reference[variants[1]], atol=1e-2)  # they differ
    component.unload_model(variants[0])
    assert component.resident() == variants[1:]
    with pytest.raises(FlowserveError, match="not resident"):
        component.run_model(_spec(variants[0]), make_batch([1], x=x[:1]))
    manifest = Registry(dv.REGISTRY, variants[4 % 3]).versions()[0]
    assert manifest.training_size == dv.EXAMPLES and manifest.metrics["dx"] == 0.0  # variant 1: SHIFTS[1]


def test_a_load_refuses_anything_but_registered_plain_tensors(variants: list[str], torch_threads) -> None:  # noqa: ANN001
    import torch

    component = TorchModels.configure({"device": "cpu"}, node="zoo")
    component.setup()
    buffer = io.BytesIO()
    torch.save({"0.weight": Path("/")}, buffer)  # an object, not a tensor: unpickling it would run code
    reg = Registry(dv.REGISTRY, "dv-evil")
    reg.promote(reg.register(buffer.getvalue(), parent="base", training_size=0).version)
    with pytest.raises(ComponentError, match="only plain tensors"):
        component.load_model(_spec("dv-evil"))
    weights = Registry(dv.REGISTRY, variants[0]).dir / "v1" / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one bit pattern changed on disk
    weights.write_bytes(bytes(data))
    with pytest.raises(RegistryError, match="do not match their manifest"):
        component.load_model(_spec(variants[0]))
    with pytest.raises(ComponentError, match="no model 'dv-99999'"):
        component.load_model(_spec("dv-99999"))
    assert component.resident() == []


def test_shift_moves_pixels_and_fills_zeros() -> None:
    image = np.arange(64, dtype=np.float32).reshape(1, 64) + 1
    moved = dv.shift(image, 1, -1).reshape(8, 8)
    assert moved[0, 0] == 0 and moved[7].sum() == 0  # a column in from the left, a row in from the bottom
    assert moved[0, 1] == image.reshape(8, 8)[1, 0]


def test_prepare_registers_the_variants_it_is_asked_for(variants: list[str]) -> None:
    TorchModels.configure({"variants": 5}, node="zoo").prepare()  # three are there: two more
    assert [m.version for m in Registry(dv.REGISTRY, dv.name_of(4)).versions()] == ["v1"]
    assert Registry(dv.REGISTRY, dv.name_of(3)).live() == "v1"
    TorchModels.configure({}, node="zoo").prepare()  # none asked for: nothing trained
    assert not Registry(dv.REGISTRY, dv.name_of(5)).dir.exists()
