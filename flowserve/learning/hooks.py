"""Versions in the workers: load the live version at start, switch between batches on a control command.

A worker of a ``retrainable`` node gets a :class:`VersionHooks` (from :func:`version_hooks`). At start it
loads the version the registry says is live (so a restarted worker resumes a promotion), then follows the
topology's control topic ``<base>.control`` for ``{"command": "version", "node": ..., "version": ...}``
(written by ``flowserve promote`` / ``rollback`` through :func:`send_version`). A command only marks the
switch as pending; the weights are swapped in :meth:`VersionHooks.after_step`, between two batches, so
every batch runs wholly on one version and no request is dropped or answered twice. Each request's
headers get ``fs-model-version: <node>=<version>`` before ``process``, so its outputs (and its reply) say
which version computed them, and capture's lineage records the version with the weights hash.

A shadow worker (:mod:`flowserve.learning.shadow`) runs the same hooks pinned to one version: it loads
that version and ignores commands.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from flowserve.component import Component, require
from flowserve.errors import FlowserveError
from flowserve.kafka.control import ControlFollower, send_command
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.learning.capabilities import Retrainable
from flowserve.learning.registry import BASE, Registry
from flowserve.runtime.hooks import HookFactory, StageContext, StageHooks
from flowserve.topology.graph import Node, Topology
from flowserve.wire.envelope import H_MODEL_VERSION, now_ms

if TYPE_CHECKING:
    from flowserve.runtime.emit import Item

log = logging.getLogger("flowserve.learning")

#: the control command that switches a node's live version.
COMMAND = "version"


class VersionHooks(StageHooks):
    """Loads and switches the registered version of one worker's component (see the module docstring)."""

    def __init__(self, topology: Topology, node: str, component: Component, kafka: KafkaSettings | None,
                 settings: WorkerSettings | None = None, *, pinned: str | None = None) -> None:
        self.topology = topology
        #: the node whose versions these are (a shadow worker's own node id differs)
        self.node = node
        self.component = component
        self.weights = require(component, Retrainable, "switch versions of its weights (it declares 'retrainable')")
        self.registry = Registry(topology.name, node)
        self.kafka = kafka
        self.settings = settings or WorkerSettings()
        self.pinned = pinned
        self.current = BASE
        self._pending: str | None = None
        self._header = b""
        self._follower = (ControlFollower(topology, kafka, self.settings, command=COMMAND, node=node,
                                          on_command=self._command, on_ready=self._look_again)
                          if pinned is None and kafka is not None else None)
        self.switches = 0

    def start(self, stage: StageContext) -> None:
        version = self.pinned or self.registry.live()
        if version == BASE:  # setup() has just loaded the weights the params name
            self._header = f"{self.node}={BASE}".encode()
        else:
            self._switch(version)
        if self._follower is not None:
            self._follower.start()

    def _switch(self, version: str) -> None:
        if version == BASE:
            self.component.setup()  # the weights its params name, loaded again
            self.component.model_version = None
        else:
            self.weights.load_weights(self.registry.weights(version), version)
        if self.current != version:
            log.warning("node %s: now running version %s (was %s)", self.node, version, self.current)
        self.current = version
        self._header = f"{self.node}={version}".encode()

    def _look_again(self) -> None:
        """The follower has its position: a promotion since :meth:`start` is in the registry already."""
        live = self.registry.live()
        if live != self.current:
            self._pending = live

    def _command(self, body: dict[str, Any]) -> None:
        version = body.get("version")
        if isinstance(version, str):
            self._pending = version

    def begin(self, items: Sequence[Item]) -> Any:
        header = self._header
        for item in items:
            item.ready.headers[H_MODEL_VERSION] = header
        return None

    def after_step(self, *, force: bool) -> bool:
        pending, self._pending = self._pending, None
        if pending is not None and pending != self.current:
            try:
                self._switch(pending)
                self.switches += 1
            except FlowserveError as exc:  # a bad version must not stop the worker: it keeps the one it runs
                log.error("node %s: cannot switch to version %s, staying on %s: %s", self.node, pending,
                          self.current, exc)
        return True

    def counters(self) -> Mapping[str, int]:
        return {"version_switches": self.switches}

    def close(self) -> None:
        if self._follower is not None:
            self._follower.stop()


def version_hooks(kafka: KafkaSettings, settings: WorkerSettings | None = None) -> HookFactory:
    """The :data:`~flowserve.runtime.hooks.HookFactory` of continual learning: a :class:`VersionHooks` for
    each worker of a ``retrainable`` component, nothing (and no cost) elsewhere."""

    def factory(topology: Topology, node: Node, component: Component) -> list[StageHooks]:
        if not component.retrainable:
            return []
        return [VersionHooks(topology, node.id, component, kafka, settings)]

    return factory


async def send_version(topology: Topology, kafka: KafkaSettings, node: str, version: str) -> None:
    """Tell every worker of ``node`` to switch to ``version`` between two batches."""
    await send_command(topology, kafka, {"command": COMMAND, "node": node, "version": version, "ts": now_ms()})
