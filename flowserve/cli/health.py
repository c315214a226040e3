"""``flowserve health``: a probe for container platforms (an exec probe), answered by the broker.

A stage is *live* while its consumer group has a member (a worker that stopped heartbeating, SIGSTOPped
or hung, leaves the group after ``session_timeout_ms``) and *ready* when the group is stable, i.e. its
members consume. Exit status 0 when it holds, 1 when not (with the reason on stderr), 2 when the broker
cannot be asked. The check is per stage, not per process: one hung replica among live ones is found by
its group's rebalance, not by this probe.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from flowserve.cli.common import console
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import load_topology


def register(sub: Any) -> None:
    p = sub.add_parser("health", help="probe a topology's stages (exit 0 live/ready, 1 not): for container platforms")
    p.add_argument("topology")
    p.add_argument("--broker", required=True)
    p.add_argument("--node", action="append", help="check only this stage (repeatable; default: every stage)")
    p.add_argument("--live", action="store_true", help="liveness: a member in the group suffices (default: "
                                                       "readiness, the group consumes)")
    p.set_defaults(func=cmd_health)


def cmd_health(args: argparse.Namespace) -> int:
    from flowserve.gateway.health import ReadinessProbe  # aiokafka's admin client

    topology = load_topology(args.topology)
    nodes = args.node or list(topology.nodes)
    unknown = [n for n in nodes if n not in topology.nodes]
    if unknown:
        console.print(f"[red]topology '{topology.name}' has no node '{unknown[0]}'[/] (nodes: "
                      f"{', '.join(topology.nodes)})")
        return 2

    async def probe() -> int:
        checker = ReadinessProbe([topology], KafkaSettings.from_env(args.broker), cache_s=0)
        try:
            state = (await checker.check())[topology.name]
        finally:
            await checker.close()
        failing = [n for n in nodes if n in (state.dead if args.live else state.missing)]
        what = "live" if args.live else "ready"
        if failing:
            console.print(f"[red]not {what}:[/] stage(s) {', '.join(failing)} of '{topology.name}' "
                          f"{'have no worker in their consumer group' if args.live else 'do not consume'}")
            return 1
        if not state.ready and not state.missing and not state.dead:  # the broker did not answer
            console.print(f"[red]unknown:[/] {state.reason}")
            return 2
        print(f"{what}: {', '.join(nodes)}")
        return 0

    return asyncio.run(probe())
