"""``flowserve bench WORKLOAD``: a benchmark, flowserve and its baseline in one run, with the ratio.

The core CLI finds :func:`register` through the ``flowserve.commands`` entry point of this distribution.
Each workload is a subcommand with only its own flags; the modules here add them by topic
(:mod:`~flowserve_bench.cli.transport`, :mod:`~flowserve_bench.cli.tuning`,
:mod:`~flowserve_bench.cli.features`), each with ``register(workloads)`` as the core's commands do.
A workload's parser sets ``run``: the function of the parsed flags that runs the bench (on a broker
:func:`~flowserve_bench.cli.shared.on_broker` starts, for most) and returns its result.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from flowserve.cli import common
from flowserve.cli.common import console
from flowserve_bench.cli import features, models, transport, tuning
from flowserve_bench.plot import plot_result
from flowserve_bench.results import save


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmarks: flowserve and its baseline in one run, with the ratio",
                       description="Benchmarks: flowserve and its baseline in one run, on the same broker, with "
                       "the ratio and its 95% interval; the last line printed is the result as JSON, with a "
                       "`targets` object. `flowserve bench WORKLOAD --help` lists a workload's flags.")
    # the same workloads as flowserve_bench.WORKLOADS, which benchmarks/render.py reads (tests/bench/test_cli.py)
    workloads = p.add_subparsers(dest="workload", required=True, metavar="WORKLOAD")
    transport.register(workloads)  # passthrough, latency, gateway, broker, scale, capture, batching
    tuning.register(workloads)  # tuner, simulate, plan-objectives
    features.register(workloads)  # parity, learn, learn-*, chaos
    models.register(workloads)  # models (simulated)
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    common.stop_on_sigterm()  # a killed bench still stops the broker and workers it started
    result = args.run(args)
    if args.plot:
        plot_result(result, args.plot)
        console.print(f"plot written to {args.plot}")
    if args.save:
        console.print(f"result written to {save(args.save, args.workload, result)}")
    print(json.dumps(result))
    return 0
