"""``flowserve models list | load | unload``: the models of a topology's many-model nodes (flowserve.models)."""

from __future__ import annotations

import argparse
import asyncio
import json

from rich.table import Table

from flowserve.cli import common
from flowserve.console import make_console
from flowserve.errors import FlowserveError
from flowserve.topology import load_topology
from flowserve.topology.graph import Topology

out = make_console()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list, load and unload the models of many-model nodes (docs/models.md)")
    verbs = p.add_subparsers(dest="verb", required=True)
    q = verbs.add_parser("list", help="each model's state (READY, LOADING, UNAVAILABLE) and counts, from the "
                         "workers' latest metrics snapshots")
    q.add_argument("topology")
    q.add_argument("--broker", required=True)
    q.add_argument("--all", action="store_true", help="every model (default: those with any activity)")
    q.add_argument("--json", action="store_true", help="print the models as JSON")
    q.set_defaults(func=cmd_list)
    for verb, what in (("load", "make a model resident on every worker of its node"),
                       ("unload", "drop a model from every worker of its node")):
        q = verbs.add_parser(verb, help=f"{what} (a command on the control topic, applied between batches)")
        q.add_argument("topology")
        q.add_argument("model")
        q.add_argument("--broker", required=True)
        q.set_defaults(func=cmd_command)


def _node_of(topology: Topology, model: str) -> str:
    for node in topology.nodes.values():
        if node.models is not None and model in node.models.model_names():
            return node.id
    many = [n.id for n in topology.nodes.values() if n.models is not None]
    raise FlowserveError(f"topology '{topology.name}' has no model '{model}' "
                         f"({'its many-model nodes: ' + ', '.join(many) if many else 'it has no many-model node'})")


def cmd_list(args: argparse.Namespace) -> int:
    from flowserve.runtime.metrics import model_states, per_model, read_snapshots  # the snapshot reader

    topology = load_topology(args.topology)
    snaps = asyncio.run(read_snapshots(topology, common.kafka(args.broker)))
    counts = per_model(snaps)
    rows = [{**m, **counts.get(m["name"], {})} for m in model_states(topology, snaps)]
    if not args.all:
        rows = [r for r in rows if r["name"] in counts]
    if args.json:
        print(json.dumps(rows))
        return 0
    table = Table(title=f"models of {topology.name} ({len(snaps)} worker snapshot(s))")
    cols = ("name", "state", "resident", "loads", "evictions", "refusals", "answers")
    for col in cols:
        table.add_column(col, justify="left" if col in ("name", "state") else "right")
    for r in rows:
        table.add_row(*(str(r.get(c, 0)) for c in cols))
    out.print(table)
    return 0


def cmd_command(args: argparse.Namespace) -> int:
    from flowserve.kafka.control import model_command, send_command  # the producer stack

    topology = load_topology(args.topology)
    node = _node_of(topology, args.model)
    asyncio.run(send_command(topology, common.kafka(args.broker), model_command(node, args.model, args.verb)))
    out.print(f"{args.verb} of model '{args.model}' sent to the workers of node '{node}'")
    return 0
