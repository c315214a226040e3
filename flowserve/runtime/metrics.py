"""Per-node metrics through the OpenTelemetry metrics SDK, published as periodic JSON snapshots.

Each worker owns a ``MeterProvider`` (resource attributes: topology, node, worker) with an in-memory
reader. Instruments:

==============================  ==========  ==================================================
``flowserve.batch.size``        histogram   requests per ``process`` call
``flowserve.batch.exec_time``   histogram   ms per ``process`` call
``flowserve.queue.wait``        histogram   ms from a record's timestamp to its intake here
``flowserve.lag``               gauge       records queued for this worker
``flowserve.requests.*``        counters    ok, refused, expired, late (deadline missed), dead_lettered, doomed
==============================  ==========  ==================================================

Every ``metrics_interval_s`` (2 s by default) the worker publishes a JSON snapshot, keyed by
``<node>/<worker>``, to ``<prefix>.<topology>.metrics``; ``flowserve stats`` prints the latest one per
worker. opentelemetry is imported when a worker starts, never when flowserve is imported; without it
the snapshot carries the plain counters only.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowserve.kafka.settings import KafkaSettings
    from flowserve.topology.graph import Topology

SIZE_BOUNDS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
MS_BOUNDS = [0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 2000,
             5000, 10_000]
COUNTERS = ("requests_ok", "refused", "expired", "late", "dead_lettered", "error_results", "duplicates", "doomed",
            "rewinds")
#: counters of parity hooks (flowserve.parity), shown by ``flowserve stats`` where a worker reports them
PARITY_COUNTERS = ("parity_groups", "parity_queries", "parity_abandoned", "parity_outputs", "reconstructed",
                   "parity_late_real")
#: counters of a node's prediction cache (flowserve.cache), where its YAML asks for one
CACHE_COUNTERS = ("cache_hits", "cache_misses", "cache_evictions", "cache_bytes")
#: counters of a many-model node (flowserve.models); per model, ``model/<name>/<what>`` for each of
#: :data:`PER_MODEL` that is not zero (``resident`` and ``loading`` are 0 or 1)
MODEL_COUNTERS = ("models_resident", "model_loads", "model_evictions", "model_refusals", "model_answers")
PER_MODEL = ("resident", "loading", "loads", "evictions", "refusals", "answers")


def worker_id() -> str:
    return f"{os.uname().nodename[:20]}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


class NodeMetrics:
    """The OpenTelemetry instruments of one worker, and its JSON snapshot."""

    def __init__(self, topology: str, node: str, *, worker: str | None = None,
                 counters: Callable[[], dict[str, Any]] | None = None,
                 lag: Callable[[], int] | None = None) -> None:
        self.topology = topology
        self.node = node
        self.worker = worker or worker_id()
        self._counters = counters or dict
        self._lag = lag or (lambda: 0)
        self._reader: Any = None
        self._provider: Any = None
        try:
            from opentelemetry.metrics import CallbackOptions, Observation
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader
            from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
            from opentelemetry.sdk.resources import Resource
        except ImportError:  # pragma: no cover - opentelemetry-sdk is a dependency
            self._size = self._exec = self._wait = None
            return
        self._reader = InMemoryMetricReader()
        views = [View(instrument_name="flowserve.batch.size",
                      aggregation=ExplicitBucketHistogramAggregation(SIZE_BOUNDS)),
                 View(instrument_name="flowserve.batch.exec_time",
                      aggregation=ExplicitBucketHistogramAggregation(MS_BOUNDS)),
                 View(instrument_name="flowserve.queue.wait",
                      aggregation=ExplicitBucketHistogramAggregation(MS_BOUNDS))]
        resource = Resource.create({"service.name": "flowserve", "flowserve.topology": topology,
                                    "flowserve.node": node, "flowserve.worker": self.worker})
        self._provider = MeterProvider(metric_readers=[self._reader], resource=resource, views=views)
        meter = self._provider.get_meter("flowserve.worker")
        self._size = meter.create_histogram("flowserve.batch.size", unit="{request}",
                                            description="requests per process call")
        self._exec = meter.create_histogram("flowserve.batch.exec_time", unit="ms",
                                            description="time of one process call")
        self._wait = meter.create_histogram("flowserve.queue.wait", unit="ms",
                                            description="record timestamp to intake by this worker")

        def gauge(_: CallbackOptions) -> list[Observation]:
            return [Observation(self._lag())]

        meter.create_observable_gauge("flowserve.lag", [gauge], unit="{record}",
                                      description="records queued for this worker")
        for name in COUNTERS:
            def count(_: CallbackOptions, key: str = name) -> list[Observation]:
                return [Observation(int(self._counters().get(key, 0)))]

            meter.create_observable_counter(f"flowserve.requests.{name}", [count], unit="{request}")

    def batch(self, size: int, seconds: float) -> None:
        if self._size is not None and self._exec is not None:
            self._size.record(size)
            self._exec.record(seconds * 1000)

    #: An OTel histogram record is dear next to a request's work (about as dear as the rest of a record's
    #: intake): a batch records at most this many evenly spaced samples of its waits.
    WAIT_SAMPLES = 4

    def queue_wait(self, waits_ms: list[float]) -> None:
        if self._wait is not None and waits_ms:
            step = -(-len(waits_ms) // self.WAIT_SAMPLES)
            for w in waits_ms[::step]:
                self._wait.record(max(0.0, w))

    def snapshot(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """A JSON-able summary: histograms as count/mean/p50/p99/max, counters and the lag as numbers."""
        out: dict[str, Any] = {"topology": self.topology, "node": self.node, "worker": self.worker,
                               "ts_ms": int(time.time() * 1000), "counters": dict(self._counters())}
        metrics: dict[str, Any] = {}
        if self._reader is not None:
            data = self._reader.get_metrics_data()
            for rm in getattr(data, "resource_metrics", None) or []:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        short = m.name.removeprefix("flowserve.")
                        points = list(m.data.data_points)
                        if not points:
                            continue
                        point = points[0]
                        if hasattr(point, "bucket_counts"):
                            metrics[short] = _histogram(point)
                        else:
                            metrics[short] = point.value
        out["metrics"] = metrics
        out.update(extra or {})
        return out

    def close(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()


def _histogram(point: Any) -> dict[str, float]:
    count = int(point.count)
    summary = {"count": count, "mean": point.sum / count if count else 0.0,
               "max": float(point.max) if count else 0.0}
    bounds = list(point.explicit_bounds)
    counts = list(point.bucket_counts)
    for q, key in ((0.5, "p50"), (0.99, "p99")):
        summary[key] = _bucket_quantile(bounds, counts, q, summary["max"]) if count else 0.0
    return summary


def _bucket_quantile(bounds: list[float], counts: list[int], q: float, top: float) -> float:
    """Upper bound of the bucket holding quantile ``q`` (capped by the observed maximum)."""
    total = sum(counts)
    target = q * total
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= target and c:
            return min(float(bounds[i]), top) if i < len(bounds) else top
    return top


# -- reading snapshots --------------------------------------------------------------------------

async def read_snapshots(topology: Topology, kafka: KafkaSettings, *, per_partition: int = 500,
                         timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The latest snapshot per worker found in the topology's metrics topic."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, **kafka.client_kwargs())
    latest: dict[str, dict[str, Any]] = {}
    try:
        await consumer.start()  # inside: a broker that cannot be reached still gets its consumer closed
        cluster = await consumer._client.fetch_all_metadata()  # noqa: SLF001 - consumer.topics() drops it
        partitions = cluster.partitions_for_topic(topology.metrics_topic) or set()
        tps = [TopicPartition(topology.metrics_topic, p) for p in sorted(partitions)]
        if not tps:
            return []
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        begins = await consumer.beginning_offsets(tps)
        for tp in tps:
            consumer.seek(tp, max(begins[tp], ends[tp] - per_partition))
        remaining = {tp for tp in tps if ends[tp] > begins[tp]}
        loop = asyncio.get_running_loop()
        stop_at = loop.time() + timeout_s
        while remaining and loop.time() < stop_at:
            fetched = await consumer.getmany(timeout_ms=200)
            for tp, records in fetched.items():
                for rec in records:
                    try:
                        snap = json.loads(rec.value)
                    except (TypeError, ValueError):
                        continue
                    if isinstance(snap, dict):
                        latest[(rec.key or b"").decode("utf-8", "replace")] = snap
                if records and records[-1].offset + 1 >= ends[tp]:
                    remaining.discard(tp)
    finally:
        await consumer.stop()
    return sorted(latest.values(), key=lambda s: (str(s.get("node")), str(s.get("worker"))))


#: a worker whose latest snapshot is older than this (workers publish every 2 s) no longer counts as live
LIVE_AGE_S = 10.0

#: the role of a placement agent's snapshots (flowserve.models.agent: where many-model nodes' models go)
PLACEMENT_ROLE = "placement"


def model_rows(snaps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every model of many-model nodes with any activity, busiest first (answers and refusals): the workers'
    :func:`per_model` counts, and ``placed``: the partitions a placement agent sends its requests to, where
    it has more than its home (``flowserve stats`` and ``flowserve ui`` both show these)."""
    placed = {name: where.get("partitions", []) for s in snaps if s.get("role") == PLACEMENT_ROLE
              for name, where in s.get("placement", {}).get("models", {}).items()}
    busiest = sorted(per_model(snaps).items(), key=lambda kv: (-kv[1]["answers"] - kv[1]["refusals"], kv[0]))
    return [{"model": name, **c, "placed": placed.get(name, [])} for name, c in busiest]


def per_model(snaps: list[dict[str, Any]], node: str | None = None) -> dict[str, dict[str, int]]:
    """Model -> its :data:`PER_MODEL` counts summed over the workers' snapshots (of ``node`` only, if given);
    ``resident`` and ``loading`` count the workers that hold, or are loading, the model."""
    out: dict[str, dict[str, int]] = {}
    for s in snaps:
        if node is not None and s.get("node") != node:
            continue
        for key, value in s.get("counters", {}).items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "model" and parts[2] in PER_MODEL and isinstance(value, int):
                counts = out.setdefault(parts[1], dict.fromkeys(PER_MODEL, 0))
                counts[parts[2]] += value
    return out


def model_states(topology: Topology, snaps: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The V2 repository index of ``topology``'s many-model nodes: each model with its state, ``READY``
    (a worker holds it), ``LOADING`` (one is loading it) or ``UNAVAILABLE`` (none holds it; a request loads
    it on demand), from the workers' latest snapshots (:func:`read_snapshots`)."""
    index = []
    for node in topology.nodes.values():
        if node.models is None:
            continue
        counts = per_model(snaps, node.id)
        for name in node.models.model_names():
            c = counts.get(name, {})
            state = "READY" if c.get("resident") else "LOADING" if c.get("loading") else "UNAVAILABLE"
            reason = {"READY": f"resident on {c.get('resident')} worker(s) of node '{node.id}'",
                      "LOADING": f"loading on node '{node.id}'",
                      "UNAVAILABLE": "not resident (loaded on demand)"}[state]
            index.append({"name": name, "version": topology.version, "state": state, "reason": reason})
    return index


def snapshot_rows(snaps: list[dict[str, Any]], now_ms: int | None = None) -> list[dict[str, Any]]:
    """Flat rows for the ``flowserve stats`` table."""
    now_ms = now_ms or int(time.time() * 1000)
    rows = []
    for s in snaps:
        m = s.get("metrics", {})
        c = s.get("counters", {})
        size, exe, wait = m.get("batch.size", {}), m.get("batch.exec_time", {}), m.get("queue.wait", {})
        rows.append({
            "node": s.get("node"), "worker": s.get("worker"), "policy": s.get("policy", ""),
            "age_s": round((now_ms - int(s.get("ts_ms", now_ms))) / 1000, 1),
            "batches": size.get("count", c.get("batches", 0)), "batch_mean": round(size.get("mean", 0.0), 1),
            "batch_p99": size.get("p99", 0), "exec_p50_ms": exe.get("p50", 0), "exec_p99_ms": exe.get("p99", 0),
            "wait_p50_ms": wait.get("p50", 0), "wait_p99_ms": wait.get("p99", 0), "lag": m.get("lag", 0),
            **{k: c.get(k, 0) for k in COUNTERS},
            **{k: c[k] for k in PARITY_COUNTERS if k in c},
            **{k: c[k] for k in CACHE_COUNTERS if k in c},
            **{k: c[k] for k in MODEL_COUNTERS if k in c},
        })
    return rows
