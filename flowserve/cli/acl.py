"""``flowserve acl``: the least Kafka ACLs of each principal of a topology (a stage, the gateway, the tuner,
the UI), printed, or applied on Apache Kafka with CreateAcls (``--apply``, as an administrator)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table

from flowserve.console import make_console
from flowserve.errors import FlowserveError
from flowserve.kafka.acls import Acl, Principal, topology_acls
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import load_topology

console = make_console()


def rows(acls: dict[Principal, list[Acl]]) -> list[dict[str, Any]]:
    """One row per principal and resource, its operations together (as kafka-acls.sh and Strimzi list them)."""
    out: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for principal, granted in acls.items():
        for acl in granted:
            key = (principal.name, acl.resource, acl.pattern, acl.name)
            row = out.setdefault(key, {"principal": principal.name, "role": principal.role, "node": principal.node,
                                       "resource": acl.resource, "pattern": acl.pattern, "name": acl.name,
                                       "operations": [], "why": ""})
            row["operations"].append(acl.operation)
            if acl.why not in row["why"]:
                row["why"] = f"{row['why']}; {acl.why}" if row["why"] else acl.why
    return list(out.values())


def cmd_acl(args: argparse.Namespace) -> int:
    topology = load_topology(args.topology)
    acls = topology_acls(topology)
    if args.apply:
        if not args.broker:
            raise FlowserveError("--apply needs --broker host:port (and an administrator's FLOWSERVE_SASL_* "
                                 "credentials: one allowed to Alter the cluster)")
        from flowserve.kafka.acl_apply import apply_acls

        applied = apply_acls(KafkaSettings.from_env(args.broker), [a for granted in acls.values() for a in granted])
        if not args.json:
            console.print(f"applied ACLs of {len(acls)} principal(s): {len(applied.created)} created, "
                          f"{len(applied.present)} already present")
    if args.json:
        print(json.dumps(rows(acls), indent=1))
        return 0
    table = Table(title=f"{topology.name}: Kafka ACLs per principal (allow; everything else is refused)")
    for column in ("principal", "resource", "pattern", "name", "operations", "why"):
        table.add_column(column)
    for row in rows(acls):
        table.add_row(row["principal"], row["resource"], row["pattern"], row["name"], ",".join(row["operations"]),
                      row["why"])
    console.print(table)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("acl", help="the least Kafka ACLs of each stage, the gateway, the tuner and the UI; "
                                   "--apply creates them (CreateAcls)")
    p.add_argument("topology")
    p.add_argument("--apply", action="store_true",
                   help="create the ACLs the cluster lacks (idempotent; needs confluent-kafka and --broker)")
    p.add_argument("--broker", help="host:port of Apache Kafka, reached with the FLOWSERVE_* connection settings")
    p.add_argument("--json", action="store_true", help="print the ACLs as JSON, one row per principal and resource")
    p.set_defaults(func=cmd_acl)
