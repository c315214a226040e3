"""The catalogue: load time is size over the link's bandwidth, batch times are the emulated T4's table, the
emulated mix is deterministic; and the package's documented examples run."""

from __future__ import annotations

import doctest

import pytest

import flowserve.models.catalogue
import flowserve.models.memory
import flowserve.models.placement
import flowserve.models.scheduler
import flowserve.models.simulate
from flowserve.errors import ErrorKind, FlowserveError
from flowserve.models import BANDWIDTH, Catalogue, ModelSpec
from flowserve.runtime import hardware as hw
from flowserve.topology.spec import ModelsSpec


def test_a_load_takes_the_size_over_the_bandwidth() -> None:
    spec = ModelSpec.emulated("x", "sentiment")
    assert spec.load_s == pytest.approx(440e6 / BANDWIDTH["pcie3-x16"])
    assert ModelSpec.emulated("x", "sentiment", link="pcie4-x16").load_s == pytest.approx(spec.load_s / 2)
    assert spec.batch_s(8) == pytest.approx(hw.batch_seconds("sentiment", "gpu-small", 8))
    assert spec.batch_s(12) == pytest.approx(hw.batch_seconds("sentiment", "gpu-small", 12))  # linear between


def test_the_emulated_mix_is_deterministic_and_in_proportion() -> None:
    cat = Catalogue.emulated(1000)
    assert [s.name for s in cat][:2] == ["m-00000", "m-00001"]
    sizes = [s.size_bytes for s in cat]
    assert sizes == [s.size_bytes for s in Catalogue.emulated(1000)]
    assert sizes.count(102_400_000) == 500 and sizes.count(440_000_000) == 100


def test_mistakes_name_the_model() -> None:
    with pytest.raises(FlowserveError, match="'a' is listed twice") as e:
        Catalogue([ModelSpec("a", 1, 0.0, {1: 0.1})] * 2)
    assert e.value.kind is ErrorKind.INVALID_TOPOLOGY
    with pytest.raises(FlowserveError, match="model 'b': needs a positive size"):
        ModelSpec("b", 0, 0.0, {1: 0.1})
    with pytest.raises(FlowserveError, match="unknown link 'usb'"):
        ModelSpec.emulated("c", "resnet50", link="usb")


def test_a_real_catalogue_declares_its_measured_load_time_and_kind() -> None:
    spec = ModelsSpec(count=3, prefix="dv-", kind="digits-mlp", size_mb=0.04, load_ms=2.0,
                      latency_ms={1: 0.1, 32: 0.5})
    cat = Catalogue.declared(spec)
    assert [s.name for s in cat] == ["dv-00000", "dv-00001", "dv-00002"]
    assert {(s.kind, s.size_bytes, s.load_s) for s in cat} == {("digits-mlp", 40_000, 0.002)}
    assert cat[0].batch_s(32) == pytest.approx(0.0005)
    one = ModelsSpec(names=[{"name": "big", "kind": "digits-cnn", "size_mb": 16.0, "latency_ms": {1: 1.0}}])
    (big,) = Catalogue.declared(one)
    assert big.kind == "digits-cnn" and big.load_s == pytest.approx(16e6 / BANDWIDTH["pcie3-x16"])  # no load_ms
    assert ModelSpec.emulated("x", "alexnet").kind == "alexnet"


@pytest.mark.parametrize("module", [flowserve.models.catalogue, flowserve.models.memory, flowserve.models.placement,
                                    flowserve.models.scheduler, flowserve.models.simulate])
def test_the_documented_examples_run(module: object) -> None:
    result = doctest.testmod(module)  # type: ignore[arg-type]
    assert result.attempted > 0 and result.failed == 0
