"""Run the nodes of a topology: in this process (tests, benches) or as one process per worker.

``flowserve run`` uses :class:`ProcessHost`: each node replica is a ``flowserve worker`` process in the
node's consumer group, exactly what a deployment across machines runs, so a stage can be killed and
restarted on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowserve.kafka.admin import ensure_topics
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.kafka.shutdown import bounded
from flowserve.runtime.batching import BatchPolicy
from flowserve.runtime.hooks import HookFactory, no_hooks
from flowserve.runtime.process import PARENT_PID_ENV, stop_processes
from flowserve.runtime.worker import StageWorker
from flowserve.topology.capture import topic_configs
from flowserve.topology.graph import Topology

log = logging.getLogger("flowserve.host")

#: How long InlineHost.stop waits for its workers. A worker's own stop is bounded step by step (drain,
#: consumer, producer: about a minute at worst), so past this something outside those steps holds it.
STOP_TIMEOUT_S = 90.0


def warn_idle_replicas(topology: Topology, node_id: str, consumers: int) -> bool:
    """Log a warning (and return True) when ``consumers`` of a node exceed its partitions: the extra ones idle."""
    partitions = topology.spec.partitions
    if consumers <= partitions:
        return False
    log.warning("node %s: %d consumers for %d partitions: %d of them will idle (consumers of a node share its "
                "partitions; raise the topology's partitions to scale further)",
                node_id, consumers, partitions, consumers - partitions)
    return True


async def create_topology_topics(topology: Topology, kafka: KafkaSettings) -> list[str]:
    created = await ensure_topics(kafka, topology.topics(), topology.spec.partitions,
                                  max_message_bytes=topology.spec.max_message_bytes,
                                  configs=topic_configs(topology))
    # faust-hosted workers subscribe to the control topic at start and ignore it while it is missing.
    return created + await ensure_topics(kafka, [topology.control_topic], 1)


@dataclass
class InlineHost:
    """Every node of a topology as asyncio tasks in the current process."""

    topology: Topology
    kafka: KafkaSettings
    settings: WorkerSettings = field(default_factory=WorkerSettings)
    policies: dict[str, BatchPolicy] = field(default_factory=dict)
    #: the features attached to every worker (e.g. ``flowserve.capture.capture_hooks``)
    hooks: HookFactory = no_hooks
    workers: list[StageWorker] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        await create_topology_topics(self.topology, self.kafka)
        for node_id, node in self.topology.nodes.items():
            warn_idle_replicas(self.topology, node_id, node.replicas)
            for _ in range(node.replicas):
                self.workers.append(StageWorker(self.topology, node_id, self.kafka, self.settings,
                                                policy=self.policies.get(node_id), hooks=self.hooks))
        await asyncio.gather(*(w.start() for w in self.workers))
        self._tasks = [asyncio.create_task(w.run(), name=f"worker-{w.node.id}") for w in self.workers]
        for task in self._tasks:
            task.add_done_callback(_report_crash)

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Ask every worker to finish its batch and commit; one still running after ``timeout_s`` is
        cancelled, and a warning says where it waited."""
        for w in self.workers:
            w.stop()
        await asyncio.gather(*(bounded(task, task.get_name(), timeout_s) for task in self._tasks))
        self._tasks = []

    async def __aenter__(self) -> InlineHost:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _report_crash(task: asyncio.Task[None]) -> None:
    """A worker task that dies must say so at once, not be found later as missing replies."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("%s died: %r", task.get_name(), exc, exc_info=exc)


@dataclass
class ProcessHost:
    """One ``flowserve worker`` process per node replica."""

    topology_path: Path
    topology: Topology
    kafka: KafkaSettings
    log_dir: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    procs: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)

    def command(self, node_id: str) -> list[str]:
        return [sys.executable, "-m", "flowserve", "worker", str(self.topology_path), node_id,
                "--broker", self.kafka.bootstrap, *self.extra_args]

    def environment(self) -> dict[str, str]:
        """A worker's environment: a worker reads its connection from ``--broker`` and ``FLOWSERVE_*``
        variables, so what suits this broker beyond its address goes there."""
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env["FLOWSERVE_FETCH_MAX_WAIT_MS"] = str(self.kafka.fetch_max_wait_ms)
        env["FLOWSERVE_IDEMPOTENCE"] = "1" if self.kafka.idempotence else "0"
        env[PARENT_PID_ENV] = str(os.getpid())  # a worker whose host is killed stops itself (watch_parent)
        return env

    def spawn(self, node_id: str) -> subprocess.Popen[bytes]:
        out: int | object = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            n = len(self.procs.get(node_id, []))
            out = open(self.log_dir / f"{node_id}-{n}.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(self.command(node_id), stdout=out, stderr=subprocess.STDOUT,  # type: ignore[arg-type]
                                env=self.environment())
        self.procs.setdefault(node_id, []).append(proc)
        warn_idle_replicas(self.topology, node_id, sum(p.poll() is None for p in self.procs[node_id]))
        return proc

    def start_processes(self) -> None:
        """Spawn the workers; the topology's topics must exist (see :func:`create_topology_topics`)."""
        for node_id, node in self.topology.nodes.items():
            for _ in range(node.replicas):
                self.spawn(node_id)

    async def start(self) -> None:
        await create_topology_topics(self.topology, self.kafka)
        self.start_processes()

    def alive(self) -> dict[str, int]:
        return {n: sum(p.poll() is None for p in ps) for n, ps in self.procs.items()}

    def kill(self, node_id: str, index: int = 0, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[node_id][index]
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        proc.wait()

    def restart(self, node_id: str, index: int = 0) -> None:
        new = self.spawn(node_id)
        self.procs[node_id].pop()  # spawn appended it; keep the slot's position stable
        self.procs[node_id][index] = new

    def retire(self, node_id: str, timeout: float = 30.0) -> None:
        """Stop the newest live worker of ``node_id`` gracefully (it finishes and commits its batch)."""
        live = [p for p in self.procs.get(node_id, []) if p.poll() is None]
        if not live:
            return
        proc = live[-1]
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self.procs[node_id].remove(proc)

    def stop(self, timeout: float = 10.0, *, also: Sequence[subprocess.Popen[Any] | None] = ()) -> None:
        """Stop every worker, and ``also`` the processes a command started beside them (the explainer),
        all at once (:func:`~flowserve.runtime.process.stop_processes`)."""
        stop_processes([*(p for ps in self.procs.values() for p in ps), *also], timeout)
