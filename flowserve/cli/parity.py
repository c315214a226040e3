"""``flowserve parity``: commands of coded redundancy (ParM)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from flowserve.component import require
from flowserve.errors import FlowserveError
from flowserve.topology import load_topology


def cmd_parity_train(args: argparse.Namespace) -> int:
    from flowserve.parity import TrainsParity  # the parity package brings aiokafka: not for --help

    topology = load_topology(args.topology)
    node = topology.spec.nodes.get(args.node)
    if node is None:
        raise FlowserveError(f"topology '{topology.name}' has no node '{args.node}' "
                             f"(nodes: {', '.join(topology.spec.nodes)})")
    if node.parity is not None and node.parity.k != args.k:
        print(f"note: node '{args.node}' declares parity k={node.parity.k}; training k={args.k}")
    encoder = args.encoder or (node.parity.encoder if node.parity is not None else "sum")
    trainer = require(topology.nodes[args.node].component, TrainsParity, "train a parity model",
                      "give 'parity: {params: ...}' pointing at one trained elsewhere")
    report: dict[str, Any] = trainer.train_parity(args.k, encoder)
    print(json.dumps(report))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("parity", help="coded redundancy (ParM): train a node's parity model")
    parity = p.add_subparsers(dest="parity_command", required=True)
    t = parity.add_parser("train", help="train a node's parity model; print base and degraded-mode accuracy")
    t.add_argument("topology")
    t.add_argument("node")
    t.add_argument("--k", type=int, default=2, help="requests per parity group (2..16)")
    t.add_argument("--encoder", choices=("sum", "concat"), default=None,
                   help="the parity query's encoder (default: the node's parity: encoder, else sum)")
    t.set_defaults(func=cmd_parity_train)
