"""Commands to a topology's workers, on its control topic (one partition, so every worker sees them in order).

Each command is a JSON object with a ``command`` field; a worker's feature follows the topic from its end
and acts on the commands it knows (``version``: :mod:`flowserve.learning`; ``model``: load or unload one
model of a many-model node, :mod:`flowserve.models`). Callers: the gateway's repository API, the CLI.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from aiokafka import AIOKafkaProducer

from flowserve.kafka.admin import ensure_topics
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology.graph import Topology
from flowserve.wire.envelope import now_ms

#: the ``command`` of a model load or unload
MODEL_COMMAND = "model"
ModelAction = Literal["load", "unload"]


def model_command(node: str, model: str, action: ModelAction) -> dict[str, Any]:
    """The command that tells every worker of many-model ``node`` to load (or unload) ``model``."""
    return {"command": MODEL_COMMAND, "node": node, "model": model, "action": action, "ts": now_ms()}


def read_model_command(value: bytes | None, node: str) -> tuple[str, ModelAction] | None:
    """``(model, action)`` when ``value`` is a model command for ``node``; None for anything else."""
    try:
        body = json.loads(value or b"")
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("command") != MODEL_COMMAND or body.get("node") != node:
        return None
    model, action = body.get("model"), body.get("action")
    if not isinstance(model, str) or action not in ("load", "unload"):
        return None
    return model, action


async def send_command(topology: Topology, kafka: KafkaSettings, body: dict[str, Any]) -> None:
    """Write ``body`` to ``topology``'s control topic (created if missing); returns once the broker has it."""
    await ensure_topics(kafka, [topology.control_topic], 1)
    producer = AIOKafkaProducer(**kafka.client_kwargs())
    await producer.start()
    try:
        await producer.send_and_wait(topology.control_topic, json.dumps(body).encode(), partition=0)
    finally:
        await producer.stop()
