"""Host a stage worker inside a faust-streaming app.

faust owns the process: lifecycle (start, signals, graceful stop), logging, and an agent on the
topology's control topic that takes operator commands (``pause``, ``resume``, ``stats``, ``stop``).
The data path stays the batch-native :class:`~flowserve.runtime.worker.StageWorker` loop: faust's
per-event agent path is ~100× slower than batched produce/commit (see ``flowserve bench passthrough``),
so it carries only control messages here.

Join buffers need no changelogged table: the worker never commits past the oldest record a pending
join still needs, so the input topics themselves are the changelog a restarted worker replays.

Every worker process gets its own faust app id, so each one sees every control command (broadcast);
a command may name a ``node`` to address one stage.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import tempfile
import uuid
from typing import Any

from flowserve.kafka import control
from flowserve.kafka.clients import unreachable, why_unreachable
from flowserve.kafka.control import MODEL_COMMAND
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.runtime.eventloop import install as install_loop
from flowserve.runtime.hooks import HookFactory, no_hooks
from flowserve.runtime.worker import StageWorker
from flowserve.topology.graph import Topology
from flowserve.wire.envelope import now_ms

log = logging.getLogger("flowserve.faust")

COMMANDS = ("pause", "resume", "stats", "stop")
#: commands on the same topic that a feature's hook follows itself (flowserve.learning's version switches,
#: flowserve.models' loads and unloads): not this host's, and not a mistake
FEATURE_COMMANDS = ("version", MODEL_COMMAND)


def make_app(topology: Topology, node_id: str, kafka: KafkaSettings, settings: WorkerSettings,
             hooks: HookFactory = no_hooks) -> Any:
    """A faust app that runs ``node_id`` of ``topology`` and obeys the control topic."""
    import faust
    from mode import Service

    instance = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    app = faust.App(
        f"{topology.group_id(node_id)}.host.{instance}",
        broker=[f"kafka://{h}" for h in kafka.bootstrap.split(",")],
        web_enabled=False,
        store="memory://",
        datadir=tempfile.mkdtemp(prefix="flowserve-faust-"),
        topic_partitions=1,
        topic_replication_factor=1,
        broker_session_timeout=settings.session_timeout_ms / 1000,
        broker_heartbeat_interval=settings.heartbeat_interval_ms / 1000,
        # Each process is a new group; reading from the start and skipping commands older than the process
        # means a command sent while the group was still forming is not lost, and old ones do not replay.
        consumer_auto_offset_reset="earliest",
        broker_credentials=_credentials(kafka),
    )
    control = app.topic(topology.control_topic, value_serializer="json", partitions=1)
    # aiokafka clients must be made inside the running loop, so the worker is built on start.
    holder: dict[str, StageWorker] = {}
    started_ms = now_ms()

    class StageService(Service):
        """Starts the worker with the app and stops it, after its batch in flight, with the app."""

        _task: asyncio.Task[None] | None = None

        async def on_start(self) -> None:
            worker = holder["worker"] = StageWorker(topology, node_id, kafka, settings, hooks=hooks)
            await worker.start()
            self._task = asyncio.create_task(worker.run(), name=f"stage-{node_id}")

        async def on_stop(self) -> None:
            if "worker" in holder:
                holder["worker"].stop()
            if self._task is not None:
                await asyncio.gather(self._task, return_exceptions=True)

    app.service(StageService)

    @app.agent(control)
    async def commands(stream: Any) -> None:
        async for command in stream:
            if "worker" in holder:
                handle_command(holder["worker"], command, app, since_ms=started_ms)

    return app


def _credentials(kafka: KafkaSettings) -> Any:
    """The same TLS/SASL settings as the worker's own clients, as faust's credentials objects."""
    import faust

    if kafka.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        password = kafka.sasl_password.get_secret_value() if kafka.sasl_password else None
        return faust.SASLCredentials(username=kafka.sasl_username, password=password,
                                     ssl_context=kafka.ssl_context(), mechanism=kafka.sasl_mechanism or "PLAIN")
    if kafka.security_protocol == "SSL":
        return faust.SSLCredentials(kafka.ssl_context())
    return None


def handle_command(worker: StageWorker, command: Any, app: Any = None, *, since_ms: int = 0) -> str:
    """Apply one control command to ``worker``; returns what was done (also logged)."""
    if isinstance(command, dict) and command.get("command") in FEATURE_COMMANDS:
        return "a feature's command"
    if not isinstance(command, dict) or command.get("command") not in COMMANDS:
        log.warning("ignoring control message %r: expected {'command': one of %s}", command, COMMANDS)
        return "ignored"
    sent = command.get("ts")
    if isinstance(sent, int) and sent < since_ms:
        return "older than this worker"
    target = command.get("node")
    if target is not None and target != worker.node.id:
        return "not for this node"
    name = command["command"]
    if name == "pause":
        worker.pause()
    elif name == "resume":
        worker.resume()
    elif name == "stop" and app is not None:
        # The same path as `kill -TERM`: the mode worker stops the app, the stage commits, the process exits.
        os.kill(os.getpid(), signal.SIGTERM)
    log.warning("node %s: %s %s", worker.node.id, name, json.dumps(worker.counters.snapshot()))
    return name


def run_worker(topology: Topology, node_id: str, kafka: KafkaSettings, settings: WorkerSettings,
               *, hooks: HookFactory = no_hooks, loglevel: str = "warn") -> None:
    """Run one node under faust until a signal or a ``stop`` command."""
    from mode import Worker

    # faust's own clients only log why they cannot connect and then fail with "Unable to bootstrap":
    # check first, so that a wrong password or an untrusted certificate is the error the worker exits with.
    if asyncio.run(why_unreachable(kafka)):
        raise asyncio.run(unreachable(kafka, None))
    install_loop(settings.event_loop)
    app = make_app(topology, node_id, kafka, settings, hooks)
    app.finalize()
    # Worker owns signals and the event loop; quiet by default so a worker's log is its own messages.
    Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False).execute_from_commandline()


async def send_command(topology: Topology, kafka: KafkaSettings, command: str, *, node: str | None = None) -> None:
    """Publish a control command; every faust-hosted worker of the topology receives it."""
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}; use one of {', '.join(COMMANDS)}")
    body = {"command": command, "ts": now_ms(), **({"node": node} if node else {})}
    await control.send_command(topology, kafka, body)  # one partition: every worker sees it
