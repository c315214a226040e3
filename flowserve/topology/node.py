"""The compiled pieces of a topology: a :class:`Node` and the :class:`Source` of each tensor it reads.

Plain frozen data above the specs: capture, parity and fusion build and check nodes from specs here, and
graph.py assembles them into a :class:`~flowserve.topology.graph.Topology`. Nothing here refers back up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from flowserve.component import Component, Port
from flowserve.errors import TopologyError
from flowserve.topology import names
from flowserve.topology.spec import CacheSpec, JoinSpec, ModelsSpec, TopologySpec


@dataclass(frozen=True, slots=True)
class Source:
    """Where a tensor comes from: a topic and the tensor's name inside that topic's records."""

    topic: str
    tensor: str
    node: str | None  # producing node, None for the topology's inputs or another topology
    ref: str  # as written in the YAML
    port: Port | None = None  # spec of the producing port, when known


@dataclass(frozen=True)
class Node:
    id: str
    component: Component
    bindings: dict[str, tuple[Source, ...]]
    triggers: tuple[Source, ...]
    join: JoinSpec
    max_batch: int
    replicas: int
    output_topics: dict[str, str]
    #: output name -> port of this node, when this node also writes the topology's outputs record.
    emits_outputs: dict[str, str] = field(default_factory=dict)
    #: port -> topic of captured ports nobody reads (written for sampled requests only; see flowserve.capture).
    capture_topics: dict[str, str] = field(default_factory=dict)
    #: input topics where a request's first record wins and a later one is dropped as a duplicate (the
    #: outputs of a parity-protected node: a reconstructed output and the late real one; flowserve.parity).
    first_wins: frozenset[str] = frozenset()
    #: the node's prediction cache (flowserve.cache), when its YAML asks for one
    cache: CacheSpec | None = None
    #: the models of a many-model node (flowserve.models), when its YAML declares them
    models: ModelsSpec | None = None

    @property
    def sources(self) -> list[Source]:
        """Everything this node reads: each port's sources, then its triggers."""
        return [*(s for sources in self.bindings.values() for s in sources), *self.triggers]

    @property
    def input_topics(self) -> tuple[str, ...]:
        return tuple(sorted({s.topic for s in self.sources}))

    @property
    def needs_join(self) -> bool:
        return len(self.input_topics) > 1 or any(len(s) > 1 for s in self.bindings.values())


def parse_ref(ref: str, spec: TopologySpec, nodes: Mapping[str, Component], node_id: str, source: str) -> Source:
    """The :class:`Source` that reference ``ref`` (as written under ``inputs``, ``triggers`` or ``outputs``
    in the YAML) names; :class:`TopologyError` names ``node_id`` and says what a reference looks like."""
    parts = ref.split(".")
    base = names.base(spec.prefix, spec.name)
    if len(parts) == 2 and parts[0] == "input":
        tensor = parts[1]
        declared = spec.inputs.get(tensor)
        port = Port(declared.datatype, declared.shape, declared.allow_nan) if declared else None
        if spec.inputs and declared is None:
            raise TopologyError(
                f"'{ref}' names topology input '{tensor}', which is not declared under 'inputs' "
                f"(declared: {', '.join(spec.inputs)})",
                source=source, node=node_id,
            )
        return Source(names.inputs_topic(base), tensor, None, ref, port)
    if len(parts) == 2:
        upstream, port_name = parts
        if upstream not in nodes:
            raise TopologyError(
                f"'{ref}' refers to unknown node '{upstream}' (nodes: {', '.join(nodes)})",
                source=source, node=node_id,
            )
        ports = nodes[upstream].outputs
        if port_name not in ports:
            raise TopologyError(
                f"'{ref}': node '{upstream}' has no output port '{port_name}' "
                f"(its outputs: {', '.join(ports) or 'none'})",
                source=source, node=node_id,
            )
        return Source(names.edge_topic(base, upstream, port_name), port_name, upstream, ref, ports[port_name])
    if len(parts) == 3 and parts[1] == "outputs":
        other, _, tensor = parts
        return Source(names.outputs_topic(names.base(spec.prefix, other)), tensor, None, ref)
    raise TopologyError(
        f"cannot read reference '{ref}': use 'node.port', 'input.name' or 'topology.outputs.name'",
        source=source, node=node_id,
    )
