"""The tuner's actuators: what changes a stage's consumers (:class:`Scaler`), on this machine
(:class:`LocalScaler`: ``flowserve worker`` processes) or on Kubernetes (:class:`KubernetesScaler`)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
from collections.abc import Sequence
from typing import Protocol

from flowserve.errors import ErrorKind, FlowserveError
from flowserve.runtime.host import ProcessHost
from flowserve.topology.names import deployment_name, k8s_name

log = logging.getLogger("flowserve.tuner")


class Scaler(Protocol):
    """Changes the number of consumers of a stage."""

    def current(self) -> dict[str, int]: ...

    async def scale(self, stage: str, consumers: int) -> None: ...

    async def grown(self, partitions: int) -> None:
        """The topology now has ``partitions`` partitions (see :class:`PartitionGrowth`)."""


class LocalScaler:
    """Starts and stops local ``flowserve worker`` processes through a ProcessHost."""

    def __init__(self, host: ProcessHost) -> None:
        self.host = host

    def current(self) -> dict[str, int]:
        return {n: c for n, c in self.host.alive().items()}

    async def scale(self, stage: str, consumers: int) -> None:
        while self.host.alive().get(stage, 0) < consumers:
            self.host.spawn(stage)
        while self.host.alive().get(stage, 0) > consumers:
            await asyncio.to_thread(self.host.retire, stage)

    async def grown(self, partitions: int) -> None:
        # the host warns when a stage has more consumers than partitions: it must know the new count
        self.host.topology = self.host.topology.with_partitions(partitions)


class KubernetesScaler:
    """Sets each stage's replicas on Kubernetes with ``kubectl``, on the Deployments ``flowserve deploy``
    renders (``flowserve-<topology>-<node>``, :func:`~flowserve.topology.names.deployment_name`).

    ``flowserve deploy`` also renders a KEDA ScaledObject per stage; where one is installed, KEDA's
    autoscaler owns the Deployment's replicas and would undo a ``kubectl scale`` at its next poll. The
    tuner then pins the ScaledObject's ``minReplicaCount`` and ``maxReplicaCount`` to its count instead.
    :meth:`load` reads where the stages stand first; a ``kubectl`` that fails is logged and the stage left
    as it was (the controller asks again after its settle time). After the tuner grows the partitions of
    ``topics`` (``--max-partitions``), their Strimzi KafkaTopics are set to the new count, so that what the
    cluster declares matches what Kafka has (Strimzi cannot take partitions away, and would report the
    topics not ready)."""

    def __init__(self, topology: str, namespace: str = "default", kubectl: str = "kubectl",
                 topics: Sequence[str] = ()) -> None:
        self.topology = topology
        self.namespace = namespace
        self.kubectl = kubectl
        self.topics = list(topics)
        self._replicas: dict[str, int] = {}
        self._keda: set[str] = set()

    def _kubectl(self, *args: str) -> str:
        """Run ``kubectl -n <namespace> args``; its output, or a FlowserveError saying why not (it failed,
        hung for a minute, or is not installed)."""
        what = f"kubectl {args[0]} {args[1]} in namespace '{self.namespace}'"
        try:
            done = subprocess.run([self.kubectl, "-n", self.namespace, *args], capture_output=True, text=True,
                                  timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise FlowserveError(f"{what}: {exc}", kind=ErrorKind.UNAVAILABLE) from exc
        if done.returncode != 0:
            raise FlowserveError(f"{what}: {done.stderr.strip() or f'exit status {done.returncode}'}")
        return done.stdout

    def load(self) -> None:
        """Read each stage's replicas from its Deployment, and which stages KEDA scales."""
        selector = f"flowserve/topology={self.topology}"
        deployments = json.loads(self._kubectl("get", "deployments", "-l", selector, "-o", "json"))
        by_name = {}
        for item in deployments.get("items", []):
            node = item["metadata"].get("labels", {}).get("flowserve/node")
            # the gateway's Deployment carries the topology's labels too, but it is not a stage
            if node and node != "gateway" and item["metadata"]["name"] == deployment_name(self.topology, node):
                self._replicas[node] = int(item["spec"].get("replicas", 1))
                by_name[item["metadata"]["name"]] = node
        if not self._replicas:
            raise FlowserveError(f"no Deployments of topology '{self.topology}' in namespace '{self.namespace}' "
                                 f"(label {selector}): deploy it first (flowserve deploy ... | kubectl apply -f -)")
        try:
            scaled = json.loads(self._kubectl("get", "scaledobjects.keda.sh", "-l", selector, "-o", "json"))
        except FlowserveError as exc:  # KEDA not installed: the Deployments are ours alone
            log.info("tuner: no KEDA ScaledObjects (%s); scaling the Deployments", exc)
            return
        targets = (item["spec"].get("scaleTargetRef", {}).get("name") for item in scaled.get("items", []))
        self._keda = {by_name[t] for t in targets if t in by_name}

    def current(self) -> dict[str, int]:
        return dict(self._replicas)

    async def scale(self, stage: str, consumers: int) -> None:
        name = deployment_name(self.topology, stage)
        args: tuple[str, ...]
        if stage in self._keda:
            pin = json.dumps({"spec": {"minReplicaCount": consumers, "maxReplicaCount": consumers}})
            args = ("patch", f"scaledobjects.keda.sh/{name}", "--type", "merge", "-p", pin)
        else:
            args = ("scale", f"deployment/{name}", f"--replicas={consumers}")
        try:
            await asyncio.to_thread(self._kubectl, *args)
        except FlowserveError as exc:
            log.error("tuner: could not scale %s to %d: %s", stage, consumers, exc)
            return
        self._replicas[stage] = consumers

    async def grown(self, partitions: int) -> None:
        # the Deployments' workers subscribe to their topics and follow the growth on their own
        pin = json.dumps({"spec": {"partitions": partitions}})
        for topic in self.topics:
            try:  # off the event loop, as scale's: the tuner's tails and action log run on it
                await asyncio.to_thread(self._kubectl, "patch", f"kafkatopics.kafka.strimzi.io/{k8s_name(topic)}",
                                        "--type", "merge", "-p", pin)
            except FlowserveError as exc:
                log.error("tuner: KafkaTopic of %s not set to %d partitions: %s", topic, partitions, exc)

