"""Deployment objects rendered from a topology: container images, a Compose file, Kubernetes objects.

Everything is built as plain data (dicts) from the topology and an optional plan, then written with
PyYAML; the Dockerfiles and the collector configuration are template files beside this module.

>>> from flowserve.topology import load_topology  # doctest: +SKIP
>>> files = render(load_topology("topologies/digits.yaml"), target="k8s")  # doctest: +SKIP
>>> sorted(files)  # doctest: +SKIP
['Dockerfile', 'Dockerfile.cuda', 'k8s.yaml']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from flowserve.deploy.kafkausers import (
    PORTS,
    Auth,
    client_env,
    kafka_users,
    listener,
    mount_credentials,
    trigger_authentication,
    trigger_metadata,
)
from flowserve.deploy.keda import lag_thresholds
from flowserve.errors import ErrorKind, FlowserveError
from flowserve.kafka.acls import principal_name
from flowserve.topology.graph import Topology
from flowserve.topology.names import deployment_name, k8s_name

Target = Literal["k8s", "compose"]
KAFKA_NODES = 3
KAFKA_IMAGE = "apache/kafka:4.0.0"
OTEL_IMAGE = "otel/opentelemetry-collector-contrib:0.111.0"
GATEWAY_PORT = 8080
# Inside a container or pod the gateway must listen on every interface to be reachable at all; the
# Service (Kubernetes) or the loopback port mapping (Compose) decides who can reach it.
ALL_INTERFACES = "0.0.0.0"  # noqa: S104
OTLP_PORT = 4318


@dataclass(frozen=True)
class NodePlan:
    """How one node runs: its consumers and what each needs."""

    replicas: int = 1
    cpu: str = "500m"
    memory: str = "512Mi"
    memory_limit: str = "2Gi"
    gpu: int = 0  # accelerator stages: GPUs per consumer (requests nvidia.com/gpu, runs the CUDA image)
    max_replicas: int | None = None  # KEDA's ceiling (default: the topology's partitions)
    #: records/s one consumer handles (measured, or the plan's latency table at its batch): with the plan's
    #: slo_ms it sets KEDA's lagThreshold (flowserve.deploy.keda); without, the threshold is 100
    throughput: float | None = None


@dataclass(frozen=True)
class Plan:
    """A deployment plan: partitions and copies of the topics, and each node's consumers and resources.

    Read from YAML (``--plan``)::

        partitions: 8
        replication_factor: 3
        image: registry.example/flowserve:1.0
        slo_ms: 400
        nodes:
          model: {replicas: 2, cpu: "2", memory: 2Gi, gpu: 1, throughput: 120}
    """

    partitions: int | None = None
    #: the end-to-end SLO; with each node's throughput, KEDA's lagThreshold is what a consumer drains within
    #: its share of it (flowserve.deploy.keda)
    slo_ms: float | None = None
    replication_factor: int = 3
    min_insync_replicas: int = 2
    image: str = "flowserve:latest"
    nodes: dict[str, NodePlan] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path, topology: Topology) -> Plan:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(raw, dict):
            raise FlowserveError(f"{path}: a plan is a mapping", kind=ErrorKind.INVALID_INPUT)
        nodes = raw.pop("nodes", None) or {}
        unknown = sorted(set(nodes) - set(topology.nodes))
        if unknown:
            raise FlowserveError(f"{path}: nodes {unknown} are not in topology {topology.name!r} "
                                 f"(its nodes: {sorted(topology.nodes)})", kind=ErrorKind.INVALID_INPUT)
        try:
            return cls(**raw, nodes={k: NodePlan(**v) for k, v in nodes.items()})
        except TypeError as exc:
            raise FlowserveError(f"{path}: {exc}", kind=ErrorKind.INVALID_INPUT) from None

    def node(self, topology: Topology, node_id: str) -> NodePlan:
        default = NodePlan(replicas=topology.nodes[node_id].replicas)
        return self.nodes.get(node_id, default)


def _template(name: str) -> str:
    return resources.files("flowserve.deploy").joinpath("templates", name).read_text()


def _input_topics(topology: Topology, node_id: str) -> list[str]:
    node = topology.nodes[node_id]
    topics = [s.topic for sources in node.bindings.values() for s in sources] + [s.topic for s in node.triggers]
    return list(dict.fromkeys(topics))


def _worker_command(topology: Topology, path: str, node_id: str, bootstrap: str) -> list[str]:
    return ["worker", path, node_id, "--broker", bootstrap]


# Exec probes that work today (a health endpoint on the worker may replace them). Ready: a broker
# accepts connections. Alive: the worker (PID 1) is neither stopped nor a zombie; not the broker check,
# which would restart every worker while the brokers are down, when restarting helps nothing.
_PROBE = ("import os,socket;h,p=os.environ['FLOWSERVE_BOOTSTRAP'].split(',')[0].rsplit(':',1);"
          "socket.create_connection((h,int(p)),3).close()")
_ALIVE = "import sys;sys.exit(open('/proc/1/stat').read().rsplit(')',1)[1].split()[0] in 'ZTt')"


def _env(bootstrap: str, plan: Plan) -> dict[str, str]:
    return {"FLOWSERVE_BOOTSTRAP": bootstrap, "FLOWSERVE_IDEMPOTENCE": "1",
            "FLOWSERVE_REPLICATION_FACTOR": str(plan.replication_factor),
            "FLOWSERVE_MIN_INSYNC_REPLICAS": str(plan.min_insync_replicas),
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://otel-collector:{OTLP_PORT}"}


def _image(plan: Plan, node: NodePlan) -> str:
    return f"{plan.image}-cuda" if node.gpu else plan.image


# ---------------------------------------------------------------- Kubernetes


def kubernetes(topology: Topology, path: str, plan: Plan, auth: Auth | None = None) -> list[dict[str, Any]]:
    """Strimzi Kafka + node pool + topics, a Deployment and a KEDA ScaledObject per node, the gateway.

    With ``auth``, a principal per stage (:mod:`flowserve.deploy.kafkausers`): the cluster authenticates
    and authorizes, each stage and the gateway get a KafkaUser with their least ACLs, and each Deployment
    mounts its own user's Secret only."""
    name = k8s_name("flowserve", topology.name)
    cluster = "flowserve"
    bootstrap = f"{cluster}-kafka-bootstrap:{PORTS[auth] if auth else 9092}"
    partitions = plan.partitions or topology.spec.partitions
    labels = {"app.kubernetes.io/part-of": "flowserve", "flowserve/topology": topology.name}
    objs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels},
         "data": {**_env(bootstrap, plan), **(client_env(auth) if auth else {})}},
        *_strimzi(cluster, plan, auth),
    ]
    configs = {"min.insync.replicas": str(plan.min_insync_replicas)}
    for topic in [*topology.topics(), topology.control_topic]:
        objs.append({
            "apiVersion": "kafka.strimzi.io/v1", "kind": "KafkaTopic",
            "metadata": {"name": k8s_name(topic), "labels": {"strimzi.io/cluster": cluster, **labels}},
            "spec": {"topicName": topic, "partitions": 1 if topic == topology.control_topic else partitions,
                     "replicas": plan.replication_factor, "config": configs},
        })
    thresholds = lag_thresholds(topology, plan.slo_ms / 1000 if plan.slo_ms is not None else None,
                                {n: plan.node(topology, n).throughput for n in topology.nodes})
    for node_id in topology.nodes:
        node = plan.node(topology, node_id)
        deployment = deployment_name(topology.name, node_id)
        stage = _deployment(deployment, {**labels, "flowserve/node": node_id}, name, node, plan,
                            _worker_command(topology, path, node_id, bootstrap))
        scaler = _scaled_object(topology, node_id, deployment, node, bootstrap, partitions, thresholds[node_id])
        objs += [stage, scaler]
        if auth:
            user = principal_name(topology.name, node_id)
            mount_credentials(stage, user, cluster, auth)
            objs.append(trigger_authentication(deployment, user, cluster, auth))
            for trigger in scaler["spec"]["triggers"]:
                trigger["metadata"].update(trigger_metadata(auth))
                trigger["authenticationRef"] = {"name": deployment}
    gw = k8s_name(name, "gateway")
    gateway = _deployment(gw, {**labels, "flowserve/node": "gateway"}, name, NodePlan(), plan,
                          ["gateway", path, "--broker", bootstrap, "--host", ALL_INTERFACES,
                           "--port", str(GATEWAY_PORT)])
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    container["ports"] = [{"name": "http", "containerPort": GATEWAY_PORT}]
    container["readinessProbe"] = {"httpGet": {"path": "/v2/health/ready", "port": "http"}, "periodSeconds": 5}
    container["livenessProbe"] = {"httpGet": {"path": "/v2/health/live", "port": "http"}, "periodSeconds": 10}
    if auth:
        mount_credentials(gateway, principal_name(topology.name, "gateway"), cluster, auth)
        objs += kafka_users(topology, cluster, auth, labels)
    objs.append(gateway)
    if topology.explained:  # the explain side branch: one pod of its own (it niceness-yields to nothing here)
        explainer = _deployment(k8s_name(name, "explainer"), {**labels, "flowserve/node": "explainer"}, name,
                                NodePlan(), plan, ["explainer", path, "--broker", bootstrap])
        if auth:
            mount_credentials(explainer, principal_name(topology.name, "explainer"), cluster, auth)
        objs.append(explainer)
    objs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": gw, "labels": labels},
                 "spec": {"selector": {**labels, "flowserve/node": "gateway"},
                          "ports": [{"name": "http", "port": GATEWAY_PORT, "targetPort": "http"}]}})
    return objs


def _strimzi(cluster: str, plan: Plan, auth: Auth | None = None) -> list[dict[str, Any]]:
    """A KRaft Kafka cluster of three combined controller+broker nodes (with ``auth``: its listener
    authenticates, and the simple authorizer refuses what no KafkaUser's ACL allows)."""
    kafka: dict[str, Any] = {
        "listeners": [listener(auth)],
        "config": {"default.replication.factor": plan.replication_factor,
                   "min.insync.replicas": plan.min_insync_replicas,
                   "offsets.topic.replication.factor": plan.replication_factor,
                   "transaction.state.log.replication.factor": plan.replication_factor,
                   "transaction.state.log.min.isr": plan.min_insync_replicas}}
    if auth:
        kafka["authorization"] = {"type": "simple"}
        kafka["config"]["allow.everyone.if.no.acl.found"] = False
    return [
        {"apiVersion": "kafka.strimzi.io/v1", "kind": "KafkaNodePool",
         "metadata": {"name": "combined", "labels": {"strimzi.io/cluster": cluster}},
         "spec": {"replicas": KAFKA_NODES, "roles": ["controller", "broker"],
                  "storage": {"type": "persistent-claim", "size": "20Gi", "deleteClaim": False}}},
        {"apiVersion": "kafka.strimzi.io/v1", "kind": "Kafka", "metadata": {"name": cluster},
         "spec": {"kafka": kafka,
                  "entityOperator": {"topicOperator": {}, **({"userOperator": {}} if auth else {})}}},
    ]


def _deployment(name: str, labels: dict[str, str], config: str, node: NodePlan, plan: Plan,
                args: list[str]) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": node.cpu, "memory": node.memory}
    limits: dict[str, Any] = {"memory": node.memory_limit}
    if node.gpu:
        requests["nvidia.com/gpu"] = node.gpu
        limits["nvidia.com/gpu"] = node.gpu  # extended resources: request and limit must match
    ready = {"exec": {"command": ["python", "-c", _PROBE]}, "periodSeconds": 10, "timeoutSeconds": 5}
    alive = {"exec": {"command": ["python", "-c", _ALIVE]}, "periodSeconds": 10, "timeoutSeconds": 5,
             "failureThreshold": 3}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": node.replicas, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                # SIGTERM: the worker finishes the batch in flight, commits and leaves its group
                "terminationGracePeriodSeconds": 30,
                "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
                "containers": [{
                    "name": "flowserve", "image": _image(plan, node), "args": args,
                    "envFrom": [{"configMapRef": {"name": config}}],
                    "resources": {"requests": requests, "limits": limits},
                    "readinessProbe": ready, "livenessProbe": alive,
                }],
            }},
        },
    }


def _scaled_object(topology: Topology, node_id: str, deployment: str, node: NodePlan, bootstrap: str,
                   partitions: int, lag_threshold: int) -> dict[str, Any]:
    """KEDA scales the node's consumers on its group's lag, from the plan's replicas up to one consumer per
    partition; KEDA's and the HPA's other settings stay at their defaults (flowserve_bench.keda lists them)."""
    triggers = [{"type": "kafka", "metadata": {
        "bootstrapServers": bootstrap, "consumerGroup": topology.group_id(node_id), "topic": topic,
        "lagThreshold": str(lag_threshold), "offsetResetPolicy": "earliest"}}
        for topic in _input_topics(topology, node_id)]
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": deployment, "labels": {"flowserve/topology": topology.name}},
            "spec": {"scaleTargetRef": {"name": deployment}, "minReplicaCount": node.replicas,
                     "maxReplicaCount": node.max_replicas or partitions, "triggers": triggers}}


# ---------------------------------------------------------------- Compose


def compose(topology: Topology, path: str, plan: Plan) -> dict[str, Any]:
    """A 3-node KRaft Kafka, a topic-creating job, a service per node, the gateway and a collector."""
    voters = ",".join(f"{i}@kafka-{i}:9093" for i in range(1, KAFKA_NODES + 1))
    bootstrap = ",".join(f"kafka-{i}:9092" for i in range(1, KAFKA_NODES + 1))
    services: dict[str, Any] = {}
    for i in range(1, KAFKA_NODES + 1):
        services[f"kafka-{i}"] = {"image": KAFKA_IMAGE, "hostname": f"kafka-{i}", "environment": {
            "KAFKA_NODE_ID": str(i), "KAFKA_PROCESS_ROLES": "broker,controller",
            "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093",
            "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://kafka-{i}:9092",
            "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "KAFKA_CONTROLLER_QUORUM_VOTERS": voters, "CLUSTER_ID": "flowserve-compose-cluster1",
            "KAFKA_DEFAULT_REPLICATION_FACTOR": str(plan.replication_factor),
            "KAFKA_MIN_INSYNC_REPLICAS": str(plan.min_insync_replicas),
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": str(plan.replication_factor),
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": str(plan.replication_factor),
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": str(plan.min_insync_replicas)}}
    env = _env(bootstrap, plan)
    kafka_up = {f"kafka-{i}": {"condition": "service_started"} for i in range(1, KAFKA_NODES + 1)}
    partitions = str(plan.partitions or topology.spec.partitions)
    services["topics"] = {"image": plan.image, "environment": env, "depends_on": kafka_up, "restart": "on-failure",
                          "command": ["topics", path, "--create", "--broker", bootstrap, "--partitions", partitions]}
    after_topics = {"topics": {"condition": "service_completed_successfully"}}
    for node_id in topology.nodes:
        node = plan.node(topology, node_id)
        service: dict[str, Any] = {
            "image": _image(plan, node), "environment": env, "depends_on": after_topics,
            "command": _worker_command(topology, path, node_id, bootstrap), "restart": "unless-stopped",
            "stop_grace_period": "30s",
            "deploy": {"replicas": node.replicas,
                       "resources": {"limits": {"memory": node.memory_limit}}},
            "healthcheck": {"test": ["CMD", "python", "-c", _PROBE], "interval": "10s", "timeout": "5s"},
        }
        if node.gpu:
            service["deploy"]["resources"]["reservations"] = {
                "devices": [{"driver": "nvidia", "count": node.gpu, "capabilities": ["gpu"]}]}
        services[k8s_name(node_id)] = service
    services["gateway"] = {
        "image": plan.image, "environment": env, "depends_on": after_topics, "restart": "unless-stopped",
        "command": ["gateway", path, "--broker", bootstrap, "--host", ALL_INTERFACES, "--port", str(GATEWAY_PORT)],
        "ports": [f"127.0.0.1:{GATEWAY_PORT}:{GATEWAY_PORT}"]}
    services["otel-collector"] = {"image": OTEL_IMAGE, "command": ["--config=/etc/otel-collector.yaml"],
                                  "volumes": ["./otel-collector.yaml:/etc/otel-collector.yaml:ro"]}
    return {"name": k8s_name("flowserve", topology.name), "services": services}


# ---------------------------------------------------------------- files


def render(topology: Topology, *, path: str | None = None, plan: Plan | None = None,
           target: Target = "k8s", auth: Auth | None = None) -> dict[str, str]:
    """The files of a deployment, by name. ``path`` is the topology file as seen inside the image;
    ``auth`` (Kubernetes only) gives each stage its own Kafka principal (:mod:`flowserve.deploy.kafkausers`)."""
    if auth and target != "k8s":
        raise FlowserveError("--auth renders Strimzi KafkaUsers: use it with --target k8s",
                             kind=ErrorKind.INVALID_INPUT)
    plan = plan or Plan()
    path = path or f"topologies/{topology.name}.yaml"
    files = {"Dockerfile": _template("Dockerfile"), "Dockerfile.cuda": _template("Dockerfile.cuda")}
    header = f"# Rendered by `flowserve deploy render` from topology {topology.name!r}: edit the topology, not this.\n"
    if target == "k8s":
        files["k8s.yaml"] = header + yaml.dump_all(kubernetes(topology, path, plan, auth), Dumper=_Dumper,
                                                   sort_keys=False)
    else:
        files["compose.yaml"] = header + yaml.dump(compose(topology, path, plan), Dumper=_Dumper, sort_keys=False)
        files["otel-collector.yaml"] = _template("otel-collector.yaml")
    return files


class _Dumper(yaml.SafeDumper):
    """Writes shared values out in full: no ``&id001`` anchors, which readers of manifests trip over."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def write(files: dict[str, str], out: str | Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        (out / name).write_text(text)
        written.append(out / name)
    return written
