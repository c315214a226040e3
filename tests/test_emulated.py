"""The emulated accelerator and the cascade split (flowserve.builtin), and the hardware tables."""

from __future__ import annotations

import numpy as np
import pytest

from flowserve.builtin import Accelerator, Split
from flowserve.component import Batch
from flowserve.errors import ComponentError, FlowserveError
from flowserve.runtime import hardware as hw


def _acc(**params: object) -> Accelerator:
    component = Accelerator.configure({"model": "resnet50", **params}, node="m")
    assert isinstance(component, Accelerator)
    return component


def test_tables_are_linear_in_the_batch_and_priced() -> None:
    table = hw.latency_table("resnet50", "gpu-small")
    assert table[1] == pytest.approx(0.0048)
    assert table[64] == pytest.approx(0.0552)
    assert hw.kinds_for("resnet50") == ["cpu", "gpu-small", "gpu-large"]
    assert [h.price_per_hour for h in hw.HARDWARE.values()] == sorted(h.price_per_hour for h in hw.HARDWARE.values())


def test_without_jitter_the_service_time_is_the_table() -> None:
    acc = _acc(hardware="gpu-large", jitter=0)
    assert acc.service_seconds(8) == pytest.approx(hw.batch_seconds("resnet50", "gpu-large", 8))
    assert acc.latency_table() == hw.latency_table("resnet50", "gpu-large")
    assert acc.latency_table("cpu") == hw.latency_table("resnet50", "cpu")


def test_jitter_is_seeded_and_centred_on_the_table() -> None:
    a, b = _acc(jitter=0.2, seed=7), _acc(jitter=0.2, seed=7)
    draws = [a.service_seconds(4) for _ in range(4000)]
    assert draws[:50] == [b.service_seconds(4) for _ in range(50)]
    mean = hw.batch_seconds("resnet50", "gpu-small", 4)
    assert np.mean(draws) == pytest.approx(mean, rel=0.02)
    assert np.std(draws) / np.mean(draws) == pytest.approx(0.2, rel=0.1)
    assert min(draws) > 0


def test_unknown_model_or_hardware_is_refused_with_the_choices() -> None:
    with pytest.raises(ComponentError, match="resnet50"):
        _acc(model="nope")
    with pytest.raises(ComponentError, match="runs on: cpu"):
        Accelerator.configure({"model": "preprocess", "hardware": "gpu-large"})
    with pytest.raises(FlowserveError, match="unknown hardware"):
        hw.hardware("tpu")
    assert _acc(model="preprocess", hardware="cpu").latency_table("gpu-large") is None


def test_process_passes_rows_through() -> None:
    acc = _acc(jitter=0, model="preprocess", hardware="cpu")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = acc.process(Batch({"x": x}, [1, 1], ["a", "b"]))
    assert out["x"] is x


def test_split_routes_a_stable_share_by_request_id() -> None:
    split = Split.configure({"unsure": 0.3})
    ids = [f"r{i}" for i in range(2000)]
    x = np.zeros((2000, 4), dtype=np.float32)
    result = split.process(Batch({"x": x}, [1] * 2000, ids))
    unsure = result.mask["unsure_x"]  # type: ignore[union-attr]
    assert (unsure == ~result.mask["sure_x"]).all()  # type: ignore[union-attr]
    assert unsure.mean() == pytest.approx(0.3, abs=0.03)
    again = split.process(Batch({"x": x[:10]}, [1] * 10, ids[:10]))
    assert (again.mask["unsure_x"] == unsure[:10]).all()  # type: ignore[union-attr]
    assert split.route_fractions() == {"sure_x": pytest.approx(0.7), "unsure_x": pytest.approx(0.3)}
