"""Commands to a topology's workers, on its control topic (one partition, so every worker sees them in order).

Each command is a JSON object with a ``command`` field and the ``node`` it is for. A worker's feature
follows the topic with a :class:`ControlFollower` and acts on the commands of its kind (``version``:
:mod:`flowserve.learning`; ``model``: load or unload one model of a many-model node, :mod:`flowserve.models`).
Callers write them with :func:`send_command`: the gateway's repository API, the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal

from aiokafka import AIOKafkaProducer, TopicPartition

from flowserve.kafka.admin import ensure_topics
from flowserve.kafka.clients import make_consumer
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.topology.graph import Topology
from flowserve.wire.envelope import now_ms

log = logging.getLogger("flowserve.kafka.control")

#: the broker wait of a follower's fetches (ms): commands are rare and may wait half a second, and long
#: waits keep an idle follower nearly free
FOLLOW_WAIT_MS = 500

#: the ``command`` of a model load or unload
MODEL_COMMAND = "model"
ModelAction = Literal["load", "unload"]


def model_command(node: str, model: str, action: ModelAction) -> dict[str, Any]:
    """The command that tells every worker of many-model ``node`` to load (or unload) ``model``."""
    return {"command": MODEL_COMMAND, "node": node, "model": model, "action": action, "ts": now_ms()}


def model_action(body: Mapping[str, Any]) -> tuple[str, ModelAction] | None:
    """``(model, action)`` of a model command's body; None when either is missing or not one we know."""
    model, action = body.get("model"), body.get("action")
    if not isinstance(model, str) or action not in ("load", "unload"):
        return None
    return model, action


def read_command(value: bytes | None, command: str, node: str) -> dict[str, Any] | None:
    """The body of ``value`` when it is a ``command`` for ``node``; None for anything else (another
    command, another node, not a JSON object)."""
    try:
        body = json.loads(value or b"")
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("command") != command or body.get("node") != node:
        return None
    return body


class ControlFollower:
    """Follows ``topology``'s control topic for the ``command``s to ``node``, from the topic's end.

    A worker acts on the commands sent while it runs; what it must resume after a restart it reads at
    start from where the state lives (the registry's live version, say). ``on_ready`` is called once the
    follower has its position, so the feature can look once more for what was sent before it (nothing
    later is missed). ``on_command`` gets each command's body on the event loop: it should only note the
    command, for the feature's hook to apply between two batches (:meth:`StageHooks.after_step`).

    On an error the follower logs it and stops: the worker goes on serving, without commands.
    :meth:`stop` ends it within one fetch wait (:data:`FOLLOW_WAIT_MS`).
    """

    def __init__(self, topology: Topology, kafka: KafkaSettings, settings: WorkerSettings, *, command: str,
                 node: str, on_command: Callable[[dict[str, Any]], None],
                 on_ready: Callable[[], None] | None = None) -> None:
        self.topology = topology
        self.kafka = kafka
        self.settings = settings
        self.command = command
        self.node = node
        self.on_command = on_command
        self.on_ready = on_ready
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start following, on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._follow(),
                                                            name=f"control-{self.command}-{self.node}")

    def stop(self) -> None:
        self._stop.set()

    async def _follow(self) -> None:
        settings = self.settings.model_copy(update={"fetch_max_wait_ms": FOLLOW_WAIT_MS})
        consumer = make_consumer(self.kafka, settings, group_id=None, client_id=f"fs-{self.node}-{self.command}s",
                                 max_message_bytes=self.topology.spec.max_message_bytes)
        try:
            await consumer.start()
            tp = TopicPartition(self.topology.control_topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_end(tp)
            await consumer.position(tp)
            if self.on_ready is not None:
                self.on_ready()
            while not self._stop.is_set():
                fetched = await consumer.getmany(tp, timeout_ms=FOLLOW_WAIT_MS, max_records=100)
                for record in fetched.get(tp, []):
                    body = read_command(record.value, self.command, self.node)
                    if body is not None:
                        self.on_command(body)
        except Exception as exc:  # noqa: BLE001 - without commands the node still serves: say so
            log.error("node %s: %s commands no longer followed: %r", self.node, self.command, exc)
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()


async def send_command(topology: Topology, kafka: KafkaSettings, body: dict[str, Any]) -> None:
    """Write ``body`` to ``topology``'s control topic (created if missing); returns once the broker has it."""
    await ensure_topics(kafka, [topology.control_topic], 1)
    producer = AIOKafkaProducer(**kafka.client_kwargs())
    await producer.start()
    try:
        await producer.send_and_wait(topology.control_topic, json.dumps(body).encode(), partition=0)
    finally:
        await producer.stop()
