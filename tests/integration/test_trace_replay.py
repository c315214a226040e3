"""Open-loop replay of a trace through a running topology, and recording it back from the inputs topic."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from flowserve.cli import main
from flowserve.client import TopologyClient
from flowserve.client.replay import replay
from flowserve.client.traffic import wait_ready
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology
from flowserve.tuning.traces import generate, load_trace

pytestmark = [pytest.mark.integration]

TOPOLOGY = """
name: NAME
partitions: 2
nodes:
  echo: {component: flowserve.builtin:Identity, params: {ports: {x: {datatype: FP32, shape: [-1, 4]}}},
         inputs: {x: input.x}}
outputs: {x: echo.x}
"""


async def test_replay_answers_every_request_and_record_gets_the_arrivals_back(
        kafka, write_topology, tmp_path: Path) -> None:
    topology = load_topology(write_topology(TOPOLOGY))
    trace = generate("poisson", rate=100, seconds=1.0, seed=4)
    xs = [np.full((1, 4), i, np.float32) for i in range(len(trace.arrivals))]
    async with InlineHost(topology, kafka), TopologyClient(topology, kafka) as client:
        await wait_ready(client, {"x": np.zeros((1, 4), np.float32)})
        report = await replay(client, trace.arrivals, lambda i: {"x": xs[i]}, timeout_ms=60_000)
    assert report.sent == len(trace.arrivals) > 50
    assert report.ok == report.sent and report.errors == report.timeouts == 0
    assert report.attainment(60.0) == 1.0
    assert np.all(report.latency_s > 0)
    out = tmp_path / "recorded.json"
    argv = ["trace", "record", str(topology.source), "--broker", kafka.bootstrap, "--out", str(out)]
    assert await asyncio.to_thread(main, argv) == 0  # the command runs its own event loop
    recorded = load_trace(out)
    # the readiness probes went to the inputs topic too
    assert len(recorded.arrivals) >= report.sent
    assert recorded.arrivals[0] == 0.0 and np.all(np.diff(recorded.arrivals) >= 0)
