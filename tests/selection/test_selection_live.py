"""Model selection on a real broker: feedback POSTed to the gateway teaches an Exp3 selector, and a selector
worker killed with SIGKILL and restarted resumes the weights it learned, read back from its state topic."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fs_topics import read_to_end

from flowserve.client.http import AsyncHttpClient
from flowserve.gateway import Gateway, GatewaySettings
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import InlineHost, ProcessHost, create_topology_topics
from flowserve.runtime.worker import StageWorker
from flowserve.selection import selection_hooks
from flowserve.topology.graph import Topology, load_topology, load_topology_text

# broker-backed: tests/conftest.py marks these integration, the one marked slow below slow

TOKEN = "s3cret"
# three branches; only 'a' answers the truth (1) of every request sent here
YAML = """
name: NAME
partitions: 2
nodes:
  select:
    component: flowserve_components.selection:Exp3Selector
    params: {answers: [a.label, b.label, c.label], gamma: 0.2, eta: 0.2, context_header: X-User, seed: 3}
    inputs: {x: input.x}
  a: {component: selection_kit:Answer, params: {value: 1}, inputs: {x: select.arm0}}
  b: {component: selection_kit:Answer, params: {value: 2}, inputs: {x: select.arm1}}
  c: {component: selection_kit:Answer, params: {value: 3}, inputs: {x: select.arm2}}
  merge:
    component: flowserve.builtin:Identity
    params: {ports: {label: {datatype: INT64, shape: [-1]}}}
    join: {type: any}
    inputs: {label: [a.label, b.label, c.label]}
outputs:
  label: merge.label
"""


def _probabilities(log_weights: list[float], gamma: float = 0.2) -> np.ndarray:
    w = np.exp(np.asarray(log_weights) - max(log_weights))
    return (1 - gamma) * w / w.sum() + gamma / len(w)


async def _state(kafka: KafkaSettings, topology: Topology) -> dict[str, dict[str, Any]]:
    """The selector's state topic read back: the last value per key."""
    last = {r.key.decode(): json.loads(r.value) for r in
            await read_to_end(kafka, topology.state_topic("select"), topology.spec.partitions)}
    return last


async def _until(what: str, check: Callable[[], Any], timeout_s: float = 90.0) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy; fail naming ``what`` at the bound."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        await asyncio.sleep(0.1)  # polling period, not synchronisation
    raise AssertionError(f"timed out waiting for {what}")


async def _ready(client: AsyncHttpClient) -> None:
    await _until("the gateway to be ready", lambda: _ok(client))


async def _ok(client: AsyncHttpClient) -> bool:
    return (await client.get("/v2/health/ready")).status == 200


async def _teach(client: AsyncHttpClient, model: str, n: int, user: str) -> list[int]:
    """``n`` requests from ``user``, each followed by feedback that the truth is 1; returns the answers."""
    answers = []
    for i in range(n):
        rid = f"{user}-{uuid.uuid4().hex[:8]}-{i}"
        reply = await client.infer(model, {"x": np.zeros((1, 2), np.float32)}, request_id=rid, headers={"X-User": user})
        assert reply.status == 200, reply.error
        answers.append(int(reply.outputs()["label"][0]))
        body = json.dumps({"id": rid, "outputs": [{"name": "label", "datatype": "INT64", "shape": [1], "data": [1]}],
                           "parameters": {"context": user}}).encode()
        sent = await client.request("POST", f"/v2/models/{model}/feedback", body,
                                    {"Content-Type": "application/json"})
        assert sent.status == 202, sent.error
        assert sent.json() == {"id": rid, "accepted": True}
    return answers


async def test_feedback_through_the_gateway_changes_the_selectors_weights(kafka: KafkaSettings) -> None:
    topology = load_topology_text(YAML.replace("NAME", "sel" + uuid.uuid4().hex[:8]))
    host = InlineHost(topology, kafka, hooks=selection_hooks(kafka))
    await host.start()
    selector = next(w.component for w in host.workers if w.node.id == "select")
    try:
        async with Gateway([topology], kafka, GatewaySettings(port=0, tokens=[TOKEN])) as gateway, \
                AsyncHttpClient(gateway.url, token=TOKEN) as client:
            await _ready(client)
            answers = await _teach(client, topology.name, 40, "ann")
            await _until("the selector to learn from 40 feedback records", lambda: selector.rewards >= 40)
            rewarded = answers.count(1)
            assert rewarded > 0
            p = selector.probabilities("ann")
            assert p[0] > 0.6 and p[0] > p[1] and p[0] > p[2]
            np.testing.assert_allclose(selector.probabilities("bob"), [1 / 3] * 3)  # another context: untouched
            # the weights are in the state topic too (what a restarted worker reads)
            state = await _until("ann's weights in the state topic",
                                 lambda: _state_matches(kafka, topology, selector.weights.state("ann")))
            assert "position" in state
            # bad feedback is refused, saying why; feedback without the token is unauthorised
            path = f"/v2/models/{topology.name}/feedback"
            bad = await client.request("POST", path, b'{"id": "x"}')
            assert bad.status == 400 and "outputs" in (bad.error or "")
            unknown = await client.request("POST", path, json.dumps({"id": "x", "outputs": [
                {"name": "nope", "datatype": "INT64", "shape": [1], "data": [1]}]}).encode())
            assert unknown.status == 400 and "nope" in (unknown.error or "")
            async with AsyncHttpClient(gateway.url) as anonymous:
                assert (await anonymous.request("POST", path, b"{}")).status == 401
    finally:
        await host.stop()


async def _state_matches(kafka: KafkaSettings, topology: Topology, want: dict[str, Any]) -> dict[str, Any] | None:
    state = await _state(kafka, topology)
    got = state.get("context/ann")
    return state if got is not None and np.allclose(got["log_weights"], want["log_weights"]) else None


@pytest.mark.slow
async def test_a_killed_selector_worker_resumes_its_learned_weights(kafka: KafkaSettings,
                                                                     write_topology: Callable[[str], Path],
                                                                     tmp_path: Path) -> None:
    path = write_topology(YAML)
    topology = load_topology(path)
    await create_topology_topics(topology, kafka)
    procs = ProcessHost(path, topology, kafka, log_dir=tmp_path / "logs")
    procs.spawn("select")  # a `flowserve worker` process: selection hooks attached as in production
    branches = [StageWorker(topology, n, kafka) for n in ("a", "b", "c", "merge")]
    tasks = [asyncio.create_task(w.run()) for w in branches]
    try:
        async with Gateway([topology], kafka, GatewaySettings(port=0)) as gateway, \
                AsyncHttpClient(gateway.url) as client:
            await _ready(client)
            await _teach(client, topology.name, 30, "ann")
            learned = await _until("30 feedback records learned, in the state topic",
                                   lambda: _learned_from(kafka, topology, 30))
            procs.kill("select")  # SIGKILL: nothing is flushed on the way out
            procs.restart("select")
            # the restarted worker draws with the restored weights: its decisions record their probability
            rid = "after-restart"
            reply = await client.infer(topology.name, {"x": np.zeros((1, 2), np.float32)}, request_id=rid,
                                       headers={"X-User": "ann"},
                                       parameters={"timeout_ms": 120_000})
            assert reply.status == 200, reply.error
            decision = await _until("the restarted worker's decision", lambda: _decision(kafka, topology, rid))
            expected = _probabilities(learned["log_weights"])
            assert expected[0] > 0.6
            assert decision["p"] == pytest.approx(expected[decision["arm"]], abs=1e-6)
    finally:
        for w in branches:
            w.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        procs.stop()


async def _learned_from(kafka: KafkaSettings, topology: Topology, n: int) -> dict[str, Any] | None:
    """ann's state once the position says ``n`` feedback records were read, with nothing waiting."""
    state = await _state(kafka, topology)
    position, ann = state.get("position"), state.get("context/ann")
    if position is None or ann is None or sum(position["watermark"].values()) < n:
        return None
    return ann


async def _decision(kafka: KafkaSettings, topology: Topology, rid: str) -> dict[str, Any] | None:
    for rec in await read_to_end(kafka, topology.decisions_topic("select"), topology.spec.partitions):
        with contextlib.suppress(ValueError):
            doc = json.loads(rec.value)
            if doc.get("id") == rid:
                return doc
    return None
