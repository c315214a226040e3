"""``flowserve bench gateway --against URL`` end to end, against a second flowserve gateway (a V2 server
that needs no install), on a real broker: the command runs with a plan made at its start, both sides answer,
the last line is JSON."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from flowserve.gateway import Gateway, GatewaySettings
from flowserve.topology import load_topology

ECHO = """\
name: NAME
nodes:
  echo:
    component: flowserve.builtin:Identity
    params: {ports: {x: {datatype: FP32, shape: [-1, 4]}}}
    inputs: {x: input.x}
outputs: {x: echo.x}
sample: flowserve.builtin:emulated_sample
"""


@pytest.mark.asyncio(loop_scope="session")
async def test_against_a_second_gateway(broker: Any, write_topology: Any, tmp_path: Path) -> None:
    kafka = broker.settings()
    path = write_topology(ECHO)
    # the other side: a gateway in this process serving the same topology (the bench's workers answer both)
    async with Gateway([load_topology(path)], kafka, GatewaySettings(port=0)) as other:
        env = {**os.environ, "FLOWSERVE_FETCH_MAX_WAIT_MS": str(kafka.fetch_max_wait_ms),
               "FLOWSERVE_IDEMPOTENCE": "1" if kafka.idempotence else "0"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "flowserve", "bench", "gateway", "--broker", kafka.bootstrap,
            "--against", other.url, "--topology", f"{path}:auto", "--levels", "2", "--rates", "20",
            "--rounds", "2", "--slice-seconds", "0.3", "--warm-max-seconds", "2", cwd=tmp_path, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, err.decode()[-3000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["targets"] == {}  # each target reads a digits or image topology; this run deployed neither
    (run,) = result["brokers"]["given"]
    # the plan flowserve plan made at the bench's start, applied to the workers: one stage, nothing to fuse
    assert run["plan"]["fuse"] == {} and set(run["plan"]["stages"]) == {"echo"}
    assert run["encoding"] == {"flowserve": "json", "other": "json"}
    assert [row["load"] for row in run["loads"]] == ["c2", "poisson20"]
    for row in run["loads"]:
        for side in ("flowserve", "other"):
            assert row[side]["n"] > 0 and row[side]["errors"] == 0, row
        assert len(row["throughput_ratio"]) == 3 and len(row["p99_ratio"]) == 3
        assert row["paired_slices"] == 2 and row["flowserve"]["empty_slices"] == row["other"]["empty_slices"] == 0
        cpu = row["flowserve"]["cpu_us_per_request"]
        assert {"loadgen", "gateway", "worker:echo", "broker", "other"} <= cpu.keys()
        # /proc counts CPU in 10-ms ticks: an echo worker at 20 req/s for 0.6 s may not reach one tick
        assert cpu["gateway"] >= 0 and cpu["worker:echo"] >= 0
    assert sum(r["flowserve"]["cpu_us_per_request"]["gateway"] for r in run["loads"]) > 0
    # open loop: both sides of each pair replay the same arrivals, so with every call answered they answer
    # exactly as many requests
    poisson = run["loads"][1]
    assert poisson["flowserve"]["n"] == poisson["other"]["n"]
