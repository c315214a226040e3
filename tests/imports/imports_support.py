"""Helpers for the import tests: run `flowserve import` by its parser; serve topologies through one gateway."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from flowserve.cli.importing import register
from flowserve.client.http import AsyncHttpClient
from flowserve.gateway import Gateway, GatewaySettings
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology


def run_cli(argv: Sequence[str]) -> int:
    """``flowserve import ...`` through the command's own parser (as flowserve.cli registers it)."""
    parser = argparse.ArgumentParser(prog="flowserve")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return int(args.func(args))


@contextlib.asynccontextmanager
async def serving(paths: Sequence[Path], kafka: KafkaSettings) -> AsyncIterator[AsyncHttpClient]:
    """Workers for each topology file and a gateway serving them all; yields an HTTP client once ready."""
    topologies = [load_topology(p) for p in paths]
    hosts = [InlineHost(t, kafka) for t in topologies]
    for host in hosts:
        await host.start()
    try:
        async with Gateway(topologies, kafka, GatewaySettings(port=0)) as gateway, \
                AsyncHttpClient(gateway.url) as client:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 90
            while (await client.get("/v2/health/ready")).status != 200:  # every stage has a live worker
                assert loop.time() < deadline, "the imported topologies did not become ready within 90 s"
                await asyncio.sleep(0.1)
            yield client
    finally:
        for host in hosts:
            await host.stop()
