"""A many-model node behind the gateway: ``/v2/models/<model>/infer`` answered by that model, and the V2
repository API (index, load, unload) and ``flowserve models`` carried to the workers over the control topic."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from flowserve.cli import main
from flowserve.client.http import AsyncHttpClient
from flowserve.gateway import Gateway, GatewaySettings
from flowserve.kafka.settings import WorkerSettings
from flowserve.models import model_hooks
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology
from flowserve_components.many_models import offset

pytestmark = pytest.mark.integration

ZOO = """
name: NAME
partitions: 2
deadline_ms: 60000
nodes:
  zoo:
    component: flowserve_components.many_models:EmulatedModels
    inputs: {x: input.x}
    batching: {policy: lag}
    models: {count: 12, kind: resnet50, memory_mb: 320}
outputs: {y: zoo.y}
"""
X = np.array([[1, 2, 3, 4]], np.float32)


async def _until(http: AsyncHttpClient, model: str, state: str) -> list[dict[str, Any]]:
    """The index once ``model`` shows ``state`` (workers report every 0.2 s here); fails after 60 s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        index = (await http.request("POST", "/v2/repository/index", b"{}")).json()
        if {m["name"]: m["state"] for m in index}.get(model) == state:
            return index
        assert loop.time() < deadline, f"model '{model}' never showed {state}: {index}"
        await asyncio.sleep(0.2)  # polling the index, as a caller would: no synchronisation with the worker


async def test_the_gateway_serves_each_model_and_its_repository(kafka, write_topology, capsys) -> None:
    path = write_topology(ZOO)
    topology = load_topology(path)
    settings = WorkerSettings(metrics_interval_s=0.2)
    async with InlineHost(topology, kafka, settings, hooks=model_hooks(kafka, settings)), \
            Gateway([topology], kafka, GatewaySettings(port=0)) as gateway, AsyncHttpClient(gateway.url) as http:
        deadline = asyncio.get_running_loop().time() + 120
        while (first := await http.infer("m-00003", {"x": X})).status != 200:  # groups still forming
            assert asyncio.get_running_loop().time() < deadline, f"no answer within 120 s: {first.json()}"
        assert first.json()["model_name"] == "m-00003", first.json()
        await _until(http, topology.name, "READY")  # its stage's consumer group has settled
        np.testing.assert_array_equal(first.outputs()["y"], X + np.float32(offset("m-00003")))
        other = await http.infer("m-00011", {"x": X})
        assert other.json()["model_name"] == "m-00011", other.json()
        np.testing.assert_array_equal(other.outputs()["y"], X + np.float32(offset("m-00011")))
        assert (await http.get("/v2/models/m-00011")).json()["name"] == "m-00011"
        assert (await http.infer("m-99999", {"x": X})).status == 404

        index = await _until(http, "m-00003", "READY")
        states = {m["name"]: m["state"] for m in index}
        assert len(states) == 13
        assert states["m-00005"] == "UNAVAILABLE"
        ready = (await http.request("POST", "/v2/repository/index", b'{"ready": true}')).json()
        assert all(m["state"] == "READY" for m in ready) and {"m-00003", "m-00011"} <= {m["name"] for m in ready}

        assert (await http.request("POST", "/v2/repository/models/m-00005/load")).status == 200
        await _until(http, "m-00005", "READY")
        assert (await http.request("POST", "/v2/repository/models/m-00005/unload")).status == 200
        await _until(http, "m-00005", "UNAVAILABLE")
        missing = await http.request("POST", "/v2/repository/models/m-99999/load")
        assert missing.status == 404 and "m-99999" in missing.json()["error"]
        whole = await http.request("POST", f"/v2/repository/models/{topology.name}/unload")
        assert whole.status == 400 and whole.json()["kind"] == "invalid_input"

        # the same through the command line
        broker = kafka.bootstrap
        assert await asyncio.to_thread(main, ["models", "load", str(path), "m-00007", "--broker", broker]) == 0
        await _until(http, "m-00007", "READY")
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["models", "list", str(path), "--broker", broker, "--json"]) == 0
        listed = {m["name"]: m for m in json.loads(capsys.readouterr().out.strip().splitlines()[-1])}
        assert listed["m-00007"]["state"] == "READY" and listed["m-00007"]["loads"] >= 1
        assert listed["m-00003"]["answers"] == 1
        assert await asyncio.to_thread(main, ["stats", str(path), "--broker", broker]) == 0
        assert "busiest of" in capsys.readouterr().out  # the per-model table of flowserve stats
        assert await asyncio.to_thread(main, ["stats", str(path), "--broker", broker, "--json"]) == 0
        (snap,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert snap["counters"]["model/m-00003/answers"] == 1 and snap["counters"]["model_loads"] >= 3
