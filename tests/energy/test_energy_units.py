"""Energy without a broker: the power table, carbon, meters and the hook's split of a batch's energy."""

from __future__ import annotations

import doctest
import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flowserve.builtin import Accelerator, Identity
from flowserve.cli.measure import _energy_columns
from flowserve.energy import (
    POWER,
    CpuTimeMeter,
    EmulatedMeter,
    EnergyHooks,
    EnergySettings,
    RaplMeter,
    carbon_intensity,
    energy_hooks,
    joules_to_grams,
    meter_for,
    power_of,
    rapl_zones,
    split_by_rows,
    watt_prices,
)
from flowserve.errors import FlowserveError
from flowserve.runtime import hardware as hw
from flowserve.runtime.hooks import BatchOutcome, StageContext
from flowserve.topology import load_topology_text

TOPOLOGY = """
name: energy_units
partitions: 2
nodes:
  m:
    component: flowserve.builtin:Accelerator
    params: {model: resnet50, hardware: gpu-small, jitter: 0}
    inputs: {x: input.x}
outputs: {x: m.x}
CAPTURE
"""


class _Ready:
    def __init__(self, rid: str) -> None:
        self.request_id, self.partition = rid, 1


class _Item:
    def __init__(self, rid: str) -> None:
        self.ready = _Ready(rid)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _hooks(capture: str = "capture: {sample: 1.0, lineage: true, tracing: false}") -> tuple[EnergyHooks, _Clock,
                                                                                               list[Any]]:
    topology = load_topology_text(TOPOLOGY.replace("CAPTURE", capture))
    node = topology.nodes["m"]
    clock = _Clock()
    hook = EnergyHooks(topology, node, meter_for(node.component, watts_per_core=3.5), 400.0, clock=clock)
    emitted: list[Any] = []
    hook.start(StageContext(topology, node, node.component, lambda *a: emitted.append(a), lambda r: ""))
    return hook, clock, emitted


def test_every_hardware_kind_has_power_figures_with_a_source() -> None:
    assert set(POWER) == set(hw.HARDWARE)
    for p in POWER.values():
        assert 0 <= p.idle_w < p.active_w and p.source
    assert POWER["cpu"].active_w == pytest.approx(14.0)  # 4 vCPU x 3.5 W
    assert POWER["gpu-large"].mean_watts(0.5) == pytest.approx((30.92 + 328.0) / 2)
    assert power_of("cpu") is POWER["cpu"]
    with pytest.raises(FlowserveError, match="no power figures for hardware kind 'tpu'"):
        power_of("tpu")
    assert watt_prices()["gpu-small"] == pytest.approx(84.0 * 3600)
    assert watt_prices(carbon_g_per_kwh=1000.0)["cpu"] == pytest.approx(14.0)  # 14 Wh per hour at 1 kg/kWh


def test_carbon_intensity_from_a_figure_a_region_or_the_world() -> None:
    assert carbon_intensity(123.0, "france") == 123.0
    assert carbon_intensity(None, "France") == 56.0
    assert carbon_intensity() == 480.0
    with pytest.raises(FlowserveError, match="unknown carbon region 'mars'.*world"):
        carbon_intensity(None, "mars")
    assert joules_to_grams(3.6e6, 56.0) == pytest.approx(56.0)


@pytest.mark.parametrize("sizes", [[1], [1, 3, 1], [2] * 7, [5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 9]])
def test_a_batch_split_by_rows_sums_to_the_batch(sizes: list[int]) -> None:
    shares = split_by_rows(0.123456789, sizes)
    assert sum(shares) == pytest.approx(0.123456789, rel=1e-12)
    assert shares[0] / sizes[0] == pytest.approx(0.123456789 / sum(sizes))


def test_the_hook_attributes_a_batch_energy_to_its_requests_and_counts_it() -> None:
    hook, clock, emitted = _hooks()
    assert isinstance(hook.meter, EmulatedMeter) and hook.meter.power is POWER["gpu-small"]
    items = [_Item(f"r{i}") for i in range(3)]
    token = hook.begin(items)
    clock.now += 0.010  # 10 ms busy
    hook.end(token, BatchOutcome([1, 2, 1], {}, {}, {}))
    assert hook.after_step(force=False) is False  # gathered until a commit is due
    assert hook.after_step(force=True) is True
    (topic, partition, key, value, headers), = emitted
    assert topic == "fs.energy_units.lineage" and partition == 1 and key == b"m-energy-1"
    body = json.loads(value)
    batch, = body["batches"]
    expected = 84.0 * 0.010  # gpu-small active watts over the busy time
    assert batch["joules"] == pytest.approx(expected) and batch["rows"] == 4
    assert [r[0] for r in batch["requests"]] == ["r0", "r1", "r2"]
    assert sum(r[2] for r in batch["requests"]) == pytest.approx(expected, rel=1e-5)
    assert [r[2] for r in batch["requests"]] == pytest.approx([expected / 4, expected / 2, expected / 4], rel=1e-5)
    assert batch["requests"][1][3] == pytest.approx(joules_to_grams(expected / 2, 400.0), rel=1e-5)
    clock.now += 1.0  # a second idle
    counters = hook.counters()
    assert counters["energy_mj"] == round(expected * 1000)
    assert counters["energy_idle_mj"] == round(POWER["gpu-small"].idle_w * 1.0 * 1000)
    assert counters["co2e_ug"] == round(joules_to_grams(expected + POWER["gpu-small"].idle_w, 400.0) * 1e6)


def test_without_lineage_the_hook_only_counts() -> None:
    hook, clock, emitted = _hooks(capture="")
    token = hook.begin([_Item("a")])
    clock.now += 0.002
    hook.end(token, BatchOutcome([1], {}, {}, {}))
    assert hook.after_step(force=True) is True and emitted == []
    assert hook.counters()["energy_mj"] == round(84.0 * 0.002 * 1000)


def test_energy_off_attaches_nothing() -> None:
    topology = load_topology_text(TOPOLOGY.replace("CAPTURE", ""))
    node = topology.nodes["m"]
    assert energy_hooks(EnergySettings())(topology, node, node.component) == []
    assert len(energy_hooks(EnergySettings(enabled=True))(topology, node, node.component)) == 1
    with pytest.raises(FlowserveError, match="unknown carbon region"):
        energy_hooks(EnergySettings(enabled=True, region="atlantis"))


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWSERVE_ENERGY_ENABLED", "1")
    monkeypatch.setenv("FLOWSERVE_ENERGY_REGION", "sweden")
    settings = EnergySettings.from_env(carbon_g_per_kwh=None)
    assert settings.enabled and settings.g_per_kwh() == 41.0
    assert EnergySettings.from_env(carbon_g_per_kwh=10.0).g_per_kwh() == 10.0


def _zone(root: Path, name: str, energy: int, span: int) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "energy_uj").write_text(f"{energy}\n")
    (zone / "max_energy_range_uj").write_text(f"{span}\n")
    return zone


def test_rapl_reads_package_zones_and_survives_the_counter_wrapping(tmp_path: Path) -> None:
    a = _zone(tmp_path, "intel-rapl:0", 999_000_000, 1_000_000_000)
    _zone(tmp_path, "intel-rapl:0:0", 5, 10)  # a sub-zone (core): counted in its package already
    b = _zone(tmp_path, "intel-rapl:1", 10_000_000, 1_000_000_000)
    assert rapl_zones(tmp_path) == [a, b]
    component = Identity.configure({}, node="i")
    meter = meter_for(component, watts_per_core=3.5, powercap=tmp_path)
    assert isinstance(meter, RaplMeter)
    reading = meter.begin()
    (a / "energy_uj").write_text("1000000\n")  # wrapped: 1 J to the top, 1 J after
    (b / "energy_uj").write_text("13000000\n")
    assert meter.joules(reading, 0.1) == pytest.approx(2.0 + 3.0)


def test_a_cpu_stage_without_rapl_is_metered_by_cpu_seconds(tmp_path: Path) -> None:
    meter = meter_for(Identity.configure({}, node="i"), watts_per_core=3.5, powercap=tmp_path / "absent")
    assert isinstance(meter, CpuTimeMeter)
    reading = meter.begin()
    np.linalg.eigvals(np.random.default_rng(0).random((200, 200)))  # burn some CPU
    assert meter.joules(reading, 0.0) >= 0.0
    accelerator = Accelerator.configure({"model": "alexnet", "hardware": "cpu"}, node="a")
    assert meter_for(accelerator, watts_per_core=3.5).name == "emulated:cpu"


def test_the_docstring_examples_run() -> None:
    for name in ("flowserve.energy.power", "flowserve.energy.hooks", "flowserve.tuning.objectives"):
        assert doctest.testmod(importlib.import_module(name)).failed == 0, name


def test_stats_shows_energy_columns_only_where_a_worker_meters() -> None:
    snaps = [{"counters": {"energy_mj": 8529, "energy_idle_mj": 13917, "co2e_ug": 300}}, {"counters": {}}]
    rows: list[dict[str, Any]] = [{}, {}]
    assert [k for _, k in _energy_columns(rows, snaps)] == ["energy_j", "idle_j", "co2e_g"]
    assert rows[0] == {"energy_j": 8.529, "idle_j": 13.917, "co2e_g": 0.0003}
    assert rows[1] == {"energy_j": 0.0, "idle_j": 0.0, "co2e_g": 0.0}
    assert _energy_columns([{}], [{"counters": {"batches": 3}}]) == []
