"""Apply ACLs on Apache Kafka (CreateAcls), idempotently: what a principal already has is left alone.

confluent-kafka's AdminClient, because aiokafka's (0.14) has no ACL calls at all; it is imported here only,
when ACLs are applied (``pip install confluent-kafka``), so the rest of flowserve does not need it.

>>> from flowserve.kafka.acls import topology_acls  # doctest: +SKIP
>>> wanted = [a for acls in topology_acls(topology).values() for a in acls]  # doctest: +SKIP
>>> applied = apply_acls(admin_settings, wanted)  # doctest: +SKIP
>>> applied.created, applied.present  # a second run creates nothing  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from flowserve.errors import BrokerError
from flowserve.kafka.acls import Acl, access_denied
from flowserve.kafka.settings import KafkaSettings

#: Kafka's one cluster resource is named this (an ACL on the cluster must name it)
CLUSTER_NAME = "kafka-cluster"
_RESOURCE = {"topic": "TOPIC", "group": "GROUP", "cluster": "BROKER", "transactional_id": "TRANSACTIONAL_ID"}
_OPERATION = {"Read": "READ", "Write": "WRITE", "Create": "CREATE", "Delete": "DELETE", "Alter": "ALTER",
              "Describe": "DESCRIBE", "DescribeConfigs": "DESCRIBE_CONFIGS", "AlterConfigs": "ALTER_CONFIGS",
              "IdempotentWrite": "IDEMPOTENT_WRITE"}


@dataclass(frozen=True)
class Applied:
    """What :func:`apply_acls` did: the ACLs it created, and those the cluster already had."""

    created: tuple[Acl, ...]
    present: tuple[Acl, ...]


def _admin_module() -> Any:
    try:
        return importlib.import_module("confluent_kafka.admin")
    except ImportError:
        raise BrokerError("applying ACLs needs confluent-kafka (pip install 'flowserve[librdkafka]'); without it, "
                          "`flowserve acl` prints them for kafka-acls.sh or a Strimzi KafkaUser") from None


def _binding(admin: Any, acl: Acl) -> Any:
    return admin.AclBinding(
        admin.ResourceType[_RESOURCE[acl.resource]],
        CLUSTER_NAME if acl.resource == "cluster" else acl.name,
        admin.ResourcePatternType.PREFIXED if acl.pattern == "prefixed" else admin.ResourcePatternType.LITERAL,
        acl.kafka_principal, "*", admin.AclOperation[_OPERATION[acl.operation]], admin.AclPermissionType.ALLOW)


def _key(binding: Any) -> tuple[Any, ...]:
    return (binding.restype, binding.name, binding.resource_pattern_type, binding.principal, binding.host,
            binding.operation, binding.permission_type)


def _result(future: Any, what: str, timeout_s: float) -> Any:
    try:
        return future.result(timeout=timeout_s)
    except Exception as exc:  # confluent-kafka raises KafkaException, or a timeout of its own
        denied = access_denied(exc)
        if denied is not None:
            raise denied from None
        raise BrokerError(f"{what}: {exc}") from None


def existing_acls(kafka: KafkaSettings, principals: Iterable[str], timeout_s: float = 30.0) -> set[tuple[Any, ...]]:
    """The ALLOW ACLs the cluster holds for each of ``principals`` (user names), as comparable keys."""
    admin = _admin_module()
    client = admin.AdminClient(kafka.librdkafka_config())
    found: set[tuple[Any, ...]] = set()
    for principal in principals:
        flt = admin.AclBindingFilter(admin.ResourceType.ANY, None, admin.ResourcePatternType.ANY,
                                     f"User:{principal}", None, admin.AclOperation.ANY, admin.AclPermissionType.ANY)
        bindings = _result(client.describe_acls(flt, request_timeout=timeout_s), "DescribeAcls", timeout_s)
        found.update(_key(b) for b in bindings)
    return found


def apply_acls(kafka: KafkaSettings, acls: Sequence[Acl], timeout_s: float = 30.0) -> Applied:
    """Create those of ``acls`` the cluster lacks (``kafka``: an administrator's connection, one allowed to
    Alter the cluster). Running it again creates nothing."""
    admin = _admin_module()
    wanted = {_key(_binding(admin, acl)): acl for acl in acls}
    have = existing_acls(kafka, sorted({acl.principal for acl in acls}), timeout_s)
    missing = [(key, acl) for key, acl in wanted.items() if key not in have]
    if missing:
        client = admin.AdminClient(kafka.librdkafka_config())
        futures = client.create_acls([_binding(admin, acl) for _, acl in missing], request_timeout=timeout_s)
        for future in futures.values():
            _result(future, "CreateAcls", timeout_s)
    return Applied(created=tuple(acl for _, acl in missing),
                   present=tuple(acl for key, acl in wanted.items() if key in have))
