"""The FBP graph of a topology as JSON for the page: nodes with their ports and topics, edges, a layout.

The layout is computed here, not in the browser: nodes are placed in layers by their longest path from
the topology's inputs (a Sugiyama-style layering without crossing reduction), which keeps the shipped
JavaScript to drawing SVG and stays readable for the tens of nodes a topology has.
"""

from __future__ import annotations

from typing import Any

from flowserve.topology.fuse import Chain
from flowserve.topology.graph import Topology

INPUT = "input"
OUTPUTS = "outputs"
#: layout grid, in SVG units: one column per layer, one row per node in it
COLUMN_W = 350
ROW_H = 120
#: a node's box (the page draws it this size)
NODE_W = 300  # room for a figure line with energy on it (flowserve run --energy)
NODE_H = 96


def node_kind(topology: Topology, node_id: str) -> str:
    """``stage``, ``fused`` (a chain of members in one worker) or ``side`` (nothing a caller waits for)."""
    node = topology.nodes[node_id]
    if isinstance(node.component, Chain):
        return "fused"
    return "stage" if topology.on_critical_path(node_id) else "side"


def edges(topology: Topology) -> list[dict[str, Any]]:
    """Edges ``{from, to, port, topic, kind}``; ``kind`` is ``data``, ``trigger`` or ``output``."""
    out: list[dict[str, Any]] = []
    for node in topology.nodes.values():
        for port, sources in node.bindings.items():
            for src in sources:
                out.append({"from": src.node or INPUT, "to": node.id, "port": port, "tensor": src.tensor,
                            "topic": src.topic, "kind": "data"})
        for src in node.triggers:
            out.append({"from": src.node or INPUT, "to": node.id, "port": src.tensor, "tensor": src.tensor,
                        "topic": src.topic, "kind": "trigger"})
    for name, src in topology.outputs.items():
        out.append({"from": src.node or INPUT, "to": OUTPUTS, "port": name, "tensor": src.tensor,
                    "topic": topology.outputs_topic, "kind": "output"})
    for node in topology.nodes.values():
        for name, port in node.emits_outputs.items():
            out.append({"from": node.id, "to": OUTPUTS, "port": name, "tensor": port,
                        "topic": topology.outputs_topic, "kind": "output"})
    return out


def layers(topology: Topology, graph_edges: list[dict[str, Any]]) -> dict[str, int]:
    """Each vertex's layer: the longest path from the inputs, ignoring back edges of cycles."""
    order = [INPUT, *topology.nodes, OUTPUTS]
    index = {v: i for i, v in enumerate(order)}  # nodes are in topological order where acyclic
    layer = dict.fromkeys(order, 0)
    for v in order[1:]:
        preds = [e["from"] for e in graph_edges if e["to"] == v and index.get(e["from"], -1) < index[v]]
        layer[v] = 1 + max((layer[p] for p in preds), default=0)
    layer[OUTPUTS] = max(layer.values()) if topology.nodes else 1
    if any(layer[v] == layer[OUTPUTS] for v in topology.nodes):
        layer[OUTPUTS] += 1
    return layer


def graph_view(topology: Topology) -> dict[str, Any]:
    """Everything the page draws that does not change while the topology runs."""
    graph_edges = edges(topology)
    layer = layers(topology, graph_edges)
    rows: dict[int, int] = {}
    position: dict[str, tuple[int, int]] = {}
    # side branches (drift detectors) below the path a request takes
    ordered = sorted(topology.nodes, key=lambda n: not topology.on_critical_path(n))
    for v in [INPUT, *ordered, OUTPUTS]:
        row = rows.get(layer[v], 0)
        rows[layer[v]] = row + 1
        position[v] = (layer[v] * COLUMN_W + 20, row * ROW_H + 20)
    nodes: list[dict[str, Any]] = [
        {"id": INPUT, "kind": "input", "label": topology.inputs_topic, "x": position[INPUT][0],
         "y": position[INPUT][1], "ports": {"out": list(topology.inputs)}},
        {"id": OUTPUTS, "kind": "outputs", "label": topology.outputs_topic, "x": position[OUTPUTS][0],
         "y": position[OUTPUTS][1], "ports": {"in": list(topology.outputs)}},
    ]
    for node in topology.nodes.values():
        component = node.component
        nodes.append({
            "id": node.id, "kind": node_kind(topology, node.id), "component": type(component).__name__,
            "members": list(component.members) if isinstance(component, Chain) else [],
            "join": node.join.type if node.needs_join else None, "replicas": node.replicas,
            "max_batch": node.max_batch, "x": position[node.id][0], "y": position[node.id][1],
            "ports": {"in": list(node.bindings), "out": list(node.output_topics)},
            "topics": dict(node.output_topics),
        })
    width = (max(layer.values()) + 1) * COLUMN_W + 40
    height = max(rows.values()) * ROW_H + 40
    return {"topology": topology.name, "version": topology.version, "partitions": topology.spec.partitions,
            "deadletter_topic": topology.deadletter_topic, "nodes": nodes, "edges": graph_edges,
            "width": width, "height": height, "node_w": NODE_W, "node_h": NODE_H}
