"""``flowserve gateway`` and ``flowserve run --gateway-port``: serve topologies over HTTP until a signal.

``--processes N`` hands over to :mod:`flowserve.gateway.group`, which starts N of this command on one port.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Sequence
from typing import Any

from flowserve.cli.common import console
from flowserve.errors import ErrorKind, FlowserveError
from flowserve.gateway.group import run_group
from flowserve.gateway.settings import GatewaySettings
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import Topology, load_topology


def register(sub: Any) -> None:
    p = sub.add_parser("gateway", help="serve topologies over HTTP (Open Inference Protocol V2), request-reply")
    p.add_argument("topology", nargs="+", help="topology files; each is served as a model named after it")
    p.add_argument("--broker", required=True, help="bootstrap host:port of the Kafka the topologies run on")
    p.add_argument("--plan", action="append", default=[], metavar="FILE",
                   help="a plan file (flowserve plan) the workers run with (flowserve run/worker --plan), applied to "
                        "the topology it names (repeatable): its fused chains are the stages the gateway waits for")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--token-file", help="bearer tokens, one per line; without it (and FLOWSERVE_GATEWAY_TOKENS) "
                                        "there is no authentication")
    p.add_argument("--max-inflight", type=int, help="requests in flight before 429 (default 4096)")
    p.add_argument("--processes", type=int, default=1,
                   help="run this many gateway processes on one port (SO_REUSEPORT), each with its own reply topics")
    p.add_argument("--reuse-port", action="store_true",
                   help="share the port with other gateway processes (SO_REUSEPORT; --processes sets this itself)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_gateway)


def serve_blocking(topologies: Sequence[Topology], kafka: KafkaSettings, settings: GatewaySettings) -> int:
    """Run a gateway in this thread until SIGINT/SIGTERM."""
    from flowserve.gateway.app import Gateway  # the HTTP server and aiokafka: not for --help
    from flowserve.models.agent import placement_agents
    from flowserve.runtime.eventloop import run

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        gateway = Gateway(topologies, kafka, settings)
        # many-model nodes: each model's requests to the workers placed to hold it (flowserve.models)
        agents = placement_agents(topologies, kafka, instance=settings.instance)
        gateway.bridge.routes.update({name: agent.router for name, agent in agents.items()})
        async with gateway:
            for agent in agents.values():
                await agent.start()
            names = ", ".join(t.name for t in topologies)
            console.print(f"[green]gateway[/] serving {names} at [bold]{gateway.url}/v2[/] "
                          f"(auth {'on' if settings.auth else 'off'}); Ctrl-C to stop")
            print(gateway.url, flush=True)
            try:
                await stop.wait()
            finally:
                for agent in agents.values():
                    await agent.stop()

    run(main(), settings.event_loop)
    return 0


def cmd_gateway(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    topologies = planned([load_topology(p) for p in args.topology], args.plan)
    settings = GatewaySettings.from_env(args.token_file, host=args.host, port=args.port,
                                        max_inflight=args.max_inflight, reuse_port=args.reuse_port or None)
    if args.processes > 1:
        return run_group(args.topology, args.broker, settings, args.processes, token_file=args.token_file,
                         max_inflight=args.max_inflight, verbose=args.verbose, plans=args.plan)
    return serve_blocking(topologies, KafkaSettings.from_env(args.broker), settings)


def planned(topologies: Sequence[Topology], plans: Sequence[str]) -> list[Topology]:
    """``topologies`` with each plan file applied to the topology it names (one the gateway does not serve
    is a mistake: its workers would run a plan the gateway does not know)."""
    if not plans:
        return list(topologies)
    from flowserve.tuning.plan import apply_plan, load_plan  # the planner's search: not for --help

    by_name = {t.name: t for t in topologies}
    for path in plans:
        plan = load_plan(path)
        if plan.topology not in by_name:
            raise FlowserveError(f"plan {path} is for topology '{plan.topology}', which this gateway does not serve "
                                 f"({', '.join(by_name)})", kind=ErrorKind.INVALID_INPUT)
        by_name[plan.topology] = apply_plan(by_name[plan.topology], plan)
    return [by_name[t.name] for t in topologies]
