"""faust hosts stage workers: control-topic commands reach every worker process; stop is graceful."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.control.faust_host import handle_command, send_command
from flowserve.runtime.host import ProcessHost
from flowserve.runtime.worker import StageWorker
from flowserve.topology import load_topology

pytestmark = pytest.mark.integration

TOPOLOGY = """
name: NAME
partitions: 2
nodes:
  a: {component: fs_testkit:AddOne, inputs: {x: input.x}}
outputs: {y: a.x}
"""


async def test_commands_pause_and_resume_a_worker(kafka, write_topology) -> None:
    topology = load_topology(write_topology(TOPOLOGY))
    worker = StageWorker(topology, "a", kafka)
    await worker.start()
    try:
        assert handle_command(worker, {"command": "pause"}) == "pause"
        assert worker.paused
        assert handle_command(worker, {"command": "resume", "node": "other"}) == "not for this node"
        assert worker.paused
        assert handle_command(worker, {"command": "resume", "node": "a"}) == "resume"
        assert not worker.paused
        assert handle_command(worker, {"command": "explode"}) == "ignored"
        assert handle_command(worker, "not a dict") == "ignored"
        assert handle_command(worker, {"command": "pause", "ts": 5}, since_ms=10) == "older than this worker"
        assert not worker.paused
    finally:
        await worker.close()


async def test_stop_command_ends_faust_hosted_worker_gracefully(kafka, write_topology, tmp_path: Path) -> None:
    path = write_topology(TOPOLOGY)
    topology = load_topology(path)
    host = ProcessHost(path, topology, kafka, log_dir=tmp_path / "logs")
    await host.start()
    try:
        async with TopologyClient(topology, kafka) as client:
            await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=120)
        proc = host.procs["a"][0]
        await send_command(topology, kafka, "stop", node="a")
        code = await asyncio.to_thread(proc.wait, 60)
        assert code == 0
        log = (tmp_path / "logs" / "a-0.log").read_text()
        assert "node a: stop" in log
    finally:
        host.stop()
