"""The worker side of energy: a stage hook that meters each batch and splits its energy over its requests.

:func:`energy_hooks` gives every stage worker an :class:`EnergyHooks` when energy is on
(:class:`EnergySettings`: ``flowserve worker --energy``, or ``FLOWSERVE_ENERGY_ENABLED=1`` for the workers a
host starts); off, it gives none and a worker pays nothing. Per batch the hook reads its meter
(:mod:`flowserve.energy.meters`) at ``begin`` and at ``end``; the batch's busy time is the time between
(``process`` and queueing the outputs), the same span capture records as a lineage batch's ``batch_ms``.
The batch's joules are split over its requests by their rows (:func:`split_by_rows`) and turned into grams
CO2e at the operator's carbon intensity.

Where capture's lineage is on for the node, the requests capture samples get their joules and grams in an
energy record on the lineage topic, gathered between commits as capture gathers its own (``flowserve
lineage`` joins them to each hop); every worker's totals are counters (``energy_mj``, ``energy_idle_mj``,
``co2e_ug``) in its metrics snapshots, which ``flowserve stats`` sums.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring_ascii as _jstr
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from flowserve.component import Component
from flowserve.energy.meters import Meter, meter_for
from flowserve.energy.power import VCPU_ACTIVE_W, carbon_intensity, joules_to_grams
from flowserve.kafka.settings import settings_from_env
from flowserve.runtime.hooks import BatchOutcome, HookFactory, StageContext, StageHooks
from flowserve.topology.capture import node_policy
from flowserve.topology.graph import Node, Topology
from flowserve.wire.envelope import H_NODE

if TYPE_CHECKING:
    from flowserve.runtime.emit import Item
    from flowserve.runtime.hooks import Emit

#: what each entry of an energy record's batches' ``requests`` holds
ENERGY_FIELDS = ["request_id", "rows", "joules", "g_co2e"]
#: a gathered energy record is written once it is this large, even between commits
ENERGY_RECORD_BYTES = 256 * 1024


class EnergySettings(BaseModel):
    """Whether workers meter energy, and the carbon intensity that turns joules into grams CO2e."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="meter each batch's energy (off: no hook, no cost)")
    carbon_g_per_kwh: float | None = Field(None, ge=0, description="grams CO2e per kWh (over the region)")
    region: str | None = Field(None, description="a region of flowserve.energy.power.REGIONS (default: world)")
    cpu_w_per_core: float = Field(VCPU_ACTIVE_W, gt=0, description="watts per busy core when neither RAPL "
                                  "nor NVML can be read (Cloud Carbon Footprint's AWS average)")

    @classmethod
    def from_env(cls, **overrides: Any) -> EnergySettings:
        """Settings from ``FLOWSERVE_ENERGY_<FIELD>`` variables; ``overrides`` that are not None (flags) win."""
        return settings_from_env(cls, "FLOWSERVE_ENERGY_", overrides)

    def g_per_kwh(self) -> float:
        return carbon_intensity(self.carbon_g_per_kwh, self.region)


def split_by_rows(joules: float, sizes: Sequence[int]) -> list[float]:
    """``joules`` split over requests in proportion to their rows; the shares sum to ``joules`` (the last
    takes what rounding left).

    >>> split_by_rows(10.0, [1, 3, 1])
    [2.0, 6.0, 2.0]
    """
    total = sum(sizes)
    if not sizes:
        return []
    if total <= 0:
        return [joules / len(sizes)] * len(sizes)
    shares = [joules * n / total for n in sizes[:-1]]
    return [*shares, joules - sum(shares)]


class EnergyHooks(StageHooks):
    """Meters one stage worker's batches; publishes per-request energy with lineage and totals as counters."""

    def __init__(self, topology: Topology, node: Node, meter: Meter, g_per_kwh: float,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.topology = topology
        self.node = node
        self.meter = meter
        self.g_per_kwh = g_per_kwh
        self.clock = clock
        policy = node_policy(topology.spec, node.id)
        self.policy = policy
        self.lineage_topic = topology.lineage_topic if policy.lineage and policy.active else None
        self._emit: Emit | None = None
        self._started = clock()
        self._batches: list[str] = []
        self._pending_bytes = 0
        self._pending_key: tuple[str, int] = ("", 0)
        self._seq = 0
        #: totals over the worker's life
        self.joules = 0.0
        self.busy_s = 0.0
        self.batches = 0
        self.records = 0

    def start(self, stage: StageContext) -> None:
        self._emit = stage.emit
        self._started = self.clock()

    def begin(self, items: Sequence[Item]) -> Any:
        return items, self.meter.begin(), self.clock()

    def end(self, token: Any, outcome: BatchOutcome) -> None:
        items, reading, t0 = token
        busy_s = self.clock() - t0
        joules = self.meter.joules(reading, busy_s)
        self.joules += joules
        self.busy_s += busy_s
        self.batches += 1
        if self.lineage_topic is None:
            return
        shares = split_by_rows(joules, outcome.sizes)
        sampled = self.policy.sampled
        entries = [f"[{_jstr(item.ready.request_id)},{rows},{share:.6g},"
                   f"{joules_to_grams(share, self.g_per_kwh):.6g}]"
                   for item, rows, share in zip(items, outcome.sizes, shares, strict=True)
                   if sampled(item.ready.request_id)]
        if not entries:
            return
        self._seq += 1
        text = (f'{{"rows":{sum(outcome.sizes)},"busy_ms":{busy_s * 1000:.4f},"joules":{joules:.6g},'
                f'"requests":[{",".join(entries)}]}}')
        if not self._batches:
            self._pending_key = (f"{self.node.id}-energy-{self._seq}", items[0].ready.partition)
        self._batches.append(text)
        self._pending_bytes += len(text)

    def after_step(self, *, force: bool) -> bool:
        return self.flush(force)

    def flush(self, force: bool) -> bool:
        """Queue the gathered energy entries as one record when ``force`` or when it grew large; True when
        nothing is left ungathered."""
        if not self._batches:
            return True
        if not force and self._pending_bytes < ENERGY_RECORD_BYTES:
            return False
        head = {"energy": 1, "topology": self.topology.name, "node": self.node.id, "meter": self.meter.name,
                "g_per_kwh": self.g_per_kwh, "fields": ENERGY_FIELDS}
        value = f'{json.dumps(head, separators=(",", ":"))[:-1]},"batches":[{",".join(self._batches)}]}}'
        key, partition = self._pending_key
        assert self._emit is not None and self.lineage_topic is not None  # noqa: S101 - start() ran
        self._emit(self.lineage_topic, partition, key.encode(), value.encode(), [(H_NODE, self.node.id.encode())])
        self._batches, self._pending_bytes = [], 0
        self.records += 1
        return True

    def idle_joules(self) -> float:
        return self.meter.idle_joules(self.clock() - self._started, self.busy_s)

    def counters(self) -> Mapping[str, int]:
        grams = joules_to_grams(self.joules + self.idle_joules(), self.g_per_kwh)
        return {"energy_mj": round(self.joules * 1000), "energy_idle_mj": round(self.idle_joules() * 1000),
                "co2e_ug": round(grams * 1e6), "energy_records": self.records}


def energy_hooks(settings: EnergySettings) -> HookFactory:
    """The :data:`~flowserve.runtime.hooks.HookFactory` of energy: an :class:`EnergyHooks` on every node when
    ``settings.enabled``, none otherwise."""
    g_per_kwh = settings.g_per_kwh()  # an unknown region fails here, before any worker starts

    def factory(topology: Topology, node: Node, component: Component) -> list[StageHooks]:
        if not settings.enabled:
            return []
        return [EnergyHooks(topology, node, meter_for(component, watts_per_core=settings.cpu_w_per_core),
                            g_per_kwh)]

    return factory
