"""The ``parity:`` section of a node (ParM coded redundancy) and the parity model node it adds.

The section's model (:class:`ParitySpec`, offered here for the parity feature) is a plain spec in spec.py.

A node opts in::

    model:
      component: flowserve_components.torch_stage:TorchClassifier
      params: {model: digits-mlp}
      inputs: {x: pre.x}
      parity:
        k: 2                      # requests per parity group (any k of the k+1 outputs suffice)
        params: {parity_k: 2}     # laid over the node's params: TorchClassifier loads its parity model
        encoder: sum              # the parity query: the sum of the k inputs (or concat, for images)
        wait_ms: 20               # a group still open after this is given up (its requests never wait)

The compiler then adds the parity model node ``<node>-parity``: the protected node's component class
configured with its params updated by ``params:`` (or ``component:`` with ``params:``), reading the parity
queries on ``<base>.<node>.parity`` and writing ``<base>.<node>-parity.<port>``, with its own consumer
group and ``replicas`` worker processes. Checks name the node and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flowserve.component import Component, Port, load_component_class
from flowserve.errors import ComponentError, TopologyError
from flowserve.topology import names
from flowserve.topology.node import Node, Source
from flowserve.topology.spec import ParitySpec

__all__ = ["SUMMABLE", "ConcatLayout", "ParitySpec", "concat_layout", "parity_node", "readers_of"]

#: datatypes whose values can be summed and differenced exactly enough for decoding.
SUMMABLE = frozenset({"FP16", "FP32", "FP64"})


@dataclass(frozen=True, slots=True)
class ConcatLayout:
    """How the concat encoder tiles k images into one: ``rows`` x ``cols`` tiles, each an image shrunk
    ``rows`` times in height and ``cols`` times in width by averaging blocks; slots past k stay zero."""

    rows: int
    cols: int
    channels: int
    height: int
    width: int


def concat_layout(k: int, features: int, image: tuple[int, int] | None) -> ConcatLayout:
    """The layout for groups of ``k`` rows of ``features`` values; ValueError says why there is none.

    The grid is ``ceil(k / c)`` x ``c`` with ``c = ceil(sqrt(k))``: k = 2 puts two half-width images side by
    side (each keeps its full height), k = 3 and 4 a 2 x 2 grid of half-size images.
    """
    cols = math.isqrt(k - 1) + 1
    rows = -(-k // cols)
    if image is None:
        side = math.isqrt(features)
        if side * side != features:
            raise ValueError(f"rows of {features} values are not a square image; give 'image: [height, width]'")
        image = (side, side)
    height, width = image
    if height <= 0 or width <= 0 or features % (height * width):
        raise ValueError(f"rows of {features} values do not hold whole {height}x{width} images")
    if height % rows or width % cols:
        raise ValueError(f"k={k} tiles {rows}x{cols} images into one, so the height must be a multiple of {rows} "
                         f"and the width of {cols}; the image is {height}x{width}")
    return ConcatLayout(rows, cols, features // (height * width), height, width)


def _summable(node_id: str, what: str, ports: Mapping[str, Port], source: str) -> None:
    for name, port in ports.items():
        if port.datatype not in SUMMABLE:
            raise TopologyError(
                f"parity: {what} port '{name}' is {port.datatype}, which cannot be summed; protect a node "
                f"whose {what}s are floating point ({', '.join(sorted(SUMMABLE))}), e.g. the model before "
                "its post-processing",
                source=source, node=node_id,
            )


def parity_node(node: Node, spec: ParitySpec, node_params: Mapping[str, Any], base: str, partitions: int,
                source: str, taken: set[str]) -> Node:
    """Check parity-protected ``node`` and build its parity model node."""
    nid = node.id
    pid = names.parity_node(nid)
    if pid in taken:
        raise TopologyError(f"parity: the parity model node would be named '{pid}', which is taken; "
                            "rename that node", source=source, node=nid)
    comp = node.component
    if partitions < spec.k:
        raise TopologyError(
            f"parity: k={spec.k} needs at least {spec.k} partitions (a group's members come from different "
            f"partitions, read by different workers), the topology has {partitions}; raise 'partitions'",
            source=source, node=nid)
    if len(node.bindings) != 1 or node.triggers or node.needs_join:
        raise TopologyError(
            "parity: a protected node must read one input port from one node, without joins or triggers "
            "(the encoder runs in the workers of the node that feeds it); protect a single-input node",
            source=source, node=nid)
    ((port, (src,)),) = node.bindings.items()
    if src.node is None:
        raise TopologyError(
            f"parity: input '{src.ref}' comes from outside the topology's nodes, but the encoder runs in the "
            "workers of the node that feeds the protected one; put a node (e.g. a normalizer) before it",
            source=source, node=nid)
    if node.emits_outputs or not node.output_topics:
        raise TopologyError(
            "parity: a protected node's outputs must be read by other nodes (they drop a late duplicate "
            "of a reconstructed output); add a node after it rather than writing the outputs from it",
            source=source, node=nid)
    _summable(nid, "input", comp.inputs, source)
    if spec.encoder == "concat":
        shape = comp.inputs[port].shape
        features = math.prod(shape[1:])
        try:
            if len(shape) < 2 or features <= 0:
                raise ValueError(f"input port '{port}' has shape {list(shape)}: rows of a fixed size are needed")
            concat_layout(spec.k, features, spec.image)
        except ValueError as exc:
            raise TopologyError(f"parity: the concat encoder cannot encode this input: {exc}", source=source,
                                node=nid) from None
    _summable(nid, "output", {p: comp.outputs[p] for p in node.output_topics}, source)
    try:
        if spec.component:  # another component: its own params only
            parity: Component = load_component_class(spec.component).configure(dict(spec.params), node=pid)
        else:
            parity = type(comp).configure({**node_params, **spec.params}, node=pid)
    except ComponentError as exc:
        raise TopologyError(f"parity model: {exc}", source=source, node=nid) from None
    for kind, mine, theirs in (("input", comp.inputs, parity.inputs), ("output", comp.outputs, parity.outputs)):
        for name, want in mine.items():
            got = theirs.get(name)
            why = "missing" if got is None else want.compatible(got)
            if why:
                raise TopologyError(
                    f"parity model {type(parity).__name__}: its {kind} port '{name}' does not match the "
                    f"protected node's ({why}); give a parity component with the same ports",
                    source=source, node=nid)
    query = Source(names.parity_query_topic(base, nid), port, None, f"{nid}.{names.PARITY}", comp.inputs[port])
    return Node(
        id=pid,
        component=parity,
        bindings={port: (query,)},
        triggers=(),
        join=node.join,
        max_batch=node.max_batch,
        replicas=spec.replicas,
        output_topics={p: names.parity_output_topic(base, nid, p) for p in node.output_topics},
    )


def readers_of(nodes: Mapping[str, Node], protected: str) -> dict[str, set[str]]:
    """node id -> the protected node's output topics it reads (where late duplicates are dropped)."""
    out: dict[str, set[str]] = {}
    for node in nodes.values():
        for src in node.sources:
            if src.node == protected:
                out.setdefault(node.id, set()).add(src.topic)
    return out
