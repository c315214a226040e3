"""Compile a topology spec into a validated graph: components configured, ports checked, topics named.

The top of the topology layer: it reads the specs (spec.py), builds nodes (node.py) with what capture,
parity and fusion derive from their sections, and holds them as a :class:`Topology`. Validation runs
once, at load time. Every error names the file and the node and says what to fix.
"""

from __future__ import annotations

import importlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from flowserve.component import Batch, Component, Port, load_component_class
from flowserve.errors import ComponentError, FlowserveError, TopologyError
from flowserve.topology import names
from flowserve.topology.capture import captured_ports, side_topics
from flowserve.topology.fuse import fuse_spec
from flowserve.topology.node import Node, Source, parse_ref
from flowserve.topology.parity import parity_node, readers_of
from flowserve.topology.spec import JoinSpec, TopologySpec, load_spec, load_spec_text

__all__ = ["MAX_WINDOW_MS", "OUTPUTS_NODE", "Collect", "Node", "Source", "Topology", "compile_spec", "load_topology",
           "load_topology_text"]

OUTPUTS_NODE = "outputs"
#: JoinSpec.window_ms's upper bound; a longer topology deadline must not break the implicit Collect join.
MAX_WINDOW_MS = 3_600_000


@dataclass(frozen=True)
class Topology:
    """A validated topology. Node ids are reused everywhere: topics, consumer groups, metrics, spans."""

    spec: TopologySpec
    source: str
    nodes: dict[str, Node]  # in topological order where the graph is acyclic
    inputs: dict[str, Port]
    outputs: dict[str, Source]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def version(self) -> str:
        return self.spec.version

    @property
    def base(self) -> str:
        return names.base(self.spec.prefix, self.spec.name)

    @property
    def inputs_topic(self) -> str:
        return names.inputs_topic(self.base)

    @property
    def outputs_topic(self) -> str:
        return names.outputs_topic(self.base)

    @property
    def replies_prefix(self) -> str:
        """Reply topics of synchronous callers (one per gateway instance) start with this."""
        return names.replies_prefix(self.base)

    def reply_topic(self, instance: str) -> str:
        return names.reply_topic(self.base, instance)

    @property
    def deadletter_topic(self) -> str:
        return names.deadletter_topic(self.base)

    @property
    def metrics_topic(self) -> str:
        """Workers publish periodic metrics snapshots here (``flowserve stats`` reads them)."""
        return names.metrics_topic(self.base)

    @property
    def control_topic(self) -> str:
        """Operator commands to every worker of the topology (``flowserve control``)."""
        return names.control_topic(self.base)

    @property
    def lineage_topic(self) -> str:
        return names.lineage_topic(self.base)

    @property
    def actions_topic(self) -> str:
        """What features did on their own (the tuner's scaling, the parity decoder's reconstructions)."""
        return names.actions_topic(self.base)

    @property
    def feedback_topic(self) -> str:
        """The true outputs of answered requests (``flowserve.wire.feedback``)."""
        return names.feedback_topic(self.base)

    @property
    def explanations_topic(self) -> str:
        """Attributions of requests to the topology's inputs, keyed by request id (``flowserve.explain``)."""
        return names.explanations_topic(self.base)

    @property
    def explained(self) -> bool:
        """Whether an ``explain:`` section (on the topology or a node) asks for explanations."""
        return self.spec.explain is not None or any(n.explain is not None for n in self.spec.nodes.values())

    def decisions_topic(self, node_id: str) -> str:
        """What learning node ``node_id`` decided per request (``Component.learns``)."""
        return names.decisions_topic(self.base, node_id)

    def state_topic(self, node_id: str) -> str:
        """What learning node ``node_id`` learned, per context (a compacted topic)."""
        return names.state_topic(self.base, node_id)

    def side_topic(self, name: str) -> str:
        """Where a component's side reports go (``Component.side_output``)."""
        return names.side_topic(self.base, name)

    def with_partitions(self, partitions: int) -> Topology:
        """The same topology with another partition count (e.g. sized for a cluster at deploy time)."""
        return compile_spec(self.spec.model_copy(update={"partitions": partitions}), source=self.source)

    def group_id(self, node_id: str) -> str:
        return names.group_id(self.base, node_id)

    def topics(self) -> list[str]:
        """Every topic this topology writes or reads that it owns (not other topologies' outputs)."""
        owned = [self.inputs_topic, self.outputs_topic, self.deadletter_topic, self.metrics_topic,
                 self.feedback_topic]
        for node in self.nodes.values():
            owned.extend(node.output_topics.values())
            owned.extend(node.capture_topics.values())
        owned.extend(side_topics(self.spec, self.nodes))
        for node in self.nodes.values():
            if node.component.learns:
                owned.extend((self.decisions_topic(node.id), self.state_topic(node.id)))
        protected = [n for n, s in self.spec.nodes.items() if s.parity is not None]
        owned.extend(names.parity_query_topic(self.base, n) for n in protected)
        if self.explained:
            owned.append(self.explanations_topic)
        if protected:  # parity decoders record each reconstruction's group in lineage, and as an action
            owned.extend((self.lineage_topic, self.actions_topic))
        return list(dict.fromkeys(owned))

    def output_ports(self) -> dict[str, Port]:
        return {name: src.port or Port("BYTES", (-1,)) for name, src in self.outputs.items()}

    def sampler(self) -> Callable[..., tuple[list[dict[str, np.ndarray]], list[Any]]]:
        """The topology's ``sample:`` function (``module:function``): ``sampler(n)`` gives ``n`` sample
        requests and their labels (``flowserve run --sample``, profiling, benches)."""
        ref = self.spec.sample
        if not ref:
            raise FlowserveError(f"topology '{self.name}' has no 'sample' entry; add 'sample: module:function'")
        module_name, _, attr = ref.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise FlowserveError(f"cannot load sampler '{ref}' of topology '{self.name}': {exc}") from None

    @cached_property
    def critical_path(self) -> frozenset[str]:
        """The nodes some of whose outputs reach the topology's ``outputs``, directly or transitively.

        The others are side branches (e.g. a drift detector reading ``pre.x``): nothing a caller waits
        for depends on them, so their workers run at a lower OS priority (``NodeSpec.nice``).
        """
        feeds: dict[str, set[str]] = {n: set() for n in self.nodes}  # node -> the nodes it reads from
        for node in self.nodes.values():
            feeds[node.id].update(src.node for src in node.sources if src.node is not None)
        todo = [n for n, node in self.nodes.items() if node.emits_outputs]
        todo += [src.node for src in self.outputs.values() if src.node is not None]
        seen: set[str] = set()
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(feeds.get(n, ()))
        # A parity model node stands in for its protected node's late outputs: on the path when that is.
        seen.update(names.parity_node(n) for n, s in self.spec.nodes.items()
                    if s.parity is not None and n in seen and names.parity_node(n) in self.nodes)
        return frozenset(seen)

    def on_critical_path(self, node_id: str) -> bool:
        """Whether ``node_id``'s work delays a reply (False for a side branch such as a drift detector)."""
        return node_id in self.critical_path


class Collect(Component):
    """The implicit sink that joins a topology's outputs when they come from several nodes."""

    max_batch: ClassVar[int] = 4096

    def __init__(self, ports: dict[str, Port], *, node: str = OUTPUTS_NODE) -> None:
        super().__init__(node=node)
        self.inputs = dict(ports)  # type: ignore[misc]
        self.outputs = dict(ports)  # type: ignore[misc]

    def process(self, batch: Batch) -> dict[str, Any]:
        return dict(batch)


def _check_deadline_join(component: Component, node_id: str, source: str) -> None:
    """A deadline join hands its component zero-filled rows for absent inputs: it must say it copes, and
    each input port's row shape must be fixed so that the join can fill it."""
    if not component.accepts_absent:
        raise TopologyError(
            f"'join: {{type: deadline}}' may leave inputs absent, and {type(component).__name__} does not declare "
            "'accepts_absent'; use a combiner that does (e.g. flowserve_components.ensemble:Average) or another "
            "join type", source=source, node=node_id)
    for port, spec in component.inputs.items():
        if any(d < 0 for d in spec.shape[1:]):
            raise TopologyError(
                f"input port '{port}' has shape {list(spec.shape)}: a deadline join fills absent inputs with "
                "zeros, so every dimension after the first must be fixed", source=source, node=node_id)


def _find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(edges[n]):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        path.pop()
        state[n] = 2
        return None

    for n in edges:
        if n not in state and (found := visit(n)):
            return found
    return None


def _order(edges: dict[str, set[str]]) -> list[str]:
    indegree = {n: 0 for n in edges}
    for targets in edges.values():
        for m in targets:
            indegree[m] += 1
    ready = deque(sorted(n for n, d in indegree.items() if d == 0))
    out: list[str] = []
    while ready:
        n = ready.popleft()
        out.append(n)
        for m in sorted(edges[n]):
            indegree[m] -= 1
            if indegree[m] == 0:
                ready.append(m)
    return out + [n for n in edges if n not in out]  # cycle members, when cycles are allowed


def compile_spec(spec: TopologySpec, source: str = "<topology>") -> Topology:
    if spec.fuse:  # check the graph as written, then compile it with each chain as one node
        # capture names the fused nodes, so it is checked against the fused graph (fuse_spec rejects members)
        unfused = compile_spec(spec.model_copy(update={"fuse": {}, "capture": None}), source)
        spec = fuse_spec(spec, unfused.nodes, unfused.outputs, source)
    components: dict[str, Component] = {}
    for node_id, node_spec in spec.nodes.items():
        try:
            cls = load_component_class(node_spec.component)
            components[node_id] = cls.configure(node_spec.params, node=node_id)
        except ComponentError as exc:
            raise TopologyError(str(exc), source=source, node=node_id) from None

    bindings: dict[str, dict[str, tuple[Source, ...]]] = {}
    triggers: dict[str, tuple[Source, ...]] = {}
    derived_inputs: dict[str, tuple[Port, str]] = {}
    for node_id, node_spec in spec.nodes.items():
        component = components[node_id]
        for port in node_spec.inputs:
            if port not in component.inputs:
                raise TopologyError(
                    f"unknown input port '{port}' of {type(component).__name__} "
                    f"(its inputs: {', '.join(component.inputs) or 'none'})",
                    source=source, node=node_id,
                )
        missing = [p for p in component.inputs if p not in node_spec.inputs]
        if missing:
            raise TopologyError(
                f"input port(s) {', '.join(missing)} of {type(component).__name__} are not connected; "
                f"add them under 'inputs'",
                source=source, node=node_id,
            )
        if node_spec.join.type == "deadline":
            _check_deadline_join(component, node_id, source)
        node_bindings: dict[str, tuple[Source, ...]] = {}
        for port, refs in node_spec.inputs.items():
            ref_list = [refs] if isinstance(refs, str) else list(refs)
            if not ref_list:
                raise TopologyError(f"input port '{port}' has an empty list of sources", source=source,
                                    node=node_id)
            if len(ref_list) > 1 and node_spec.join.type != "any":
                raise TopologyError(
                    f"input port '{port}' lists {len(ref_list)} alternative sources; that needs "
                    "'join: {type: any}'",
                    source=source, node=node_id,
                )
            sources = tuple(parse_ref(r, spec, components, node_id, source) for r in ref_list)
            want = component.inputs[port]
            for src in sources:
                if src.port is not None and (why := src.port.compatible(want)):
                    raise TopologyError(
                        f"'{src.ref}' cannot feed input port '{port}': {why}", source=source, node=node_id
                    )
                if src.node is None and src.ref.startswith("input."):
                    seen = derived_inputs.get(src.tensor)
                    if seen and seen[0].compatible(want):
                        raise TopologyError(
                            f"topology input '{src.tensor}' feeds ports that disagree: "
                            f"{seen[0].compatible(want)} (node '{seen[1]}'); declare it under 'inputs'",
                            source=source, node=node_id,
                        )
                    derived_inputs.setdefault(src.tensor, (want, node_id))
            node_bindings[port] = sources
        bindings[node_id] = node_bindings
        triggers[node_id] = tuple(parse_ref(r, spec, components, node_id, source) for r in node_spec.triggers)

    inputs: dict[str, Port] = {
        name: Port(p.datatype, p.shape, p.allow_nan) for name, p in spec.inputs.items()
    } or {name: port for name, (port, _) in derived_inputs.items()}

    outputs = {
        name: parse_ref(ref, spec, components, f"outputs.{name}", source) for name, ref in spec.outputs.items()
    }
    if not outputs:
        raise TopologyError("a topology needs at least one entry under 'outputs'", source=source)

    edges: dict[str, set[str]] = {n: set() for n in spec.nodes}
    for node_id in spec.nodes:
        for src in [*(s for ss in bindings[node_id].values() for s in ss), *triggers[node_id]]:
            if src.node is not None:
                edges[src.node].add(node_id)
    cycle = _find_cycle(edges)
    if cycle and not spec.allow_cycles:
        raise TopologyError(
            f"cycle {' -> '.join(cycle)}; remove it or set 'allow_cycles: true' (with 'max_revisits')",
            source=source, node=cycle[0],
        )

    roots = [
        n for n in spec.nodes
        if any(s.node is None for ss in bindings[n].values() for s in ss) or any(s.node is None for s in triggers[n])
    ]
    reached = set(roots)
    queue = deque(roots)
    while queue:
        for m in edges[queue.popleft()]:
            if m not in reached:
                reached.add(m)
                queue.append(m)
    for node_id in spec.nodes:
        if node_id not in reached:
            raise TopologyError(
                "unreachable: none of its inputs lead back to the topology's inputs; "
                "connect it to 'input.<name>' or to a node that is",
                source=source, node=node_id,
            )

    # Only ports somebody reads get a topic: an unread edge would cost a produce per request for nothing.
    consumed = {(src.node, src.tensor) for n in spec.nodes
                for src in [*(s for ss in bindings[n].values() for s in ss), *triggers[n]] if src.node}
    order = _order(edges)
    producers = {src.node for src in outputs.values()}
    single = next(iter(producers)) if len(producers) == 1 and None not in producers else None
    if single is None:  # the implicit Collect node reads every output's topic
        consumed.update((src.node, src.tensor) for src in outputs.values() if src.node)
    captured = captured_ports(spec, {n: list(c.outputs) for n, c in components.items()}, consumed, source)
    nodes: dict[str, Node] = {}
    base = names.base(spec.prefix, spec.name)
    for node_id in order:
        node_spec = spec.nodes[node_id]
        component = components[node_id]
        nodes[node_id] = Node(
            id=node_id,
            component=component,
            bindings=bindings[node_id],
            triggers=triggers[node_id],
            join=node_spec.join,
            max_batch=node_spec.max_batch or component.max_batch,
            replicas=node_spec.replicas,
            output_topics={p: names.edge_topic(base, node_id, p) for p in component.outputs
                           if (node_id, p) in consumed},
            emits_outputs={name: src.tensor for name, src in outputs.items()} if node_id == single else {},
            capture_topics=captured.get(node_id, {}),
            cache=node_spec.cache,
            models=node_spec.models,
        )
    if single is None:
        ports = {name: src.port or Port("BYTES", (-1,)) for name, src in outputs.items()}
        collect = Collect(ports)
        nodes[OUTPUTS_NODE] = Node(
            id=OUTPUTS_NODE,
            component=collect,
            bindings={name: (src,) for name, src in outputs.items()},
            triggers=(),
            join=JoinSpec(type="inner", window_ms=min(spec.deadline_ms, MAX_WINDOW_MS)),
            max_batch=Collect.max_batch,
            replicas=1,
            output_topics={},
            emits_outputs={name: name for name in outputs},
        )
    _add_parity(spec, nodes, source)
    return Topology(spec=spec, source=source, nodes=nodes, inputs=inputs, outputs=outputs)


def _add_parity(spec: TopologySpec, nodes: dict[str, Node], source: str) -> None:
    """Add the parity model node of every parity-protected node; its readers drop late duplicates."""
    base = names.base(spec.prefix, spec.name)
    for node_id, node_spec in spec.nodes.items():
        if node_spec.parity is None or node_id not in nodes:
            continue
        added = parity_node(nodes[node_id], node_spec.parity, node_spec.params, base, spec.partitions, source,
                            set(nodes) | set(spec.nodes))
        nodes[added.id] = added
        for reader, topics in readers_of(nodes, node_id).items():
            nodes[reader] = replace(nodes[reader], first_wins=nodes[reader].first_wins | frozenset(topics))


def load_topology(path: str | Path) -> Topology:
    """Load and validate a topology YAML file. Raises :class:`TopologyError` naming file and node."""
    path = Path(path)
    spec = load_spec(path)
    try:
        return compile_spec(spec, source=str(path))
    except TopologyError:
        raise
    except FlowserveError as exc:
        raise TopologyError(str(exc), source=str(path)) from None


def load_topology_text(text: str, source: str = "<string>") -> Topology:
    return compile_spec(load_spec_text(text, source), source=source)
