"""``flowserve validate``, ``graph`` and ``topics``: a topology file checked, drawn, its topics listed or made."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from flowserve.cli import common
from flowserve.cli.common import console, out
from flowserve.errors import FlowserveError
from flowserve.topology.render import RENDERERS


def register(sub: Any) -> None:
    p = sub.add_parser("validate", help="validate topology files")
    p.add_argument("topology", nargs="+")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("graph", help="print the FBP graph of a topology")
    p.add_argument("topology")
    p.add_argument("--format", choices=list(RENDERERS), default="text")
    p.set_defaults(func=cmd_graph)

    p = sub.add_parser("topics", help="list a topology's topics, or create them")
    p.add_argument("topology")
    p.add_argument("--create", action="store_true")
    p.add_argument("--partitions", type=int)
    p.add_argument("--replication-factor", type=int,
                   help="copies of each partition (default: min(3, brokers); FLOWSERVE_REPLICATION_FACTOR)")
    p.add_argument("--min-insync-replicas", type=int,
                   help="copies a write needs with acks=all (default: 2 where 3 copies, else 1)")
    p.add_argument("--broker")
    p.set_defaults(func=cmd_topics)


def cmd_validate(args: argparse.Namespace) -> int:
    status = 0
    for path in args.topology:
        try:
            topology = common.load(path)
        except FlowserveError as exc:
            console.print(f"[red]✗[/] {exc}")
            status = 1
            continue
        out.print(f"[green]✓[/] {path}: topology '{topology.name}' with {len(topology.nodes)} nodes is valid")
    return status


def cmd_graph(args: argparse.Namespace) -> int:
    print(RENDERERS[args.format](common.load(args.topology)))
    return 0


def cmd_topics(args: argparse.Namespace) -> int:
    topology = common.load(args.topology)
    partitions = args.partitions or topology.spec.partitions
    if args.create:
        from flowserve.runtime.host import create_topology_topics  # aiokafka's admin client

        if not args.broker:
            raise FlowserveError("--create needs --broker host:port")
        if args.partitions:
            topology = topology.with_partitions(args.partitions)
        kafka = common.kafka(args.broker)
        if args.replication_factor or args.min_insync_replicas:
            kafka = kafka.model_copy(update={"replication_factor": args.replication_factor or kafka.replication_factor,
                                             "min_insync_replicas": args.min_insync_replicas
                                             or kafka.min_insync_replicas})
        created = asyncio.run(create_topology_topics(topology, kafka))
        copies = kafka.replication_factor or "min(3, brokers)"
        console.print(f"created {len(created)} topic(s) with {partitions} partitions, {copies} copies each")
    for topic in topology.topics():
        print(topic)
    return 0
