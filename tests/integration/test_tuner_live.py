"""The tuner on a real broker: a stage gains a consumer when the rate steps up and loses it after the hold,
with every request answered exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from flowserve.capture.inspect import inspect_records
from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.topology import load_topology
from flowserve.tuning.plan import Plan, StageConfig, apply_plan, save_plan
from flowserve.tuning.tuner import Action, LocalScaler, tune

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# one emulated stage: batches of 4 take 68 ms on the "cpu" table, ~59 requests/s per consumer
TOPOLOGY = """
name: NAME
partitions: 4
deadline_ms: 120000
nodes:
  m:
    component: flowserve.builtin:Accelerator
    params: {model: resnet50, hardware: cpu, jitter: 0}
    inputs: {x: input.x}
outputs: {x: m.x}
"""


async def test_tuner_adds_a_consumer_on_a_step_and_removes_it_after_the_hold(
        kafka, write_topology, tmp_path: Path) -> None:
    path = write_topology(TOPOLOGY)
    base = load_topology(path)
    plan = Plan(base.name, slo_ms=400, partitions=4, hop_ms=5, stages={"m": StageConfig("cpu", 4, 1)})
    plan_path = save_plan(plan, tmp_path / "plan.json")
    topology = apply_plan(base, plan)
    host = ProcessHost(path, topology, kafka, log_dir=tmp_path / "logs", extra_args=["--plan", str(plan_path)])
    await create_topology_topics(topology, kafka)
    host.start_processes()
    actions: list[Action] = []
    scaled_up, back_to_one = asyncio.Event(), asyncio.Event()

    def on_action(action: Action) -> None:
        actions.append(action)
        if action.after > action.before:
            scaled_up.set()
        if action.after == 1:
            back_to_one.set()

    stop = asyncio.Event()
    futures: dict[str, asyncio.Future] = {}
    sent: dict[str, np.ndarray] = {}
    try:
        async with TopologyClient(topology, kafka) as client:
            await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=120)
            tuner = asyncio.create_task(tune(topology, plan, kafka, LocalScaler(host), stop=stop, hold_s=3,
                                             hysteresis=0.25, horizon_s=4, interval_s=0.5, on_action=on_action))

            async def send(rate: float, until: asyncio.Event, limit: int) -> None:
                """Open-loop at ``rate`` until ``until`` is set (or ``limit`` requests: the test then fails)."""
                for _ in range(limit):
                    if until.is_set():
                        return
                    rid = f"r{len(sent)}"
                    x = np.full((1, 4), len(sent), np.float32)
                    futures[rid] = client.expect(rid)
                    sent[rid] = x
                    await client.send({"x": x}, request_id=rid)
                    await asyncio.sleep(1.0 / rate)  # pacing the traffic, not waiting for a result

            await send(15, asyncio.Event(), 30)  # steady and low: no action
            assert actions == []
            await send(150, scaled_up, 3000)  # the step: the tuner must add consumers
            assert scaled_up.is_set(), "no scale-up after 3000 requests at 150/s"
            await send(150, asyncio.Event(), 150)  # the high rate goes on, now with more consumers
            peak = max(a.after for a in actions)
            assert peak >= 2 and all(a.after > a.before for a in actions), actions
            await send(15, back_to_one, 1000)  # back down: after the horizon and the hold, it removes them
            assert back_to_one.is_set(), f"not back to one consumer after 1000 requests at 15/s: {actions}"
            downs = actions[[a.after < a.before for a in actions].index(True):]
            assert all(a.after < a.before for a in downs) and downs[0].before == peak
            assert "below for" in downs[0].reason
            assert host.alive() == {"m": 1}
            stop.set()
            await tuner
            done, pending = await asyncio.wait(futures.values(), timeout=120)
            assert not pending, f"{len(pending)} of {len(futures)} requests never came back"
            for rid, future in futures.items():
                reply = future.result()
                assert reply.error is None, f"{rid}: {reply.error}"
                np.testing.assert_array_equal(reply.tensors["x"], sent[rid])
            assert client.duplicates == 0
        # every action is on the topology's actions topic too (flowserve ui shows them)
        published = await inspect_records(kafka, f"{topology.name}.actions", last=100, timeout_s=10)
        assert [(r.body["node"], r.body["action"]["consumers"]) for r in published] == \
            [(a.stage, [a.before, a.after]) for a in actions]
        assert {r.body["source"] for r in published} == {"tuner"}
    finally:
        stop.set()
        host.stop()
