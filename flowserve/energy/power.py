"""Power per hardware kind (idle and active watts) and carbon intensity per region: the figures energy and
carbon are computed from.

A replica of a hardware kind of :mod:`flowserve.runtime.hardware` is its accelerator (if any) and the
host's vCPUs that come with it. Its **active** draw is the accelerator's board power limit plus each vCPU
at its full-load figure; its **idle** draw is the accelerator at idle plus each vCPU at its idle figure.
These are emulation figures like the batch-time tables, not measurements made here; meter real hardware
with NVML or RAPL (:mod:`flowserve.energy.meters`).

Sources:

- vCPU watts: Cloud Carbon Footprint's methodology (cloudcarbonfootprint.org/docs/methodology, "Compute"),
  AWS fleet averages from SPECpower results: 0.74 W per vCPU at idle, 3.5 W per vCPU at full load.
- NVIDIA T4: 70 W maximum board power (NVIDIA T4 datasheet, "Max Power Consumption 70 W").
- NVIDIA V100 SXM2: 300 W maximum board power (NVIDIA V100 datasheet, "Max Power Consumption 300 W",
  SXM2, as in AWS p3 instances).
- vCPU counts: AWS EC2 instance types: c5.xlarge 4, g4dn.xlarge 4, p3.2xlarge 8.
- **Assumption**: accelerator idle power. Datasheets do not state it; 10 W (T4) and 25 W (V100 SXM2) are
  the order of what ``nvidia-smi`` shows for an idle board in its P0/P8 states in public reports. The
  figures count the device only: no PUE (multiply by the data centre's, e.g. ~1.1-1.2 for large clouds).

>>> POWER["gpu-small"].active_w, POWER["gpu-small"].idle_w
(84.0, 12.96)
>>> round(joules_to_grams(3_600_000.0, 400.0), 6)  # 1 kWh at 400 g/kWh
400.0
"""

from __future__ import annotations

from dataclasses import dataclass

from flowserve.errors import ErrorKind, FlowserveError

#: Cloud Carbon Footprint, AWS averages per vCPU (see the module docstring)
VCPU_IDLE_W = 0.74
VCPU_ACTIVE_W = 3.5


@dataclass(frozen=True, slots=True)
class Power:
    """What one replica of a hardware kind draws, idle and while it serves a batch, in watts."""

    kind: str
    idle_w: float
    active_w: float
    source: str

    def joules(self, busy_s: float, idle_s: float = 0.0) -> float:
        """Energy over ``busy_s`` serving and ``idle_s`` idle."""
        return self.active_w * busy_s + self.idle_w * idle_s

    def mean_watts(self, utilisation: float) -> float:
        """Mean draw at ``utilisation`` (the share of time busy, clipped to [0, 1])."""
        u = min(1.0, max(0.0, utilisation))
        return self.idle_w + (self.active_w - self.idle_w) * u


def _kind(kind: str, vcpus: int, device_idle_w: float, device_active_w: float, source: str) -> Power:
    return Power(kind, round(device_idle_w + vcpus * VCPU_IDLE_W, 3), round(device_active_w + vcpus * VCPU_ACTIVE_W, 3),
                 source)


#: per hardware kind of flowserve.runtime.hardware.HARDWARE
POWER: dict[str, Power] = {
    "cpu": _kind("cpu", 4, 0.0, 0.0, "4 vCPU (c5.xlarge) x CCF 0.74/3.5 W"),
    "gpu-small": _kind("gpu-small", 4, 10.0, 70.0,
                       "T4 70 W datasheet, 10 W idle (assumption) + 4 vCPU (g4dn.xlarge) x CCF 0.74/3.5 W"),
    "gpu-large": _kind("gpu-large", 8, 25.0, 300.0,
                       "V100 SXM2 300 W datasheet, 25 W idle (assumption) + 8 vCPU (p3.2xlarge) x CCF 0.74/3.5 W"),
}

#: grams CO2e per kWh of electricity generated, yearly averages. Source: Ember, "Yearly electricity data"
#: (ember-energy.org/data, carbon intensity of generation, 2023); "world" from Ember's Global Electricity
#: Review 2024. Grid intensity varies by hour and year: set ``--carbon-g-per-kwh`` to your provider's figure.
REGIONS: dict[str, float] = {
    "world": 480.0,
    "eu": 244.0,
    "us": 369.0,
    "uk": 238.0,
    "germany": 381.0,
    "france": 56.0,
    "sweden": 41.0,
    "norway": 30.0,
    "poland": 662.0,
    "china": 582.0,
    "india": 713.0,
}
DEFAULT_REGION = "world"

JOULES_PER_KWH = 3_600_000.0


def power_of(kind: str) -> Power:
    """The power figures of hardware kind ``kind``."""
    try:
        return POWER[kind]
    except KeyError:
        raise FlowserveError(f"no power figures for hardware kind '{kind}' (kinds: {', '.join(POWER)})",
                             kind=ErrorKind.INVALID_SETTINGS) from None


def carbon_intensity(g_per_kwh: float | None = None, region: str | None = None) -> float:
    """Grams CO2e per kWh: the figure given, else the region's, else the world average."""
    if g_per_kwh is not None:
        if g_per_kwh < 0:
            raise FlowserveError(f"carbon intensity must be >= 0 g/kWh, not {g_per_kwh}",
                                 kind=ErrorKind.INVALID_SETTINGS)
        return float(g_per_kwh)
    name = (region or DEFAULT_REGION).lower()
    if name not in REGIONS:
        raise FlowserveError(f"unknown carbon region '{region}' (regions: {', '.join(REGIONS)}); "
                             "or give --carbon-g-per-kwh", kind=ErrorKind.INVALID_SETTINGS)
    return REGIONS[name]


def joules_to_grams(joules: float, g_per_kwh: float) -> float:
    """Grams CO2e of ``joules`` of electricity at ``g_per_kwh``."""
    return joules / JOULES_PER_KWH * g_per_kwh


def power_watts() -> dict[str, tuple[float, float]]:
    """Per hardware kind, (idle, active) watts: what the planner's energy accounting takes."""
    return {k: (p.idle_w, p.active_w) for k, p in POWER.items()}


def watt_prices(*, carbon_g_per_kwh: float | None = None) -> dict[str, float]:
    """A price per hardware kind per hour for the planner: joules a replica at full draw uses in an hour,
    or, given a carbon intensity, its grams CO2e."""
    joules = {k: p.active_w * 3600.0 for k, p in POWER.items()}
    if carbon_g_per_kwh is None:
        return joules
    return {k: joules_to_grams(j, carbon_g_per_kwh) for k, j in joules.items()}
