"""``flowserve profile``: execution time per batch size of each node, measured offline, saved as JSON.

Sweeps batch sizes 1, 2, 4, ... up to the node's ``max_batch`` by calling the component's ``process``
directly (no broker). Inputs are realistic when the topology has a ``sample`` function: its requests
are pushed through the nodes in topological order, so every node sees what its upstream produces;
otherwise (or where that fails) they are zeros of the port shapes. The result goes beside the topology
(``topologies/digits.yaml`` -> ``topologies/digits.profile.json``) and workers load it at start
(see :mod:`flowserve.runtime.batching`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.component import Batch, Component, Port, Result
from flowserve.errors import FlowserveError
from flowserve.runtime.profiles import profile_path, save_profiles, sizes_to_profile
from flowserve.topology.graph import Topology, load_topology
from flowserve.wire.tensors import DATATYPES


@dataclass
class SizeTiming:
    size: int
    runs: int
    p50_s: float
    p99_s: float


def zeros_for(ports: dict[str, Port], rows: int) -> dict[str, np.ndarray]:
    """Zeros of each port's shape with ``rows`` rows (other variable dimensions become 1)."""
    out: dict[str, np.ndarray] = {}
    for name, port in ports.items():
        shape = (rows, *(d if d > 0 else 1 for d in port.shape[1:]))
        if port.datatype == "BYTES":
            out[name] = np.full(shape, b"", dtype=object)
        else:
            out[name] = np.zeros(shape, dtype=DATATYPES[port.datatype])
    return out


def sample_inputs(topology: Topology, n: int) -> dict[str, dict[str, np.ndarray]]:
    """Per node, ``n`` requests' worth of realistic inputs (empty when the topology has no sampler)."""
    if not topology.spec.sample:
        return {}

    requests, _ = topology.sampler()(n)
    if not requests:
        return {}
    inputs = {name: np.concatenate([r[name] for r in requests]) for name in requests[0]}
    produced: dict[str, dict[str, np.ndarray]] = {}
    per_node: dict[str, dict[str, np.ndarray]] = {}
    for node_id, node in topology.nodes.items():
        tensors: dict[str, np.ndarray] = {}
        for port, sources in node.bindings.items():
            for src in sources:
                data = inputs.get(src.tensor) if src.node is None else produced.get(src.node, {}).get(src.tensor)
                if data is not None:
                    tensors[port] = data
                    break
        rows = {a.shape[0] for a in tensors.values()}
        if len(tensors) != len(node.bindings) or len(rows) != 1:
            continue
        per_node[node_id] = tensors
        try:
            result = node.component.process(Batch(tensors, [1] * rows.pop(), [str(i) for i in range(n)]))
        except Exception:  # noqa: BLE001, S112 - downstream nodes fall back to zeros
            continue
        outputs = result.outputs if isinstance(result, Result) else result
        produced[node_id] = {k: np.asarray(v) for k, v in outputs.items()}
    return per_node


def _rows(tensors: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    out = {}
    for port, array in tensors.items():
        reps = -(-size // array.shape[0])
        out[port] = np.concatenate([array] * reps)[:size] if reps > 1 else array[:size]
    return out


def time_sizes(component: Component, tensors: dict[str, np.ndarray], sizes: list[int], *,
               repeats: int = 30, seconds_per_size: float = 2.0) -> list[SizeTiming]:
    """Time ``process`` at each batch size (two warm-up calls, then up to ``repeats`` timed ones)."""
    timings = []
    for size in sizes:
        batch = Batch(_rows(tensors, size), [1] * size, [str(i) for i in range(size)])
        for _ in range(2):
            component.process(batch)
        runs: list[float] = []
        stop = time.perf_counter() + seconds_per_size
        while len(runs) < repeats and (len(runs) < 5 or time.perf_counter() < stop):
            t0 = time.perf_counter()
            component.process(batch)
            runs.append(time.perf_counter() - t0)
        timings.append(SizeTiming(size, len(runs), float(np.percentile(runs, 50)), float(np.percentile(runs, 99))))
    return timings


def profile_topology(path: str | Path, node: str | None = None, *, max_batch: int | None = None,
                     repeats: int = 30, out: str | Path | None = None) -> tuple[Path, dict[str, list[SizeTiming]]]:
    """Profile one node (or every node) of the topology at ``path``; returns the file and the timings."""
    topology = load_topology(path)
    targets = [node] if node else list(topology.spec.nodes)
    for n in targets:
        if n not in topology.spec.nodes:
            raise FlowserveError(f"topology '{topology.name}' has no node '{n}' "
                                 f"(nodes: {', '.join(topology.spec.nodes)})")
    components = [n.component for n in topology.nodes.values()]
    for c in components:
        c.prepare()
        c.setup()
    try:
        biggest = max(min(topology.nodes[n].max_batch, max_batch or 1 << 30) for n in targets)
        samples = sample_inputs(topology, min(biggest, 512))
        results: dict[str, list[SizeTiming]] = {}
        entries: dict[str, dict[str, Any]] = {}
        device = "cpu"
        for n in targets:
            graph_node = topology.nodes[n]
            component = graph_node.component
            device = component.device
            top = min(graph_node.max_batch, max_batch or graph_node.max_batch)
            tensors = samples.get(n) or zeros_for(component.inputs, 1)
            timings = time_sizes(component, tensors, sizes_to_profile(top), repeats=repeats)
            results[n] = timings
            entries[n] = {"p99_s": {str(t.size): t.p99_s for t in timings},
                          "p50_s": {str(t.size): t.p50_s for t in timings},
                          "runs": {str(t.size): t.runs for t in timings},
                          "device": device, "inputs": "sample" if n in samples else "zeros"}
    finally:
        for c in components:
            c.close()
    target = Path(out) if out else profile_path(path)
    save_profiles(target, entries, topology=topology.name, device=device)
    return target, results
