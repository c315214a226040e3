"""What the workloads' subcommands share: adding a workload, its output flags, the broker it runs on.

A workload's ``run`` imports its bench module when it runs, not here: the benches bring aiokafka,
confluent-kafka, the gateway and torch, and this module is imported by every ``flowserve --help``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from flowserve.cli import common
from flowserve.kafka.settings import KafkaSettings

Result = dict[str, Any]
Run = Callable[[argparse.Namespace], Result]


class DefaultsHelp(argparse.HelpFormatter):
    """Each flag's help ends with its default, where it has one that its help does not already state."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def workload(workloads: Any, name: str, run: Run, *, summary: str, description: str,
             broker: bool = True) -> argparse.ArgumentParser:
    """Add the ``flowserve bench NAME`` subcommand that calls ``run(args)``. ``summary`` is its line in
    ``flowserve bench --help``, ``description`` heads its own ``--help``; ``broker``: it takes
    ``--broker``/``--broker-kind`` (a workload that starts its own brokers, or needs none, does not)."""
    p = workloads.add_parser(name, help=summary, description=description, formatter_class=DefaultsHelp)
    if broker:
        common.broker_options(p)
    output_options(p)
    p.set_defaults(run=run)
    return p


def output_options(p: argparse.ArgumentParser) -> None:
    """``--plot`` and ``--save``: every workload's result drawn, or kept under version control."""
    p.add_argument("--plot", metavar="FILE.png", help="also draw the result to this image (needs matplotlib)")
    p.add_argument("--save", metavar="PATH", help="also write the result with its command, date and machine to "
                   "this JSON file (a folder: PATH/WORKLOAD.json); docs/benchmarks.md is generated from "
                   "benchmarks/results/")


def slices(p: argparse.ArgumentParser, default: float, what: str = "the contenders take turns") -> None:
    """``--slice-seconds``: how long one slice of interleaved contenders lasts."""
    p.add_argument("--slice-seconds", type=float, default=default, metavar="S", help=f"{what} in slices this long")


def rounds(p: argparse.ArgumentParser, default: int = 4, what: str = "slices per contender and scenario") -> None:
    """``--rounds``: how many slices each contender gets."""
    p.add_argument("--rounds", type=int, default=default, help=what)


def rate(p: argparse.ArgumentParser, default: float = 50.0, what: str = "requests per second") -> None:
    """``--rate``: the offered load."""
    p.add_argument("--rate", type=float, default=default, help=what)


def on_broker(args: argparse.Namespace, bench: Callable[[KafkaSettings], Coroutine[Any, Any, Result]]) -> Result:
    """Run ``bench`` on the broker ``--broker`` names, or on one of ``--broker-kind`` started for the run:
    Apache Kafka as its start script runs it (the test suite's fast-start JVM would be measured instead)."""
    with common.broker(args.broker, args.broker_kind, server_jvm=True) as kafka:
        return asyncio.run(bench(kafka))
