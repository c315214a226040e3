"""``flowserve learn`` and ``flowserve versions``: training sets from feedback, and live against shadow.

A training set is the feedback (``<base>.feedback``: the true outputs per request id) joined with the
inputs the node read for the same requests, read back from its input topics (the captured edge, e.g.
``<base>.pre.x``), never from a process's memory. :func:`learn` fine-tunes the live version on it (the
component's ``retrain``) and registers the result. :func:`compare` scores the node's live outputs and its
shadow's (:mod:`flowserve.learning.shadow`) against the same feedback, per version.

Records are read through a :class:`RecordSource` (``flowserve.capture.Reader`` in the command line and
the bench), so this package reads Kafka the same way ``inspect`` does without importing capture.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from flowserve.component import require
from flowserve.errors import ComponentError, FlowserveError, WireError
from flowserve.learning.capabilities import Retrainable, score
from flowserve.learning.registry import BASE, Manifest, Registry
from flowserve.topology import names
from flowserve.topology.capture import node_policy
from flowserve.topology.graph import Topology
from flowserve.wire.envelope import H_MODEL_VERSION
from flowserve.wire.feedback import Feedback, decode_feedback


class RecordLike(Protocol):
    """One record read back: what :class:`flowserve.capture.reader.Decoded` offers."""

    topic: str
    key: str | None
    timestamp_ms: int
    headers: dict[str, str]
    tensors: dict[str, np.ndarray]
    body: Any


class RecordSource(Protocol):
    """Reads topics back from their start (``flowserve.capture.reader.Reader``)."""

    async def read(self, topics: Iterable[str]) -> Sequence[RecordLike]: ...


@dataclass
class TrainingSet:
    """Examples by input port and their true outputs by name, one row each, in feedback order."""

    request_ids: list[str]
    inputs: dict[str, np.ndarray]
    targets: dict[str, np.ndarray]
    #: feedback records whose request's inputs were not found (not captured, expired, another topology)
    missing: int = 0
    feedback: int = 0

    @property
    def size(self) -> int:
        return len(self.request_ids)


def check_captured(topology: Topology, node_id: str) -> None:
    """Raise, saying what to add, unless ``node_id``'s input ports are captured (kept for ``learn``)."""
    node = topology.nodes[node_id]
    for port, sources in node.bindings.items():
        src = sources[0]
        producer = src.node if src.node is not None else node_id
        if not node_policy(topology.spec, producer).enabled:
            where = f"{src.node}.{src.tensor}" if src.node else f"input.{src.tensor}"
            raise FlowserveError(
                f"node '{node_id}': its input port '{port}' ({where}, topic {src.topic}) is not captured, so "
                "learn cannot join feedback with what the node read; add a 'capture:' section to the topology "
                "(the edges a node reads are then kept; set its retention_ms so they outlive the wait for "
                f"feedback) and leave node '{producer}' enabled under capture.nodes")


def join_training_set(feedback: Iterable[Feedback], inputs: Mapping[str, Mapping[str, np.ndarray]]) -> TrainingSet:
    """Join feedback with the inputs of the same request ids (``inputs``: request id -> arrays by port).

    A request with several feedback records counts once, with its latest truth. Requests whose inputs are
    absent are counted in ``missing``; a truth whose row count differs from its inputs' is skipped too.
    """
    latest: dict[str, Feedback] = {}
    total = 0
    for fb in feedback:
        total += 1
        if fb.request_id not in latest or fb.ts_ms >= latest[fb.request_id].ts_ms:
            latest[fb.request_id] = fb
    ids: list[str] = []
    xs: dict[str, list[np.ndarray]] = {}
    ys: dict[str, list[np.ndarray]] = {}
    missing = 0
    for rid, fb in latest.items():
        got = inputs.get(rid)
        if not got:
            missing += 1
            continue
        rows = len(next(iter(got.values())))
        if any(len(np.atleast_1d(a)) != rows for a in fb.outputs.values()):
            missing += 1
            continue
        if ys and set(fb.outputs) != set(ys):
            missing += 1
            continue
        ids.append(rid)
        for port, array in got.items():
            xs.setdefault(port, []).append(array)
        for name, array in fb.outputs.items():
            ys.setdefault(name, []).append(np.atleast_1d(array))
    return TrainingSet(ids, {p: np.concatenate(a) for p, a in xs.items()},
                       {n: np.concatenate(a) for n, a in ys.items()}, missing, total)


async def read_feedback(topology: Topology, source: RecordSource) -> list[Feedback]:
    """Every valid feedback record of the topology (invalid ones are skipped: anyone may write there)."""
    out = []
    for rec in await source.read([names.feedback_topic(topology.base)]):
        try:
            out.append(decode_feedback(rec.key.encode() if rec.key else None, rec.body, rec.timestamp_ms))
        except WireError:
            continue
    return out


async def read_inputs(topology: Topology, node_id: str, source: RecordSource,
                      wanted: set[str] | None = None) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, int]]:
    """What ``node_id`` read, per request id: arrays by input port; and each request's input time (the
    latest of its input records' timestamps, ms)."""
    node = topology.nodes[node_id]
    by_port: dict[str, dict[str, np.ndarray]] = {}
    when: dict[str, int] = {}
    for port, sources in node.bindings.items():
        src = sources[0]
        for rec in await source.read([src.topic]):
            rid = rec.key
            if rid is None or (wanted is not None and rid not in wanted) or src.tensor not in rec.tensors:
                continue
            by_port.setdefault(rid, {})[port] = rec.tensors[src.tensor]
            when[rid] = max(when.get(rid, 0), rec.timestamp_ms)
    ports = set(node.bindings)
    return {rid: got for rid, got in by_port.items() if set(got) == ports}, when


async def training_set(topology: Topology, node_id: str, source: RecordSource, *,
                       last: int | None = None) -> TrainingSet:
    """The feedback of ``topology`` (the ``last`` N records, when given) joined with ``node_id``'s inputs."""
    check_captured(topology, node_id)
    feedback = await read_feedback(topology, source)
    if last is not None:
        feedback = feedback[-last:]
    inputs, _ = await read_inputs(topology, node_id, source, {fb.request_id for fb in feedback})
    return join_training_set(feedback, inputs)


def retrain(topology: Topology, node_id: str, data: TrainingSet, *, registry: Registry | None = None) -> Manifest:
    """Fine-tune ``node_id``'s live version on ``data`` and register the result as a new version."""
    node = topology.nodes[node_id]
    if not node.component.retrainable:
        raise ComponentError(f"node '{node_id}' runs {type(node.component).__name__}, which cannot retrain "
                             "(it does not declare 'retrainable')")
    if not data.size:
        raise FlowserveError(f"node '{node_id}': no training examples: {data.feedback} feedback record(s), "
                             f"{data.missing} without captured inputs; send feedback for answered requests "
                             f"to {names.feedback_topic(topology.base)}")
    registry = registry or Registry(topology.name, node_id)
    component = type(node.component).configure(dict(topology.spec.nodes[node_id].params), node=node_id)
    trainer = require(component, Retrainable, "retrain (it declares 'retrainable')")
    component.prepare()
    component.setup()
    parent = registry.live()
    if parent != BASE:
        trainer.load_weights(registry.weights(parent), parent)
    started = time.perf_counter()
    result = trainer.retrain(data.inputs, data.targets)
    metrics = {**result.metrics, "train_seconds": round(time.perf_counter() - started, 3)}
    component.close()
    return registry.register(result.weights, parent=parent, training_size=data.size, metrics=metrics)


@dataclass
class VersionRow:
    """How one version did on the requests that have feedback."""

    role: str  # "live" or "shadow"
    version: str
    requests: int
    accuracy: float | None
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    #: for a shadow row: the live outputs' accuracy on the same requests (a paired comparison)
    live_accuracy: float | None = None

    def latency(self, q: float) -> float | None:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else None


def _version_of(headers: Mapping[str, str], node_id: str) -> str:
    tag = headers.get(H_MODEL_VERSION, "")
    name, _, version = tag.partition("=")
    return version if name == node_id and version else BASE


async def compare(topology: Topology, node_id: str, source: RecordSource) -> list[VersionRow]:
    """Live and shadow outputs of ``node_id`` scored against the feedback, one row per (role, version).

    Latency is the node's own: from its input record to its output record (broker timestamps), which
    for the shadow includes its lower priority as a side branch.
    """
    node = topology.nodes[node_id]
    component = node.component
    feedback = {fb.request_id: fb for fb in await read_feedback(topology, source)}
    _, arrived = await read_inputs(topology, node_id, source, set(feedback))
    live_topics = {p: node.output_topics.get(p) or node.capture_topics.get(p) for p in component.outputs}
    absent = [p for p, t in live_topics.items() if t is None]
    if absent:
        raise FlowserveError(f"node '{node_id}': output port(s) {', '.join(absent)} have no topic to compare; "
                             f"capture them ('capture: {{ports: [{node_id}.*]}}')")
    roles = {"live": {t: p for p, t in live_topics.items() if t},
             "shadow": {names.shadow_topic(topology.base, node_id, p): p for p in component.outputs}}
    rows: list[VersionRow] = []
    live_right: dict[str, bool] = {}
    for role, topics in roles.items():
        got: dict[tuple[str, str], dict[str, dict[str, np.ndarray]]] = {}
        done: dict[tuple[str, str], dict[str, int]] = {}
        for rec in await source.read(topics):
            rid = rec.key
            if rid is None or rid not in feedback or not rec.tensors:
                continue
            key = (role, _version_of(rec.headers, node_id))
            port = topics[rec.topic]
            got.setdefault(key, {}).setdefault(rid, {})[port] = rec.tensors[port]
            done.setdefault(key, {})[rid] = max(done.get(key, {}).get(rid, 0), rec.timestamp_ms)
        for key, per_request in sorted(got.items()):
            rids = [r for r, outs in per_request.items() if set(outs) == set(topics.values())]
            scored = [bool(score(component, per_request[r], feedback[r].outputs).all()) for r in rids]
            waits = [float(done[key][r] - arrived[r]) for r in rids if r in arrived]
            row = VersionRow(key[0], key[1], len(rids), float(np.mean(scored)) if scored else None, waits)
            if role == "live":
                live_right.update(zip(rids, scored, strict=True))
            else:
                paired = [live_right[r] for r in rids if r in live_right]
                row.live_accuracy = float(np.mean(paired)) if paired else None
            rows.append(row)
    return rows


__all__ = ["RecordSource", "TrainingSet", "VersionRow", "check_captured", "compare", "join_training_set",
           "read_feedback", "read_inputs", "retrain", "training_set"]
