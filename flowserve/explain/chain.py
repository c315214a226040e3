"""A topology's path from its inputs to one output, as one function: in torch (differentiable) or in numpy.

:func:`compose` takes the nodes an output depends on, in the graph's order, and wires each node's input
ports to the topology's inputs or to the outputs of the nodes before it, as the YAML does. The torch
function runs each node's :meth:`~flowserve.explain.capabilities.Differentiable.torch_forward`, so autograd
sees the whole chain (integrated gradients attributes the final output to the topology's inputs through
every stage); the numpy function runs each component's own ``process``, so any chain can be explained by a
method that only evaluates it (KernelSHAP).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowserve.component import Batch, Component, read_result, require
from flowserve.errors import ErrorKind, FlowserveError, TopologyError
from flowserve.explain.capabilities import Differentiable
from flowserve.topology.fuse import Chain as FusedChain
from flowserve.topology.graph import Node, Topology, compile_spec
from flowserve.topology.spec import ExplainSpec, load_spec


class ExplainError(FlowserveError):
    """An ``explain:`` section or an explanation that cannot be computed (says which node, output or input)."""


@dataclass(frozen=True)
class Target:
    """What is explained: ``port`` of node ``node`` (a topology output ``name``), under ``spec``'s settings."""

    name: str
    node: str
    port: str
    spec: ExplainSpec


def unfused(topology: Topology) -> Topology:
    """``topology`` with its ``fuse:`` chains undone, read again from its YAML file: explanations follow the
    graph as written (each member of a fused chain keeps its capability, where the fused node has none).
    A topology not loaded from a file is taken as compiled (a fused node is then one stage: KernelSHAP)."""
    if not any(isinstance(n.component, FusedChain) for n in topology.nodes.values()):
        return topology
    try:
        written = load_spec(topology.source)
    except TopologyError:
        return topology
    spec = written.model_copy(update={"fuse": {}, "explain": topology.spec.explain or written.explain})
    return compile_spec(spec, source=topology.source)


def targets(topology: Topology) -> list[Target]:
    """The outputs the topology's ``explain:`` sections ask for: the topology's, then each node's."""
    topology = unfused(topology)
    out: list[Target] = []
    spec = topology.spec
    if spec.explain is not None:
        name = spec.explain.output or _first_float(topology, list(topology.outputs))
        src = topology.outputs.get(name)
        if src is None or src.node is None:
            raise ExplainError(f"explain.output: '{name}' is not an output of topology '{topology.name}' computed by "
                               f"one of its nodes (outputs: {', '.join(topology.outputs)})",
                               kind=ErrorKind.INVALID_TOPOLOGY)
        out.append(Target(name, src.node, src.tensor, spec.explain))
    for node_id, node_spec in spec.nodes.items():
        if node_spec.explain is None:
            continue
        node = topology.nodes[node_id]
        ports = list(node.component.outputs)
        port = node_spec.explain.output or _first_float_port(node)
        if port not in ports:
            raise ExplainError(f"node '{node_id}': explain.output '{port}' is not one of its output ports "
                               f"({', '.join(ports)})", kind=ErrorKind.INVALID_TOPOLOGY)
        out.append(Target(f"{node_id}.{port}", node_id, port, node_spec.explain))
    return out


def _first_float(topology: Topology, names: list[str]) -> str:
    for name in names:
        port = topology.outputs[name].port
        if port is not None and port.datatype.startswith("FP"):
            return name
    raise ExplainError(f"topology '{topology.name}' has no floating-point output to explain; name one with "
                       "explain.output", kind=ErrorKind.INVALID_TOPOLOGY)


def _first_float_port(node: Node) -> str:
    for name, port in node.component.outputs.items():
        if port.datatype.startswith("FP"):
            return name
    raise ExplainError(f"node '{node.id}' has no floating-point output port to explain; name one with "
                       "explain.output", kind=ErrorKind.INVALID_TOPOLOGY)


class Chain:
    """The nodes ``target`` depends on, composed; ``inputs`` are the topology inputs it reads, in order."""

    def __init__(self, topology: Topology, target: Target) -> None:
        topology = unfused(topology)
        self.topology = topology
        self.target = target
        self.nodes = _ancestors(topology, target.node)
        names: list[str] = []
        for node in self.nodes:
            for port, sources in node.bindings.items():
                src = _one_source(node, port, sources)
                if src.node is None and src.topic == topology.inputs_topic and src.tensor not in names:
                    names.append(src.tensor)
        if not names:
            raise ExplainError(f"'{target.name}' of topology '{topology.name}' reads none of the topology's inputs",
                               kind=ErrorKind.INVALID_TOPOLOGY)
        self.inputs = sorted(names)
        if target.spec.method == "integrated_gradients":  # asked for by name: every node must offer it
            for c in self.components:
                require(c, Differentiable, "be explained by integrated gradients",
                        "give it torch_forward or use explain.method kernel_shap (any component)")

    @property
    def components(self) -> list[Component]:
        return [n.component for n in self.nodes]

    def differentiable(self) -> bool:
        """Whether every node offers a torch twin (integrated gradients applies)."""
        return all(isinstance(c, Differentiable) for c in self.components)

    def setup(self) -> None:
        """Prepare and set up each node's component (the explainer holds its own copies)."""
        for c in self.components:
            c.prepare()
            c.setup()

    def close(self) -> None:
        for c in self.components:
            c.close()

    def _run(self, inputs: Mapping[str, Any], step: Any) -> Any:
        values: dict[tuple[str | None, str], Any] = {(None, n): inputs[n] for n in self.inputs}
        for node in self.nodes:
            ins = {port: values[(s.node, s.tensor)]
                   for port, sources in node.bindings.items() for s in [_one_source(node, port, sources)]}
            for port, value in step(node, ins).items():
                values[(node.id, port)] = value
        key = (self.target.node, self.target.port)
        if key not in values:
            raise ExplainError(f"node '{self.target.node}' gave no '{self.target.port}' to explain",
                               kind=ErrorKind.INVALID_INPUT)
        return values[key]

    def torch_fn(self, *tensors: Any) -> Any:
        """The target output from the inputs (torch tensors, in :attr:`inputs`' order), differentiably."""

        def step(node: Node, ins: dict[str, Any]) -> dict[str, Any]:
            component: Any = node.component
            return dict(component.torch_forward(ins))

        return self._run(dict(zip(self.inputs, tensors, strict=True)), step)

    def numpy_fn(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The target output from the inputs (arrays by name, each row one request) through ``process``."""
        rows = len(next(iter(inputs.values())))

        def step(node: Node, ins: dict[str, Any]) -> dict[str, Any]:
            ids = [f"explain-{i}" for i in range(rows)]
            batch = Batch({k: np.asarray(v) for k, v in ins.items()}, [1] * rows, ids)
            outputs, _, errors = read_result(node.component, node.component.process(batch), rows, node=node.id)
            if errors:
                raise ExplainError(f"node '{node.id}' failed on an explained row: {next(iter(errors.values()))}",
                                   kind=ErrorKind.COMPONENT_FAILURE)
            return outputs

        return np.asarray(self._run(dict(inputs), step))


def _one_source(node: Node, port: str, sources: tuple[Any, ...]) -> Any:
    if len(sources) != 1:
        raise ExplainError(f"node '{node.id}': port '{port}' reads one of several alternatives; explanations "
                           "follow a single path", kind=ErrorKind.INVALID_TOPOLOGY)
    return sources[0]


def _ancestors(topology: Topology, node_id: str) -> list[Node]:
    """``node_id`` and every node it reads from, directly or not, producers before consumers."""
    order: list[Node] = []
    seen: set[str] = set()

    def visit(nid: str, path: tuple[str, ...]) -> None:
        if nid in seen:
            return
        if nid in path:
            raise ExplainError(f"node '{nid}' is on a cycle; explanations need an acyclic path",
                               kind=ErrorKind.INVALID_TOPOLOGY)
        node = topology.nodes[nid]
        for src in node.sources:
            if src.node is not None and src.node in topology.nodes:
                visit(src.node, (*path, nid))
            elif src.node is None and src.topic != topology.inputs_topic:
                raise ExplainError(f"node '{nid}' reads '{src.ref}', another topology's output; explanations stop "
                                   "at this topology's inputs", kind=ErrorKind.INVALID_TOPOLOGY)
        seen.add(nid)
        order.append(node)

    visit(node_id, ())
    return order
