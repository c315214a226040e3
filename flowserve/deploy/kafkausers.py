"""A Kafka principal per stage on Kubernetes: Strimzi KafkaUsers with each stage's least ACLs
(:mod:`flowserve.kafka.acls`), and each user's Secret mounted into that stage's pods only.

``flowserve deploy render --auth scram-sha-512`` (or ``tls``) turns on, in what :mod:`flowserve.deploy.render`
writes: the Kafka cluster's listener authentication and its ``simple`` authorizer; a KafkaUser per stage and
for the gateway; in each Deployment, its own user's Secret as a read-only volume and the ``FLOWSERVE_*``
variables that point the worker at it (:meth:`flowserve.kafka.settings.KafkaSettings.from_env` reads
``FLOWSERVE_SASL_PASSWORD_FILE``); and a KEDA TriggerAuthentication per stage so that the lag scaler reads
the group's lag as that stage (its ACLs allow describing its own group and inputs).
"""

from __future__ import annotations

from typing import Any, Literal

from flowserve.kafka.acls import Acl, Principal, topology_acls
from flowserve.topology.graph import Topology

Auth = Literal["scram-sha-512", "tls"]
#: where a pod finds its user's Secret, and (TLS) the cluster CA's certificate
USER_DIR = "/etc/flowserve/kafka-user"
CA_DIR = "/etc/flowserve/kafka-ca"
#: the listener port of each kind of authentication (the plain listener stays on 9092 without it)
PORTS: dict[Auth, int] = {"scram-sha-512": 9092, "tls": 9093}
#: Strimzi names the operations as Kafka's ACL tool does; patterns as "literal" and "prefix"
_PATTERN = {"literal": "literal", "prefixed": "prefix"}
_RESOURCE = {"topic": "topic", "group": "group", "cluster": "cluster", "transactional_id": "transactionalId"}


def listener(auth: Auth | None) -> dict[str, Any]:
    """The Strimzi Kafka listener the topology's clients use."""
    if auth is None:
        return {"name": "plain", "port": 9092, "type": "internal", "tls": False}
    return {"name": "tls" if auth == "tls" else "scram", "port": PORTS[auth], "type": "internal",
            "tls": auth == "tls", "authentication": {"type": auth}}


def client_env(auth: Auth) -> dict[str, str]:
    """The connection settings every pod of the topology shares (its ConfigMap); credentials are per pod."""
    if auth == "tls":
        return {"FLOWSERVE_SECURITY_PROTOCOL": "SSL", "FLOWSERVE_SSL_CAFILE": f"{CA_DIR}/ca.crt"}
    return {"FLOWSERVE_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "FLOWSERVE_SASL_MECHANISM": "SCRAM-SHA-512"}


def strimzi_acls(acls: list[Acl]) -> list[dict[str, Any]]:
    """KafkaUser ``spec.authorization.acls``: one rule per resource, its operations together."""
    rules: dict[tuple[str, str, str], dict[str, Any]] = {}
    for acl in acls:
        resource: dict[str, Any] = {"type": _RESOURCE[acl.resource]}
        if acl.resource != "cluster":
            resource |= {"name": acl.name, "patternType": _PATTERN[acl.pattern]}
        rule = rules.setdefault((acl.resource, acl.pattern, acl.name),
                                {"resource": resource, "operations": [], "host": "*", "type": "allow"})
        rule["operations"].append(acl.operation)
    return list(rules.values())


def deployed(topology: Topology) -> dict[Principal, list[Acl]]:
    """The principals whose pods ``flowserve deploy render`` writes (the stages, the gateway and, with
    ``explain:``, the explainer; the tuner and the UI run elsewhere, and ``flowserve acl`` lists theirs)."""
    return {p: acls for p, acls in topology_acls(topology).items() if p.role in ("stage", "gateway", "explainer")}


def kafka_users(topology: Topology, cluster: str, auth: Auth, labels: dict[str, str]) -> list[dict[str, Any]]:
    """A KafkaUser per stage and for the gateway. The user operator makes a Secret of the same name
    (``password`` for SCRAM; ``user.crt``/``user.key`` for TLS)."""
    return [{"apiVersion": "kafka.strimzi.io/v1", "kind": "KafkaUser",
             "metadata": {"name": principal.name, "labels": {"strimzi.io/cluster": cluster, **labels}},
             "spec": {"authentication": {"type": auth},
                      "authorization": {"type": "simple", "acls": strimzi_acls(acls)}}}
            for principal, acls in deployed(topology).items()]


def mount_credentials(deployment: dict[str, Any], user: str, cluster: str, auth: Auth) -> None:
    """Mount ``user``'s Secret into ``deployment``'s pods (and no other Secret of the topology), and point
    the worker's settings at its files. The password never enters the pod's environment or its logs."""
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    volumes = [{"name": "kafka-user", "secret": {"secretName": user}}]
    mounts = [{"name": "kafka-user", "mountPath": USER_DIR, "readOnly": True}]
    env = [{"name": "FLOWSERVE_SASL_USERNAME", "value": user}]
    if auth == "tls":
        volumes.append({"name": "kafka-ca", "secret": {"secretName": f"{cluster}-cluster-ca-cert",
                                                       "items": [{"key": "ca.crt", "path": "ca.crt"}]}})
        mounts.append({"name": "kafka-ca", "mountPath": CA_DIR, "readOnly": True})
        env += [{"name": "FLOWSERVE_SSL_CERTFILE", "value": f"{USER_DIR}/user.crt"},
                {"name": "FLOWSERVE_SSL_KEYFILE", "value": f"{USER_DIR}/user.key"}]
    else:
        env.append({"name": "FLOWSERVE_SASL_PASSWORD_FILE", "value": f"{USER_DIR}/password"})
    pod["volumes"] = [*pod.get("volumes", []), *volumes]
    container["volumeMounts"] = [*container.get("volumeMounts", []), *mounts]
    container["env"] = [*container.get("env", []), *env]


def trigger_authentication(name: str, user: str, cluster: str, auth: Auth) -> dict[str, Any]:
    """KEDA reads a stage's lag as that stage: the user name from the pod's environment, the secret parts
    from the stage's own Secret."""
    if auth == "tls":
        refs = [{"parameter": "ca", "name": f"{cluster}-cluster-ca-cert", "key": "ca.crt"},
                {"parameter": "cert", "name": user, "key": "user.crt"},
                {"parameter": "key", "name": user, "key": "user.key"}]
        spec: dict[str, Any] = {"secretTargetRef": refs}
    else:
        spec = {"secretTargetRef": [{"parameter": "password", "name": user, "key": "password"}],
                "env": [{"parameter": "username", "name": "FLOWSERVE_SASL_USERNAME", "containerName": "flowserve"}]}
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "TriggerAuthentication", "metadata": {"name": name},
            "spec": spec}


def trigger_metadata(auth: Auth) -> dict[str, str]:
    """What a stage's KEDA kafka trigger adds to its metadata to authenticate."""
    return {"tls": "enable"} if auth == "tls" else {"sasl": "scram_sha512"}
