"""Apache Kafka with a SASL/SCRAM listener and an authorizer that refuses what no ACL allows (KRaft's
StandardAuthorizer, ``allow.everyone.if.no.acl.found=false``): the cluster the per-principal ACL tests run on.

The admin principal ``admin`` is a super user; so is ``ANONYMOUS``, the principal of the PLAINTEXT listeners
the node's broker and controller talk to each other over. Clients under test use the SASL listener only.
Users are added while the cluster runs (AlterUserScramCredentials, as Strimzi's user operator does).
"""

from __future__ import annotations

import re
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

from flowserve.kafka.brokers.apache_kafka import _FILES, QUICK_JVM, ApacheKafka
from flowserve.kafka.settings import KafkaSettings

ADMIN = "admin"
MECHANISM = "SCRAM-SHA-512"
_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


#: the broker's logging (flowserve's own, warnings only) plus every authorization decision: "Principal =
#: User:x is Denied operation = READ ... on resource = Topic:LITERAL:t" (and "Allowed", with the ACL that matched)
_AUDIT = ((_FILES / "log4j2.properties").read_text()
          + "logger.audit.name = kafka.authorizer.logger\nlogger.audit.level = debug\n")


def start_acl_cluster(admin_password: str) -> ApacheKafka:
    """The cluster; its broker log (:func:`decisions`) has every authorization decision."""
    config = Path(tempfile.mkdtemp(prefix="flowserve-acl-")) / "log4j2.properties"
    config.write_text(_AUDIT)
    return ApacheKafka.start(
        jvm_options=[*QUICK_JVM, f"-Dlog4j2.configurationFile={config}"],
        listeners={"SASL": "SASL_PLAINTEXT"}, scram_users={ADMIN: admin_password},
        config={"sasl.enabled.mechanisms": MECHANISM,
                "listener.name.sasl.scram-sha-512.sasl.jaas.config": _JAAS,
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "allow.everyone.if.no.acl.found": "false",
                # as a least-privilege cluster runs: topics are made on purpose (the admin, the gateway's reply
                # topic), never by a metadata request. With it on, a stage's metadata request for a reply topic
                # the broker had not yet learnt of became a refused CREATE in the authorizer's log
                "auto.create.topics.enable": "false",
                "super.users": f"User:{ADMIN};User:ANONYMOUS"})


def sasl(cluster: ApacheKafka, user: str, password: str, **extra: object) -> KafkaSettings:
    """Settings that connect as ``user`` through the SASL listener."""
    return KafkaSettings(bootstrap=f"127.0.0.1:{cluster.listener_ports['SASL']}", security_protocol="SASL_PLAINTEXT",
                         sasl_mechanism=MECHANISM, sasl_username=user, sasl_password=password,  # type: ignore[arg-type]
                         **extra)


def add_users(admin: KafkaSettings, users: list[str]) -> dict[str, str]:
    """SCRAM credentials for ``users``, each with a fresh password: ``{user: password}``."""
    passwords = {user: secrets.token_urlsafe(16) for user in users}
    client = AdminClient(admin.librdkafka_config())
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    futures = client.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(user, info, password.encode()) for user, password in passwords.items()])
    for future in futures.values():
        future.result(timeout=60)
    return passwords


_DECISION = re.compile(
    r"Principal = User:(?P<principal>\S+) is (?P<verdict>Allowed|Denied) operation = (?P<operation>\w+) .*?"
    r"on resource = (?P<resource>\w+):(?P<pattern>\w+):(?P<name>\S+) for request = (?P<request>\w+)"
    r"(?:.*?MatchingAcl\(acl=StandardAcl\(resourceType=(?P<acl_type>\w+), resourceName=(?P<acl_name>[^,]+), "
    r"patternType=(?P<acl_pattern>\w+),.*?operation=(?P<acl_operation>\w+))?")


@dataclass(frozen=True)
class Decision:
    """One authorization decision of the broker: who, allowed or not, what on which resource, for which
    request, and (allowed by an ACL) that ACL as (resource type, pattern, name, operation), Kafka's spelling."""

    principal: str
    allowed: bool
    operation: str
    resource: str
    name: str
    request: str
    acl: tuple[str, str, str, str] | None


def decisions(cluster: ApacheKafka) -> list[Decision]:
    """Every decision about a principal other than the super users, from the broker's log."""
    found = []
    for line in cluster._nodes[0].log.read_text(errors="replace").splitlines():
        m = _DECISION.search(line)
        if m is None or m["principal"] in (ADMIN, "ANONYMOUS"):
            continue
        acl = (m["acl_type"], m["acl_pattern"], m["acl_name"], m["acl_operation"]) if m["acl_type"] else None
        found.append(Decision(m["principal"], m["verdict"] == "Allowed", m["operation"], m["resource"], m["name"],
                              m["request"], acl))
    return found
