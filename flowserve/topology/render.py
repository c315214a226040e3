"""The FBP graph of a topology as text, Mermaid or Graphviz DOT."""

from __future__ import annotations

from flowserve.component import Component
from flowserve.topology.fuse import Chain
from flowserve.topology.graph import Topology


def _kind(component: Component) -> str:
    """The component's class name; a fused chain's also lists its members."""
    name = type(component).__name__
    return f"{name}: {' -> '.join(component.members)}" if isinstance(component, Chain) else name


def _edges(topology: Topology) -> list[tuple[str, str, str]]:
    """(from, to, label) with 'input' and 'outputs' as the graph's ends."""
    edges: list[tuple[str, str, str]] = []
    for node in topology.nodes.values():
        for port, sources in node.bindings.items():
            for src in sources:
                origin = src.node or ("input" if src.ref.startswith("input.") else src.ref.rsplit(".", 1)[0])
                label = f"{src.tensor}→{port}" if src.tensor != port else port
                edges.append((origin, node.id, label))
        for src in node.triggers:
            edges.append((src.node or "input", node.id, f"trigger {src.tensor}"))
        for name, port in node.emits_outputs.items():
            edges.append((node.id, "outputs", f"{port}→{name}" if port != name else name))
    return edges


def to_text(topology: Topology) -> str:
    lines = [f"topology {topology.name} v{topology.version} ({topology.spec.partitions} partitions)",
             f"  inputs  {topology.inputs_topic}: " +
             ", ".join(f"{n} {p.datatype}{list(p.shape)}" for n, p in topology.inputs.items())]
    for node in topology.nodes.values():
        ins = ", ".join(f"{port}<-{'|'.join(s.ref for s in ss)}" for port, ss in node.bindings.items())
        join = f" join={node.join.type}/{node.join.window_ms}ms" if node.needs_join else ""
        trig = f" triggers={[s.ref for s in node.triggers]}" if node.triggers else ""
        lines.append(f"  node    {node.id} [{_kind(node.component)}] {ins}{join}{trig}")
        for port, topic in node.output_topics.items():
            lines.append(f"            {port} -> {topic}")
    lines.append(f"  outputs {topology.outputs_topic}: " +
                 ", ".join(f"{n}<-{s.ref}" for n, s in topology.outputs.items()))
    lines.append(f"  dead letters {topology.deadletter_topic}")
    return "\n".join(lines)


def to_mermaid(topology: Topology) -> str:
    lines = ["flowchart LR", "  input([input])", "  outputs([outputs])"]
    for node in topology.nodes.values():
        lines.append(f'  {node.id}["{node.id}<br/>{_kind(node.component)}"]')
    for a, b, label in _edges(topology):
        lines.append(f"  {a} -->|{label}| {b}")
    return "\n".join(lines)


def to_dot(topology: Topology) -> str:
    lines = [f'digraph "{topology.name}" {{', "  rankdir=LR;", '  input [shape=oval]; outputs [shape=oval];']
    for node in topology.nodes.values():
        lines.append(f'  "{node.id}" [shape=box, label="{node.id}\\n{_kind(node.component)}"];')
    for a, b, label in _edges(topology):
        lines.append(f'  "{a}" -> "{b}" [label="{label}"];')
    lines.append("}")
    return "\n".join(lines)


RENDERERS = {"text": to_text, "mermaid": to_mermaid, "dot": to_dot}
