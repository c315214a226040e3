"""``flowserve deploy render``: write a topology's deployment objects to a directory."""

from __future__ import annotations

import argparse

from flowserve.console import make_console

console = make_console(stderr=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="deploy_command", required=True)
    r = sub.add_parser("render", help="write Dockerfiles and Kubernetes objects or a Compose file for a topology")
    r.add_argument("topology")
    r.add_argument("-o", "--output", required=True, help="directory to write into")
    r.add_argument("--plan", help="YAML plan: partitions, replication_factor, image, per-node replicas/cpu/memory/gpu")
    r.add_argument("--target", choices=["k8s", "compose"], default="k8s")
    r.add_argument("--path", help="the topology file's path inside the image (default topologies/<name>.yaml)")
    r.set_defaults(func=cmd_render)


def cmd_render(args: argparse.Namespace) -> int:
    from flowserve.deploy import Plan, render, write
    from flowserve.topology import load_topology

    topology = load_topology(args.topology)
    plan = Plan.load(args.plan, topology) if args.plan else None
    for path in write(render(topology, path=args.path, plan=plan, target=args.target), args.output):
        console.print(f"wrote {path}")
    return 0
