"""Energy and carbon per stage and per request: power figures, meters and the stage hook.

Attach :func:`energy_hooks` to the workers (``flowserve worker --energy`` does): each batch's energy is
metered (:mod:`flowserve.energy.meters`: emulated devices from :data:`POWER`, NVML, RAPL or CPU-seconds),
split over its requests by their rows and carried with lineage; ``flowserve stats`` sums the counters and
``flowserve plan --objective energy|carbon`` plans with :func:`watt_prices`. See ``docs/energy.md``.
"""

from flowserve.energy.hooks import EnergyHooks, EnergySettings, energy_hooks, split_by_rows
from flowserve.energy.meters import CpuTimeMeter, EmulatedMeter, Meter, NvmlMeter, RaplMeter, meter_for, rapl_zones
from flowserve.energy.power import (
    POWER,
    REGIONS,
    Power,
    carbon_intensity,
    joules_to_grams,
    power_of,
    power_watts,
    watt_prices,
)

__all__ = ["POWER", "REGIONS", "CpuTimeMeter", "EmulatedMeter", "EnergyHooks", "EnergySettings", "Meter",
           "NvmlMeter", "Power", "RaplMeter", "carbon_intensity", "energy_hooks", "joules_to_grams", "meter_for",
           "power_of", "power_watts", "rapl_zones", "split_by_rows", "watt_prices"]
