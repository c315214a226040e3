"""The models of many-model nodes as V2 models, and the V2 model repository API.

A node that declares ``models:`` (flowserve.models) serves each of them as a model of its own: the
gateway maps ``/v2/models/<model>/...`` to the node's topology and names the model in the request's
``fs-model`` header. The repository API (the V2 ``model_repository`` extension):

- ``POST /v2/repository/index``: every model with its state: a topology ``READY`` (or ``UNAVAILABLE``
  while a stage has no worker), a model of a many-model node ``READY`` (a worker holds it), ``LOADING``
  or ``UNAVAILABLE`` (none holds it: a request loads it on demand), from the workers' latest metrics
  snapshots; ``{"ready": true}`` lists the ready ones only.
- ``POST /v2/repository/models/<model>/load`` and ``.../unload``: a command on the topology's control
  topic (:func:`flowserve.kafka.control.model_command`), which every worker of the node applies between
  two batches; 200 once the broker has it. The index shows the outcome when the workers next report.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence

from aiokafka.errors import KafkaError

from flowserve.errors import BrokerError, ErrorKind, WireError
from flowserve.gateway.server import Request, Response, error_response, json_response
from flowserve.kafka.control import ModelAction, model_command, send_command
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.metrics import model_states, read_snapshots
from flowserve.topology.graph import Topology

#: how long the index waits for a topology's metrics snapshots
INDEX_TIMEOUT_S = 5.0


def hosted_models(topologies: Sequence[Topology]) -> dict[str, tuple[Topology, str]]:
    """Model name -> (its topology, its many-model node), for every model a served topology's nodes declare;
    :class:`WireError` when a name is served twice (by two nodes, or as a topology too)."""
    names = {t.name for t in topologies}
    hosted: dict[str, tuple[Topology, str]] = {}
    for t in topologies:
        for node in t.nodes.values():
            for name in node.models.model_names() if node.models is not None else ():
                other = hosted.get(name)
                if name in names or other is not None:
                    where = f"node '{other[1]}' of '{other[0].name}'" if other else "a topology"
                    raise WireError(f"model '{name}' of node '{node.id}' of '{t.name}' is also served by {where}; "
                                    "model names must be unique across the gateway's topologies")
                hosted[name] = (t, node.id)
    return hosted


class Repository:
    """The repository API over the served topologies; ``down()`` gives topology -> why it cannot answer now."""

    def __init__(self, topologies: Mapping[str, Topology], hosted: Mapping[str, tuple[Topology, str]],
                 kafka: KafkaSettings, down: Callable[[], Awaitable[Mapping[str, str]]]) -> None:
        self.topologies = topologies
        self.hosted = hosted
        self.kafka = kafka
        self.down = down

    async def handle(self, rest: list[str], request: Request) -> Response:
        """``rest``: the path after ``/v2/repository``."""
        if request.method != "POST":
            return error_response(405, f"{request.method} is not allowed on {request.path}; use POST",
                                  {"Allow": "POST"})
        if rest == ["index"]:
            return await self.index(request)
        if len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload"):
            action: ModelAction = "load" if rest[2] == "load" else "unload"
            return await self.command(rest[1], action)
        return error_response(404, f"no route {request.path}")

    async def index(self, request: Request) -> Response:
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            return error_response(400, "the index request's body is not JSON", None, ErrorKind.INVALID_INPUT)
        ready_only = isinstance(body, dict) and body.get("ready") is True
        down = await self.down()
        models = [{"name": t.name, "version": t.version, "state": "UNAVAILABLE" if t.name in down else "READY",
                   "reason": down.get(t.name, "")} for t in self.topologies.values()]
        for topology in {id(t): t for t, _ in self.hosted.values()}.values():
            snaps = await read_snapshots(topology, self.kafka, timeout_s=INDEX_TIMEOUT_S)
            models.extend(model_states(topology, snaps))
        if ready_only:
            models = [m for m in models if m["state"] == "READY"]
        return json_response(200, models)

    async def command(self, name: str, action: ModelAction) -> Response:
        if name in self.topologies:  # a topology is loaded while its workers run
            if action == "load":
                return json_response(200, {})
            return error_response(400, f"model '{name}' is a topology: stop its workers to unload it",
                                  None, ErrorKind.INVALID_INPUT)
        where = self.hosted.get(name)
        if where is None:
            known = [*self.topologies, *list(self.hosted)[:10]]
            return error_response(404, f"unknown model '{name}' (models: {', '.join(known)}"
                                       f"{', ...' if len(self.hosted) > 10 else ''})")
        topology, node = where
        try:
            await send_command(topology, self.kafka, model_command(node, name, action))
        except (BrokerError, KafkaError) as exc:
            return error_response(503, str(exc), None, ErrorKind.UNAVAILABLE)
        return json_response(200, {})
