"""The ``capture:`` section of a topology: which requests and ports are kept, lineage, tracing, retention.

Without a ``capture:`` section nothing extra is written. With one::

    capture:
      sample: 0.1              # fraction of requests, chosen by a hash of the request id (same at every node)
      ports: [post.probs]      # also give these ports a topic when no node reads them ("node.*", "*")
      lineage: true            # lineage records (one per batch) to <prefix>.<topology>.lineage
      tracing: true            # OpenTelemetry spans per batch and per request
      retention_ms: 86400000   # retention.ms of the topics capture reads, set when they are created
      retention_bytes: 1073741824  # retention.bytes (per partition) of the same topics
      redact:                  # per captured port, before anything is written: drop, hash or keep (default)
        pre.text: hash         # HMAC-SHA256 with the key named by hash_key
        model.embedding: drop
      hash_key: {env: FLOWSERVE_CAPTURE_KEY}   # or {file: /run/secrets/capture-key}; never the key itself
      nodes:                   # per-node overrides
        model: {sample: 1.0}
        post: {enabled: false}

The section's models (:class:`CaptureSpec`) are plain specs in spec.py; the policy derived from them
lives here: which requests are sampled (deterministically: a request id
hashes to a point in [0, 1) and is captured where that point is below the node's rate, so a request
sampled at 10% is captured at every node whose rate is 10% or more), which ports get capture topics,
and the topics capture adds to a topology.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Any, Protocol

from flowserve.errors import TopologyError
from flowserve.topology import names
from flowserve.topology.node import Node
from flowserve.topology.spec import CaptureSpec, Redaction, TopologySpec

__all__ = ["OFF", "Compiled", "NodePolicy", "captured_ports", "lineage_on", "node_policy", "redactions",
           "sample_point", "side_topics", "topic_configs"]

_SCALE = float(1 << 64)


class Compiled(Protocol):
    """What :func:`topic_configs` reads of a compiled topology (a :class:`~flowserve.topology.graph.Topology`,
    which is built from this module's results and so is not imported here)."""

    @property
    def spec(self) -> TopologySpec: ...

    @property
    def nodes(self) -> Mapping[str, Node]: ...

    def topics(self) -> list[str]: ...


def sample_point(request_id: str) -> float:
    """Where a request id falls in [0, 1): the same value in every process, on every node."""
    digest = hashlib.blake2b(request_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


@dataclass(frozen=True, slots=True)
class NodePolicy:
    """The capture settings in force at one node."""

    enabled: bool = False
    sample: float = 0.0
    lineage: bool = False
    tracing: bool = False

    @property
    def active(self) -> bool:
        return self.enabled and self.sample > 0.0

    def sampled(self, request_id: str) -> bool:
        if not self.active:
            return False
        return self.sample >= 1.0 or sample_point(request_id) < self.sample


OFF = NodePolicy()


def node_policy(spec: TopologySpec, node_id: str) -> NodePolicy:
    cap = spec.capture
    if cap is None or not cap.enabled:
        return OFF
    override = cap.nodes.get(node_id)
    if override is not None and not override.enabled:
        return OFF

    def pick(name: str) -> Any:
        value = getattr(override, name) if override is not None else None
        return getattr(cap, name) if value is None else value

    return NodePolicy(enabled=True, sample=pick("sample"), lineage=pick("lineage"), tracing=pick("tracing"))


def captured_ports(spec: TopologySpec, outputs: Mapping[str, Iterable[str]],
                   consumed: Set[tuple[str, str]] | Set[tuple[str | None, str]],
                   source: str) -> dict[str, dict[str, str]]:
    """Per node, the captured ports that nobody reads and so need a topic of their own: port -> topic.

    ``outputs`` maps each node to its output port names; ``consumed`` holds the (node, port) pairs
    that already have a topic because some node reads them. Raises :class:`TopologyError` for a
    pattern or override that names an unknown node or port.
    """
    cap: CaptureSpec | None = spec.capture
    if cap is None or not cap.enabled:
        return {}
    for node_id in cap.nodes:
        if node_id not in outputs:
            raise TopologyError(f"capture.nodes names unknown node '{node_id}' (nodes: {', '.join(outputs)})",
                                source=source, node=node_id)
    wanted: set[tuple[str, str]] = set()
    for pattern in cap.ports:
        if pattern == "*":
            wanted.update((n, p) for n, ports in outputs.items() for p in ports)
            continue
        node_id, dot, port = pattern.partition(".")
        if not dot or node_id not in outputs:
            raise TopologyError(f"capture.ports: '{pattern}' must be 'node.port', 'node.*' or '*' with a "
                                f"known node (nodes: {', '.join(outputs)})", source=source, node=node_id or None)
        ports = list(outputs[node_id])
        if port == "*":
            wanted.update((node_id, p) for p in ports)
        elif port in ports:
            wanted.add((node_id, port))
        else:
            raise TopologyError(f"capture.ports: node '{node_id}' has no output port '{port}' "
                                f"(its outputs: {', '.join(ports) or 'none'})", source=source, node=node_id)
    out: dict[str, dict[str, str]] = {}
    for node_id, port in sorted(wanted):
        if (node_id, port) in consumed or not node_policy(spec, node_id).enabled:
            continue
        out.setdefault(node_id, {})[port] = names.edge_topic(names.base(spec.prefix, spec.name), node_id, port)
    _check_redact(cap, outputs, out, consumed, source)
    return out


def _check_redact(cap: CaptureSpec, outputs: Mapping[str, Iterable[str]], captured: Mapping[str, Mapping[str, str]],
                  consumed: Set[tuple[str, str]] | Set[tuple[str | None, str]], source: str) -> None:
    """Each ``redact`` entry names a port capture writes, and ``hash`` has a key source."""
    for target, mode in cap.redact.items():
        node_id, dot, port = target.partition(".")
        if not dot or node_id not in outputs:
            raise TopologyError(f"capture.redact: '{target}' must be 'node.port' with a known node "
                                f"(nodes: {', '.join(outputs)})", source=source, node=node_id or None)
        ports = list(outputs[node_id])
        if port not in ports:
            raise TopologyError(f"capture.redact: node '{node_id}' has no output port '{port}' "
                                f"(its outputs: {', '.join(ports) or 'none'})", source=source, node=node_id)
        if port not in captured.get(node_id, {}):
            why = (f"node '{node_id}' port '{port}' feeds the pipeline through its edge topic, which capture "
                   "does not write" if (node_id, port) in consumed else
                   f"port '{port}' is not captured: add '{target}' to capture.ports (with capture on for "
                   f"node '{node_id}')")
            raise TopologyError(f"capture.redact: {why}; only ports written to capture topics can be redacted",
                                source=source, node=node_id)
        if mode == "hash" and cap.hash_key is None:
            raise TopologyError(f"capture.redact: port '{port}' is hashed but no key is named: add "
                                "capture.hash_key: {env: VARIABLE} or {file: PATH}", source=source, node=node_id)


def redactions(spec: TopologySpec, node_id: str) -> dict[str, Redaction]:
    """The redaction of each of a node's ports that is not ``keep``: port -> ``drop`` or ``hash``."""
    cap = spec.capture
    if cap is None:
        return {}
    prefix = node_id + "."
    return {t[len(prefix):]: m for t, m in cap.redact.items() if t.startswith(prefix) and m != "keep"}


def lineage_on(spec: TopologySpec, node_ids: Iterable[str]) -> bool:
    return any(node_policy(spec, n).lineage and node_policy(spec, n).active for n in node_ids)


def side_topics(spec: TopologySpec, nodes: Mapping[str, Node]) -> list[str]:
    """Topics capture adds to a topology: the lineage topic when lineage is on, and side-report topics."""
    base = names.base(spec.prefix, spec.name)
    topics = [names.lineage_topic(base)] if lineage_on(spec, nodes) else []
    for node in nodes.values():
        name = node.component.side_output
        if name:
            topics.append(names.side_topic(base, name))
    return list(dict.fromkeys(topics))


def topic_configs(topology: Compiled) -> dict[str, dict[str, str]]:
    """Per-topic configs for topic creation: ``retention.ms`` and ``retention.bytes`` of every topic capture
    reads, when set, and ``cleanup.policy=compact`` for learning nodes' state topics (the last value per
    context is the state)."""
    spec = topology.spec
    base = names.base(spec.prefix, spec.name)
    compact = {names.state_topic(base, n): {"cleanup.policy": "compact"}
               for n, node in topology.nodes.items() if node.component.learns}
    cap = spec.capture
    if cap is None or not cap.enabled:
        return compact
    retention = {key: str(value) for key, value in (("retention.ms", cap.retention_ms),
                                                   ("retention.bytes", cap.retention_bytes)) if value is not None}
    if not retention:
        return compact
    skip = {names.inputs_topic(base), names.outputs_topic(base), names.deadletter_topic(base), *compact}
    return {**{t: dict(retention) for t in topology.topics() if t not in skip}, **compact}
