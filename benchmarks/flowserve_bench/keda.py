"""KEDA's Kafka scaler and the Kubernetes HPA it feeds, as their users run them: a pure, clock-driven policy.

The baseline of ``flowserve bench tuner``. Nothing here talks to Kafka or sleeps: the caller reads the
lag and passes its clock, so the live bench (:mod:`flowserve_bench.tuner`) and a discrete-event
simulator drive the same object. One :class:`KedaAutoscaler` is one ScaledObject and the HPA KEDA makes
for it; each :meth:`~KedaAutoscaler.sync` is one HPA reconcile. What it models, with the source of each
setting:

- **the metric** (KEDA's ``kafka`` scaler, ``pkg/scalers/kafka_scaler.go``): per trigger (one topic), the
  group's total lag over the topic's partitions, a partition with no committed offset counting its whole
  log (``offsetResetPolicy: earliest``, as render writes); unless ``allowIdleConsumers``, capped at
  ``partitions x lagThreshold`` when ``lag // lagThreshold`` exceeds the partitions, so replicas never
  exceed the partitions. Served as an ``AverageValue`` target of ``lagThreshold``
  (https://keda.sh/docs/2.17/scalers/apache-kafka/; lagThreshold default 10, allowIdleConsumers false).
- **the replicas** (HPA, ``replica_calculator.go`` ``GetExternalPerPodMetricReplicas``): ``ceil(lag /
  lagThreshold)``, unless ``lag / (lagThreshold x replicas)`` is within the 10% tolerance of 1
  (``--horizontal-pod-autoscaler-tolerance``), when the replicas stay; several triggers: the largest
  proposal. https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#algorithm-details
- **when** (HPA): every 15 s, ``--horizontal-pod-autoscaler-sync-period``
  (https://kubernetes.io/docs/reference/command-line-tools-reference/kube-controller-manager/).
- **behaviour** (HPA ``horizontal.go``; defaults in
  https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#default-behavior): scale-up
  without stabilisation, at most the larger of +100% and +4 pods per 15 s; scale-down to the highest
  recommendation of the last 300 s (the HPA records the replicas it found as a recommendation when it
  starts, so nothing scales down in its first 300 s), at most -100% per 15 s; ``minReplicaCount`` and
  ``maxReplicaCount`` bound both.
- **pollingInterval** (KEDA, default 30 s, https://keda.sh/docs/2.17/reference/scaledobject-spec/):
  it governs activation (0 <-> 1 replicas) only. From 1 to N the HPA asks KEDA's metrics server at its
  own sync period and, by default (``useCachedMetrics: false``,
  https://keda.sh/docs/2.17/concepts/scaling-deployments/#caching-metrics), KEDA reads the lag afresh for
  each request. So with ``minReplicaCount >= 1`` (render writes the plan's replicas) the interval changes
  nothing unless ``use_cached_metrics``, when the HPA sees the lag read at the last poll. Scale to zero
  (activation) is not modelled: ``min_replicas`` must be >= 1.

Presets: ``keda`` (every default above) and ``keda-tuned`` (pollingInterval 5 s and a 60-s scale-down
stabilisation, set in the ScaledObject's ``advanced.horizontalPodAutoscalerConfig.behavior``).

>>> hpa = KedaAutoscaler(PRESETS["keda"], replicas=1, min_replicas=1, max_replicas=20, lag_threshold=10,
...                      partitions=20)
>>> [hpa.sync(t, [lag]) for t, lag in [(0, 0), (15, 150), (30, 150), (45, 150), (60, 0)]]
[1, 5, 10, 15, 15]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from flowserve.deploy.keda import lag_threshold, slo_shares
from flowserve.errors import ErrorKind, FlowserveError
from flowserve.topology.graph import Topology
from flowserve.tuning.plan import Plan, stage_options
from flowserve.tuning.simulate import batch_time


@dataclass(frozen=True)
class ScalingPolicy:
    """One of an HPA behaviour's policies: change by ``value`` pods or percent per ``period_s``."""

    kind: Literal["Pods", "Percent"]
    value: int
    period_s: float


@dataclass(frozen=True)
class KedaSettings:
    """A ScaledObject's timing and its HPA's behaviour (defaults: KEDA's and Kubernetes'; see the module)."""

    name: str = "keda"
    polling_interval_s: float = 30.0
    use_cached_metrics: bool = False
    allow_idle_consumers: bool = False
    sync_period_s: float = 15.0
    tolerance: float = 0.1
    up_stabilisation_s: float = 0.0
    up_policies: tuple[ScalingPolicy, ...] = (ScalingPolicy("Percent", 100, 15.0), ScalingPolicy("Pods", 4, 15.0))
    down_stabilisation_s: float = 300.0
    down_policies: tuple[ScalingPolicy, ...] = (ScalingPolicy("Percent", 100, 15.0),)


PRESETS = {
    "keda": KedaSettings(),
    "keda-tuned": KedaSettings(name="keda-tuned", polling_interval_s=5.0, down_stabilisation_s=60.0),
}


@dataclass
class _Event:
    at: float
    change: int


@dataclass
class KedaAutoscaler:
    """One ScaledObject and its HPA. ``replicas`` is the Deployment's ``spec.replicas``, which the HPA sets.

    Call :meth:`sync` at (or after) :attr:`next_sync_s` with each trigger's lag as read then; it returns
    the replicas the HPA sets, which the caller applies (starts or stops consumers).
    """

    settings: KedaSettings
    replicas: int
    min_replicas: int
    max_replicas: int
    lag_threshold: int
    partitions: int
    start_s: float = 0.0
    next_sync_s: float = field(init=False)
    _recommendations: list[tuple[float, int]] = field(init=False)
    _ups: list[_Event] = field(default_factory=list, init=False)
    _downs: list[_Event] = field(default_factory=list, init=False)
    _cached: tuple[float, tuple[int, ...]] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas or self.lag_threshold < 1:
            raise FlowserveError(f"KEDA autoscaler: need 1 <= minReplicaCount ({self.min_replicas}) <= "
                                 f"maxReplicaCount ({self.max_replicas}) and lagThreshold >= 1 "
                                 f"({self.lag_threshold}); scale to zero is not modelled",
                                 kind=ErrorKind.INVALID_INPUT)
        self.next_sync_s = self.start_s
        # the HPA's first reconcile records the replicas it found as a recommendation (recordInitialRecommendation)
        self._recommendations = [(self.start_s, self.replicas)]

    def metric(self, lag: int) -> int:
        """What KEDA serves for one trigger whose total lag is ``lag``: capped to the partitions."""
        if not self.settings.allow_idle_consumers and lag // self.lag_threshold > self.partitions:
            return self.partitions * self.lag_threshold
        return max(0, lag)

    def proposal(self, lags: Sequence[int], ready: int | None = None) -> int:
        """The HPA's replica count from the metrics alone (before stabilisation and rate limits)."""
        current = self.replicas if ready is None else ready
        proposals = []
        for lag in lags:
            value = self.metric(lag)
            ratio = value / (self.lag_threshold * current) if current else math.inf
            proposals.append(math.ceil(value / self.lag_threshold) if abs(1 - ratio) > self.settings.tolerance
                             else current)
        return max(proposals, default=self.replicas)

    def sync(self, now: float, lags: Sequence[int], ready: int | None = None) -> int:
        """One HPA reconcile at ``now`` (seconds, the caller's clock): ``lags`` has one entry per trigger
        (the group's total lag on that topic); ``ready`` is the Deployment's status replicas when they
        differ from its spec (pods still starting). Returns the new ``spec.replicas``."""
        s = self.settings
        self.next_sync_s = now + s.sync_period_s
        if s.use_cached_metrics:
            if self._cached is None or now - self._cached[0] >= s.polling_interval_s:
                self._cached = (now, tuple(lags))
            lags = self._cached[1]
        current = self.replicas
        if current > self.max_replicas:
            desired = self.max_replicas
        elif current < self.min_replicas:
            desired = self.min_replicas
        else:
            desired = self._limited(now, current, self._stabilised(now, current, self.proposal(lags, ready)))
        if desired > current:
            self._ups.append(_Event(now, desired - current))
        elif desired < current:
            self._downs.append(_Event(now, current - desired))
        self.replicas = desired
        return desired

    def _stabilised(self, now: float, current: int, desired: int) -> int:
        """stabilizeRecommendationWithBehaviors: the window's lowest recommendation bounds a scale-up, its
        highest a scale-down; the unstabilised one is recorded."""
        up = down = desired
        for at, rec in self._recommendations:
            if at > now - self.settings.up_stabilisation_s:
                up = min(up, rec)
            if at > now - self.settings.down_stabilisation_s:
                down = max(down, rec)
        keep = max(self.settings.up_stabilisation_s, self.settings.down_stabilisation_s)
        self._recommendations = [(at, rec) for at, rec in self._recommendations if at > now - keep]
        self._recommendations.append((now, desired))
        return min(max(current, up), down)

    def _limited(self, now: float, current: int, desired: int) -> int:
        """convertDesiredReplicasWithBehaviorRate: the policies' rate limits, then min/max replicas."""
        def changed(events: list[_Event], period_s: float) -> int:
            return sum(e.change for e in events if e.at > now - period_s)

        def start(p: ScalingPolicy) -> int:  # the replicas at the start of the policy's period
            return current - changed(self._ups, p.period_s) + changed(self._downs, p.period_s)

        if desired > current:
            limit = max(start(p) + p.value if p.kind == "Pods" else math.ceil(start(p) * (1 + p.value / 100))
                        for p in self.settings.up_policies)  # selectPolicy Max: the largest change
            return min(desired, self.max_replicas, max(limit, current))
        if desired < current:
            floor = min(start(p) - p.value if p.kind == "Pods" else int(start(p) * (1 - p.value / 100))
                        for p in self.settings.down_policies)
            return max(desired, self.min_replicas, min(floor, current))
        return desired


def consumer_throughput(topology: Topology, plan: Plan) -> dict[str, float]:
    """Per stage of ``plan``: records/s one consumer handles at its planned hardware and max batch (its
    latency table at that batch plus the plan's per-batch overhead)."""
    options = {o.id: o for o in stage_options(topology)}
    out = {}
    for node_id, cfg in plan.stages.items():
        seconds = batch_time(options[node_id].tables[cfg.hardware], cfg.max_batch) + plan.overhead_ms / 1000
        out[node_id] = cfg.max_batch / seconds
    return out


def autoscalers(topology: Topology, plan: Plan, settings: KedaSettings, *, start_s: float = 0.0
                ) -> dict[str, KedaAutoscaler]:
    """Per stage, the ScaledObject ``flowserve deploy render`` writes for ``plan``: minReplicaCount the
    plan's consumers, maxReplicaCount the partitions, lagThreshold a consumer's throughput within its
    share of the plan's SLO (:func:`flowserve.deploy.keda.lag_threshold`)."""
    shares = slo_shares(topology, plan.slo_ms / 1000)
    rates = consumer_throughput(topology, plan)
    return {n: KedaAutoscaler(settings, replicas=cfg.consumers, min_replicas=cfg.consumers,
                              max_replicas=max(cfg.consumers, plan.partitions),
                              lag_threshold=lag_threshold(rates[n], shares[n]), partitions=plan.partitions,
                              start_s=start_s)
            for n, cfg in plan.stages.items()}


def preset(name: str, **changes: object) -> KedaSettings:
    """A preset by name, with fields changed (e.g. ``preset("keda", use_cached_metrics=True)``)."""
    if name not in PRESETS:
        raise FlowserveError(f"no KEDA preset {name!r} (presets: {sorted(PRESETS)})", kind=ErrorKind.INVALID_INPUT)
    return replace(PRESETS[name], **changes)  # type: ignore[arg-type]
