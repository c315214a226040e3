"""Meters: the energy one batch of a stage used, read where this machine lets us read it.

Which meter a stage gets (:func:`meter_for`), first that applies:

1. **emulated**: a component whose ``hardware_param`` names a kind of :data:`~flowserve.energy.power.POWER`
   (``flowserve.builtin:Accelerator``): the kind's active watts over the batch's busy time; its idle watts
   over the rest of the worker's life (:meth:`Meter.idle_joules`);
2. **nvml**: a component on a CUDA device, when nvidia-ml-py is installed: the board's total-energy counter
   (``nvmlDeviceGetTotalEnergyConsumption``, Volta and later) before and after the batch;
3. **rapl**: Linux powercap (``/sys/class/powercap/intel-rapl:N/energy_uj``), where readable: the CPU
   packages' energy counters before and after the batch (the whole package: other processes' work during
   the batch counts too);
4. **cpu-time**: the process's CPU-seconds over the batch times a per-core figure
   (:data:`~flowserve.energy.power.VCPU_ACTIVE_W`, Cloud Carbon Footprint's AWS average, by default).

A meter's ``begin`` returns a reading; ``joules(reading, busy_s)`` the energy since it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

from flowserve.component import Component
from flowserve.energy.power import POWER, Power

POWERCAP = Path("/sys/class/powercap")


class Meter(Protocol):
    """Energy of a batch: ``begin`` before it, ``joules`` after it."""

    name: str

    def begin(self) -> Any: ...

    def joules(self, reading: Any, busy_s: float) -> float: ...

    def idle_joules(self, alive_s: float, busy_s: float) -> float: ...


class EmulatedMeter:
    """An emulated device: its kind's active watts while busy, idle watts the rest of the time."""

    def __init__(self, power: Power) -> None:
        self.power = power
        self.name = f"emulated:{power.kind}"

    def begin(self) -> Any:
        return None

    def joules(self, reading: Any, busy_s: float) -> float:
        return self.power.active_w * busy_s

    def idle_joules(self, alive_s: float, busy_s: float) -> float:
        return self.power.idle_w * max(0.0, alive_s - busy_s)


class CpuTimeMeter:
    """The process's CPU-seconds (all its threads) over the batch times ``watts_per_core``."""

    def __init__(self, watts_per_core: float) -> None:
        self.watts_per_core = watts_per_core
        self.name = "cpu-time"

    def begin(self) -> Any:
        return time.process_time()

    def joules(self, reading: Any, busy_s: float) -> float:
        return max(0.0, time.process_time() - float(reading)) * self.watts_per_core

    def idle_joules(self, alive_s: float, busy_s: float) -> float:
        return 0.0  # a process has no idle draw of its own; the machine's is not this stage's


class RaplMeter:
    """The CPU packages' RAPL energy counters (microjoules; they wrap at ``max_energy_range_uj``)."""

    def __init__(self, zones: list[Path]) -> None:
        self.zones = zones
        self.ranges = [int((z / "max_energy_range_uj").read_text()) for z in zones]
        self.name = "rapl"

    def begin(self) -> Any:
        return [int((z / "energy_uj").read_text()) for z in self.zones]

    def joules(self, reading: Any, busy_s: float) -> float:
        now = self.begin()
        total = 0
        for before, after, span in zip(reading, now, self.ranges, strict=True):
            total += after - before if after >= before else after + span - before
        return total / 1e6

    def idle_joules(self, alive_s: float, busy_s: float) -> float:
        return 0.0


class NvmlMeter:
    """A GPU's total-energy counter (millijoules since the driver loaded) through nvidia-ml-py."""

    def __init__(self, nvml: Any, index: int) -> None:
        self.nvml = nvml
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.name = f"nvml:{index}"

    def begin(self) -> Any:
        return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    def joules(self, reading: Any, busy_s: float) -> float:
        return max(0, int(self.begin()) - int(reading)) / 1000.0

    def idle_joules(self, alive_s: float, busy_s: float) -> float:
        return 0.0  # the counter already includes the board's idle draw during batches


def rapl_zones(root: Path = POWERCAP) -> list[Path]:
    """The readable top-level RAPL package zones (``intel-rapl:N``); none where powercap is absent or,
    as on most distributions since 2020, ``energy_uj`` is readable by root only."""
    zones = []
    for zone in sorted(root.glob("intel-rapl:*")) if root.is_dir() else []:
        if zone.name.count(":") != 1:  # intel-rapl:0:0 and the like are sub-zones of a package
            continue
        try:
            int((zone / "energy_uj").read_text())
            int((zone / "max_energy_range_uj").read_text())
        except (OSError, ValueError):
            continue
        zones.append(zone)
    return zones


def nvml_meter(device: str) -> NvmlMeter | None:
    """An NVML meter of CUDA ``device`` ("cuda" or "cuda:N"), None without nvidia-ml-py or a driver."""
    try:
        import pynvml  # nvidia-ml-py: optional, and only workers on a GPU ask for it
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        meter = NvmlMeter(pynvml, index)
        meter.begin()  # a board before Volta has no energy counter: NVMLError_NotSupported
    except Exception:  # noqa: BLE001 - any NVML failure means: not measurable here
        return None
    return meter


def emulated_kind(component: Component) -> str | None:
    """The hardware kind an emulated component runs on (its ``hardware_param``), if the power table has it."""
    param = component.hardware_param
    if param is None:
        return None
    kind = getattr(component.params, param, None)
    return kind if isinstance(kind, str) and kind in POWER else None


def meter_for(component: Component, *, watts_per_core: float, powercap: Path = POWERCAP) -> Meter:
    """The meter of a stage running ``component`` (see the module docstring for the order)."""
    kind = emulated_kind(component)
    if kind is not None:
        return EmulatedMeter(POWER[kind])
    device = str(getattr(component, "device", "cpu"))
    if device.startswith("cuda"):
        gpu = nvml_meter(device)
        if gpu is not None:
            return gpu
    zones = rapl_zones(powercap)
    if zones:
        return RaplMeter(zones)
    return CpuTimeMeter(watts_per_core)
