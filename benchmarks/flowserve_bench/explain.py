"""The cost of sampled explanations: ``flowserve bench explain`` (issue 39).

The digits topology twice, side by side, as ``flowserve run`` deploys it (worker processes and, where the
topology has an ``explain:`` section, the explainer in a niced process of its own): once without
explanations and once explaining a sampled share of requests (integrated gradients through its three
stages). They take a closed-loop load at saturation in turn, in interleaved slices over fresh deployments
(the capture bench's method, :mod:`flowserve_bench.capture`), so a slow stretch of the machine falls on
both alike. Throughput with explanations over without, with its 95% interval, and each process's CPU per
request: the explainer's is what sampling costs, on the same two cores as the pipeline.

Target ``explain_1pct_costs_le_5pct``: at a 1% sample, throughput at least 0.95 of without, read on the
interval's low end.

::

    flowserve bench explain --seconds 60
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.client import TopologyClient
from flowserve.client.traffic import prepare_to_drive
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology.graph import Topology, load_topology_text
from flowserve_bench import graphs, paired
from flowserve_bench.capture import (
    BLOCKS,
    SLICE_S,
    Deployment,
    in_blocks,
    sample_inputs,
    saturate,
    slice_count,
    warm,
)
from flowserve_bench.common import console, cpu_seconds, run_id
from flowserve_bench.paired import Slice

#: the sampled share the target is about
SAMPLE = 0.01
#: the throughput with explanations must be at least this share of without (the interval's low end)
FLOOR = 0.95


def topology(sample: float | None) -> tuple[str, Topology]:
    """``topologies/digits.yaml`` under a fresh name, explaining ``sample`` of its requests (None: no
    ``explain:`` section, so no explainer)."""
    changes: dict[str, Any] = {} if sample is None else {"explain": {"sample": sample}}
    text = graphs.text(graphs.EXAMPLES / "digits.yaml", f"expl{run_id()}", changes)
    return text, load_topology_text(text, source="bench")


def explain_targets(ratio: dict[str, Any]) -> dict[str, bool]:
    """The target, on the throughput ratio's 95% interval (``{"ratio": r, "95ci": [low, high]}``)."""
    return {"explain_1pct_costs_le_5pct": ratio["95ci"][0] >= FLOOR}


async def explain_bench(kafka: KafkaSettings, seconds: float = 60.0, slice_s: float = SLICE_S,
                        blocks: int = BLOCKS, sample: float = SAMPLE) -> dict[str, Any]:
    """``seconds`` of closed-loop load per side, in ``blocks`` fresh deployments of both sides."""
    inputs: list[dict[str, np.ndarray]] = sample_inputs(1000)
    prepare_to_drive(topology(None)[1])  # trains the model into the cache once, before anything is timed
    sides = {"off": functools.partial(topology, None), "sampled": functools.partial(topology, sample)}
    cpu: dict[str, dict[str, float]] = {label: {} for label in sides}

    async def ready(clients: dict[str, TopologyClient]) -> None:
        for client in clients.values():
            await warm(client, inputs)
            await saturate(client, inputs, slice_s)  # batch sizes and caches at load, not measured

    async def measure(label: str, deployment: Deployment) -> Slice:
        pids = deployment.pids()
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        piece = await saturate(deployment.client, inputs, slice_s)
        for name, pid in pids.items():
            cpu[label][name] = cpu[label].get(name, 0.0) + cpu_seconds(pid) - before[name]
        return piece

    with tempfile.TemporaryDirectory(prefix="fs-bench-explain-") as tmp:
        slices, block_of = await in_blocks(kafka, Path(tmp), sides, blocks, slice_count(seconds / blocks, slice_s),
                                           ready, measure)
    result: dict[str, Any] = {"workload": "explain", "sample": sample, "seconds": seconds, "slice_s": slice_s,
                              "blocks": blocks, **{label: paired.summary(s) for label, s in slices.items()}}
    ratio, low, high = paired.throughput_ratio(slices["sampled"], slices["off"], blocks=block_of)
    result["throughput_sampled_vs_off"] = {"ratio": ratio, "95ci": [low, high]}
    served = {label: max(1, sum(s.requests for s in slices[label])) for label in slices}
    result["cpu_us_per_request"] = {label: {name: round(t / served[label] * 1e6, 1) for name, t in sorted(c.items())}
                                    for label, c in cpu.items()}
    console.print(f"throughput, {sample:.0%} explained / none: {ratio:.3f} (95% interval {low:.3f}-{high:.3f})")
    for label, c in result["cpu_us_per_request"].items():
        console.print(f"CPU per request, {label:>7}: " + ", ".join(f"{k} {v:.0f}" for k, v in c.items()) + " us")
    return {**result, "ratios": {"throughput_sampled_vs_off": result["throughput_sampled_vs_off"]},
            "targets": explain_targets(result["throughput_sampled_vs_off"])}
