"""``flowserve deploy render``: write a topology's deployment objects to a directory."""

from __future__ import annotations

import argparse
from typing import Any

from flowserve.cli.common import console
from flowserve.topology import load_topology


def register(sub: Any) -> None:
    p = sub.add_parser("deploy", help="render a topology's deployment: Dockerfiles, Kubernetes objects or Compose")
    deploy = p.add_subparsers(dest="deploy_command", required=True)
    r = deploy.add_parser("render", help="write Dockerfiles and Kubernetes objects or a Compose file for a topology")
    r.add_argument("topology")
    r.add_argument("-o", "--output", required=True, help="directory to write into")
    r.add_argument("--plan", help="YAML plan: partitions, replication_factor, image, per-node replicas/cpu/memory/gpu")
    r.add_argument("--target", choices=["k8s", "compose"], default="k8s")
    r.add_argument("--path", help="the topology file's path inside the image (default topologies/<name>.yaml)")
    r.add_argument("--auth", choices=["scram-sha-512", "tls"],
                   help="a Kafka principal per stage (k8s): Strimzi KafkaUsers with each stage's least ACLs "
                   "(flowserve acl), each Deployment mounting its own user's Secret only")
    r.set_defaults(func=cmd_render)


def cmd_render(args: argparse.Namespace) -> int:
    from flowserve.deploy import Plan, render, write  # the renderers and their schemas' helpers

    topology = load_topology(args.topology)
    plan = Plan.load(args.plan, topology) if args.plan else None
    files = render(topology, path=args.path, plan=plan, target=args.target, auth=args.auth)
    for path in write(files, args.output):
        console.print(f"wrote {path}")
    return 0
