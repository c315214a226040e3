"""The placement agent: re-places a topology's models as their popularity shifts, and says so.

Beside whatever routes requests to a many-model node (the gateway: ``flowserve gateway`` attaches one per
topology with a ``models:`` node), every ``interval_s`` the agent counts the node's live workers (their
metrics snapshots of the last :data:`LIVE_AGE_S`), has the :class:`~flowserve.models.routing.ModelRouter`
place again from the requests it routed, and publishes

- each change on the topology's actions topic (``source: placement``; ``flowserve ui`` lists it):
  ``{"model", "workers", "partitions", "before", "share", "reason"}``;
- the placement itself on the metrics topic, as a snapshot of role ``placement`` keyed
  ``placement/<node>/<instance>``, which ``flowserve stats`` and ``flowserve ui`` show beside the
  workers' per-model counts: the node's workers and partitions, and each model on more than one worker.

Publishing is best effort, as the workers' metrics: a record the broker does not take is logged, and
routing goes on with the placement the router has.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Sequence
from typing import Any

from flowserve.kafka.admin import ensure_topics
from flowserve.kafka.clients import make_producer
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.models.routing import ModelRouter, PlacementChange
from flowserve.runtime.metrics import LIVE_AGE_S, PLACEMENT_ROLE, read_snapshots
from flowserve.topology.graph import Topology
from flowserve.wire.envelope import now_ms

log = logging.getLogger("flowserve.models")


def live_workers(snaps: Sequence[dict[str, Any]], node: str, now: int) -> int:
    """Workers of ``node`` whose latest snapshot is at most :data:`LIVE_AGE_S` old."""
    return sum(1 for s in snaps if s.get("node") == node and s.get("role") != PLACEMENT_ROLE
               and now - int(s.get("ts_ms", 0)) <= LIVE_AGE_S * 1000)


class PlacementAgent:
    """Re-places the models of ``topology``'s many-model node ``node`` through ``router`` every
    ``interval_s`` (see the module's doc). ``await start()``, then ``await stop()``."""

    def __init__(self, topology: Topology, node: str, kafka: KafkaSettings, *, instance: str = "agent",
                 interval_s: float = 5.0, router: ModelRouter | None = None, hot_share: float = 0.2) -> None:
        self.topology = topology
        self.node = node
        self.kafka = kafka
        self.instance = instance
        self.interval_s = interval_s
        self.router = router or ModelRouter(topology.spec.partitions, hot_share=hot_share)
        #: every change published (or tried), oldest first
        self.changes: list[PlacementChange] = []
        self._producer = make_producer(kafka, WorkerSettings(acks=1), max_message_bytes=1 << 20)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await ensure_topics(self.kafka, [self.topology.actions_topic, self.topology.metrics_topic],
                            self.topology.spec.partitions)
        await self._producer.start()
        self._task = asyncio.create_task(self._loop(), name=f"placement-{self.topology.name}-{self.node}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._producer.stop()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)  # the placement's period, not synchronisation
            try:
                await self.round()
            except Exception as exc:  # noqa: BLE001 - a broker hiccup must not end placement: the next round tries
                log.warning("placement of %s/%s: %r", self.topology.name, self.node, exc)

    async def round(self) -> list[PlacementChange]:
        """Count the live workers, place again, publish; the changes."""
        snaps = await read_snapshots(self.topology, self.kafka, timeout_s=5.0)
        workers = live_workers(snaps, self.node, now_ms()) or self.router.workers
        changes = self.router.replace(workers)
        for change in changes:
            log.info("placement of %s/%s: model %s on workers %s (partitions %s): %s", self.topology.name,
                     self.node, change.model, change.workers, change.partitions, change.reason)
            self.changes.append(change)
            body = {"ts_ms": now_ms(), "source": PLACEMENT_ROLE, "node": self.node,
                    "action": change.as_action()}
            await self._send(self.topology.actions_topic, change.model, body)
        await self._send(self.topology.metrics_topic, f"{PLACEMENT_ROLE}/{self.node}/{self.instance}",
                         self.snapshot())
        return changes

    def snapshot(self) -> dict[str, object]:
        """The placement as a metrics-topic snapshot (module doc)."""
        return {"topology": self.topology.name, "role": PLACEMENT_ROLE, "node": "",
                "worker": f"{PLACEMENT_ROLE}/{self.node}/{self.instance}", "ts_ms": now_ms(), "placement": {
                    "node": self.node, "workers": self.router.workers, "partitions": self.router.partitions,
                    "models": self.router.placed()}}

    async def _send(self, topic: str, key: str, body: dict[str, object]) -> None:
        try:
            await asyncio.wait_for(self._producer.send_and_wait(topic, json.dumps(body).encode(), key=key.encode()),
                                   10.0)
        except Exception as exc:  # noqa: BLE001 - best effort, as the workers' metrics
            log.warning("placement of %s/%s: not published to %s: %r", self.topology.name, self.node, topic, exc)


def placement_agents(topologies: Sequence[Topology], kafka: KafkaSettings, *, instance: str = "agent",
                     interval_s: float = 5.0) -> dict[str, PlacementAgent]:
    """Topology name -> an agent for its many-model node (the first, where it has several: a request keeps
    its partition through the pipeline, so one placement decides for the whole topology)."""
    agents = {}
    for t in topologies:
        node = next((n.id for n in t.nodes.values() if n.models is not None), None)
        if node is not None:
            agents[t.name] = PlacementAgent(t, node, kafka, instance=instance, interval_s=interval_s)
    return agents
