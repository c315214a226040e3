"""The ``inspect``, ``lineage`` and ``drift`` subcommands. Each reader is imported when its command runs:
the readers bring aiokafka."""

from __future__ import annotations

import argparse
from typing import Any

from flowserve.cli.common import kafka as _kafka


def cmd_inspect(args: argparse.Namespace) -> int:
    from flowserve.capture.inspect import run_inspect

    return run_inspect(_kafka(args.broker), args.target, request_id=args.request_id, last=args.last,
                       fmt=args.format, prefix=args.prefix)


def cmd_lineage(args: argparse.Namespace) -> int:
    from flowserve.capture.lineage import run_lineage

    return run_lineage(_kafka(args.broker), args.request_id, args.topology, fmt=args.format, prefix=args.prefix)


def cmd_drift(args: argparse.Namespace) -> int:
    from flowserve.capture.drift import run_drift

    return run_drift(_kafka(args.broker), args.topology, fmt=args.format, prefix=args.prefix)


def register(sub: Any) -> None:
    """Add the capture subcommands to the ``flowserve`` subparsers."""

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--broker", required=True, help="bootstrap host:port")
        p.add_argument("--format", choices=["text", "json"], default="text")
        p.add_argument("--prefix", default="fs", help="topic prefix, when TOPOLOGY is a name (default: fs)")

    p = sub.add_parser("inspect", help="print the records of any edge of a topology, decoded")
    p.add_argument("target", metavar="TOPOLOGY[.NODE[.PORT]]",
                   help="a topology name or YAML file, optionally .node, .node.port, .inputs, .outputs, "
                        ".deadletter, .lineage, .drift")
    p.add_argument("--request-id", help="only this request's records (reads the whole topic)")
    p.add_argument("--last", type=int, metavar="N", help="the last N records of each topic (default 10)")
    common(p)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("lineage", help="the path of one request: nodes, versions, timings, intermediate tensors")
    p.add_argument("request_id")
    p.add_argument("--topology", required=True, help="topology name or YAML file")
    common(p)
    p.set_defaults(func=cmd_lineage)

    p = sub.add_parser("drift", help="current state of a topology's drift detectors, per detector and context")
    p.add_argument("topology", help="topology name or YAML file")
    common(p)
    p.set_defaults(func=cmd_drift)
