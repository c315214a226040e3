"""A device's memory as a many-model stage sees it: a bounded set of resident models, loads and evictions.

Which model to evict is Belady's rule with predictions: the resident model whose next use is predicted
furthest away goes first. A model with requests waiting is next used at its earliest deadline; an idle one
at ``now + 1 / rate``, its arrival rate decayed over ``tau`` seconds (:class:`Predictor`); a model with no
prediction at all is furthest away, and among those the least recently used goes first (LRU where nothing is
predicted). A model in use (loading, or running a batch) is pinned and never evicted.

>>> m = DeviceMemory(300)
>>> for t, name in enumerate("abc"):
...     _ = m.admit(name, 100, now=float(t))
...     m.unpin(name)  # loaded
>>> m.victims(100, now=3.0, next_use={"a": 10.0})  # c, b have no prediction: LRU among them first
('b',)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from flowserve.errors import ErrorKind, FlowserveError

INF = math.inf


@dataclass(slots=True)
class Resident:
    size: int
    last_used: float
    #: a load or a batch of this model is in progress (never evicted)
    pins: int = 0


class DeviceMemory:
    """Models resident in ``capacity`` bytes of device memory."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise FlowserveError(f"device memory of {capacity} bytes holds nothing", kind=ErrorKind.INVALID_SETTINGS)
        self.capacity = capacity
        self.used = 0
        self.resident: dict[str, Resident] = {}
        self.loads = 0
        self.evictions = 0

    def __contains__(self, name: object) -> bool:
        return name in self.resident

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def touch(self, name: str, now: float) -> None:
        """``name`` was used at ``now`` (for LRU among models without a prediction)."""
        self.resident[name].last_used = now

    def pin(self, name: str) -> None:
        self.resident[name].pins += 1

    def unpin(self, name: str) -> None:
        self.resident[name].pins -= 1

    def victims(self, size: int, *, now: float, next_use: Mapping[str, float],
                keep_before: float = -INF) -> tuple[str, ...] | None:
        """The models to evict, in order, to make ``size`` bytes free: furthest predicted next use first (no
        prediction: furthest of all, least recently used first); pinned models never, nor any predicted to
        be used before ``keep_before`` (evicting it would load it again sooner than the newcomer is needed).
        None when that cannot free enough."""
        if size > self.capacity:
            return None
        need = size - self.free
        if need <= 0:
            return ()
        order = sorted((name for name, r in self.resident.items() if r.pins == 0),
                       key=lambda n: (-next_use.get(n, INF), self.resident[n].last_used, n))
        chosen: list[str] = []
        for name in order:
            if need <= 0:
                break
            if next_use.get(name, INF) < keep_before:
                break  # sorted furthest first: every later one is needed sooner still
            chosen.append(name)
            need -= self.resident[name].size
        return tuple(chosen) if need <= 0 else None

    def admit(self, name: str, size: int, *, now: float, evict: tuple[str, ...] = ()) -> tuple[str, ...]:
        """Make ``name`` resident (pinned until :meth:`unpin`: its load is in progress), evicting ``evict``
        first; returns what was evicted."""
        for victim in evict:
            self.evict(victim)
        if name in self.resident or size > self.free:
            raise FlowserveError(f"cannot load model '{name}' ({size} bytes): "
                                 f"{'already resident' if name in self.resident else f'{self.free} bytes free'}",
                                 kind=ErrorKind.UNAVAILABLE)
        self.resident[name] = Resident(size, now, pins=1)
        self.used += size
        self.loads += 1
        return evict

    def evict(self, name: str) -> None:
        r = self.resident[name]
        if r.pins:
            raise FlowserveError(f"model '{name}' is in use and cannot be evicted", kind=ErrorKind.UNAVAILABLE)
        del self.resident[name]
        self.used -= r.size
        self.evictions += 1


class Predictor:
    """Each model's arrival rate, decayed with time constant ``tau`` seconds, and from it the predicted time
    of its next request: ``now + 1 / rate`` (Poisson arrivals are memoryless). A model never seen has none."""

    def __init__(self, tau: float = 10.0) -> None:
        self.tau = tau
        self._score: dict[str, tuple[float, float]] = {}  # model -> (decayed count, when)

    def observe(self, name: str, now: float) -> None:
        score, at = self._score.get(name, (0.0, now))
        self._score[name] = (score * math.exp(-(now - at) / self.tau) + 1.0, now)

    def expect(self, name: str, rate: float, now: float) -> None:
        """Start ``name`` at ``rate`` requests per second as of ``now`` (a prior, such as the share of the
        traffic a placement gave the model): a model made resident before its first request is otherwise
        unpredicted, so furthest of all, and the first loads would evict the hottest models first."""
        self._score[name] = (rate * self.tau, now)

    def rate(self, name: str, now: float) -> float:
        score, at = self._score.get(name, (0.0, now))
        return score * math.exp(-(now - at) / self.tau) / self.tau

    def next_use(self, name: str, now: float) -> float:
        r = self.rate(name, now)
        return now + 1.0 / r if r > 0 else INF
