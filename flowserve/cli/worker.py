"""``flowserve worker`` (one node of a topology: scale out by starting more) and ``flowserve control``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any

from flowserve.cli import common
from flowserve.cli.common import console
from flowserve.errors import FlowserveError
from flowserve.kafka.settings import WorkerSettings


def register(sub: Any) -> None:
    p = sub.add_parser("worker", help="run one node of a topology (scale out: start more in the same group)")
    p.add_argument("topology")
    p.add_argument("node")
    p.add_argument("--broker", required=True)
    p.add_argument("--stats-interval", type=float, help="log counters every N seconds "
                   "(default: FLOWSERVE_WORKER_STATS_INTERVAL_S, else 0: only at exit)")
    p.add_argument("--host", choices=["faust", "asyncio"], default="faust",
                   help="process host: faust (control-topic agent, lifecycle) or a bare asyncio loop")
    p.add_argument("--plan", help="apply a plan file (flowserve plan): batch and hardware of this node")
    p.add_argument("--energy", action="store_true", default=None,
                   help="meter each batch's energy and carbon (default: FLOWSERVE_ENERGY_ENABLED; docs/energy.md)")
    p.add_argument("--carbon-g-per-kwh", type=float, help="grams CO2e per kWh (default: --carbon-region's)")
    p.add_argument("--carbon-region", help="a region of flowserve.energy.power.REGIONS (default: world)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("control", help="send an operator command to a topology's workers (faust host)")
    p.add_argument("topology")
    p.add_argument("command", choices=["pause", "resume", "stats", "stop"])
    p.add_argument("--node", help="only this node's workers (default: all)")
    p.add_argument("--broker", required=True)
    p.set_defaults(func=cmd_control)


def cmd_worker(args: argparse.Namespace) -> int:
    # the worker, its hosts and the features it attaches bring aiokafka, faust and the features' stacks
    from flowserve.cache import cache_hooks
    from flowserve.capture import capture_hooks
    from flowserve.energy import EnergySettings, energy_hooks
    from flowserve.learning import held_hooks, version_hooks
    from flowserve.models import model_hooks
    from flowserve.parity import parity_hooks
    from flowserve.runtime.eventloop import run
    from flowserve.runtime.hooks import chain
    from flowserve.runtime.process import watch_parent, worker_process
    from flowserve.runtime.worker import StageWorker
    from flowserve.selection import selection_hooks

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    topology = common.load(args.topology, args.plan)
    if args.node not in topology.nodes:
        raise FlowserveError(f"topology '{topology.name}' has no node '{args.node}' "
                             f"(nodes: {', '.join(topology.nodes)})")

    settings = WorkerSettings.from_env(stats_interval_s=args.stats_interval)
    settings = worker_process(topology, args.node, settings)  # OS priority: side branches yield the CPU
    watch_parent()  # a worker whose host was killed outright stops itself
    kafka = common.kafka(args.broker)
    hooks = chain(cache_hooks, model_hooks(kafka, settings), held_hooks, capture_hooks,
                  parity_hooks(kafka, settings), selection_hooks(kafka), version_hooks(kafka, settings),
                  energy_hooks(EnergySettings.from_env(
                      enabled=args.energy, carbon_g_per_kwh=args.carbon_g_per_kwh, region=args.carbon_region)))
    if args.host == "faust":
        from flowserve.control.faust_host import run_worker  # faust: only for the faust host

        run_worker(topology, args.node, kafka, settings, hooks=hooks, loglevel="info" if args.verbose else "warn")
        return 0

    async def main() -> None:
        worker = StageWorker(topology, args.node, kafka, settings, hooks=hooks)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        await worker.run()

    run(main(), settings.event_loop)
    return 0


def cmd_control(args: argparse.Namespace) -> int:
    from flowserve.control.faust_host import send_command  # faust and aiokafka

    topology = common.load(args.topology)
    asyncio.run(send_command(topology, common.kafka(args.broker), args.command, node=args.node))
    console.print(f"sent '{args.command}' to {args.node or 'every node'} of '{topology.name}'")
    return 0
