"""``flowserve bench WORKLOAD``: a benchmark, flowserve and its baseline in one run, with the ratio.

The workloads live in :mod:`flowserve.bench`; here are their flags, each saying which workloads read it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from flowserve.bench import WORKLOADS, run_bench
from flowserve.cli import common
from flowserve.cli.common import console
from flowserve.tuning.rules import RULES


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmarks: flowserve and its baseline in one run, with the ratio")
    p.add_argument("workload", choices=WORKLOADS)
    common.broker_options(p)
    p.add_argument("--records", type=int, default=200_000, help="passthrough: records per contender")
    p.add_argument("--rate", type=float, default=50.0, help="latency, capture's detector part: requests per second")
    p.add_argument("--seconds", type=float, default=20.0,
                   help="latency: how long to send; gateway: per level; capture: per configuration")
    p.add_argument("--cell-seconds", type=float, default=3.0, help="batching: seconds per slice of a load cell")
    p.add_argument("--slice-seconds", type=float, default=None,
                   help="capture, parity, scale, broker, learn-cache: configurations take turns in slices this "
                   "long (default 2 s, 4 s, 2 s, 2 s, 2 s)")
    p.add_argument("--rounds", type=int, default=4,
                   help="parity, scale, broker, batching, learn-cache: slices per contender and scenario")
    p.add_argument("--k", type=int, default=2, help="parity: requests per parity group")
    p.add_argument("--encoder", choices=("sum", "concat"), default="sum", help="parity: the parity query's encoder")
    p.add_argument("--stage", choices=("digits", "emulated"), default="digits",
                   help="parity: protect the digits classifier, or an emulated accelerator stage before it")
    p.add_argument("--stop-seconds", type=float, default=1.5,
                   help="parity: how long the 'stopped' scenario SIGSTOPs a model worker")
    p.add_argument("--blocks", type=int, default=3,
                   help="capture: deploy afresh this many times per part (deployments differ on their own)")
    p.add_argument("--only", choices=["saturation", "detector"], help="capture: run one part of the bench")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the result to this image (needs matplotlib)")
    p.add_argument("--save", metavar="PATH", help="also write the result with its command, date and machine to "
                   "this JSON file (a folder: PATH/WORKLOAD.json); docs/benchmarks.md is generated from "
                   "benchmarks/results/")
    p.add_argument("--part", choices=["simulate", "tuner", "planner"],
                   help="tuner: run one section of the bench (planner: how long planning 2,000 and 10,000 req/s takes)")
    p.add_argument("--simulated", action="store_true",
                   help="tuner: static, KEDA, the tuner and a clairvoyant oracle at cluster scale in the simulated "
                   "cluster, one-hour traces peaking at 2,000 req/s (no broker)")
    p.add_argument("--trace", metavar="FILE",
                   help="tuner --simulated: also run this trace file (flowserve trace record)")
    p.add_argument("--pipelines", nargs="+", default=None,
                   help="tuner --simulated: the emulated pipelines (default: all four)")
    p.add_argument("--tuner-rate", type=float, default=30.0, help="tuner, simulate: base request rate")
    p.add_argument("--trace-seconds", type=float, default=40.0, help="tuner, simulate: length of each trace")
    p.add_argument("--slo-ms", type=float, default=600.0, help="tuner: end-to-end SLO")
    p.add_argument("--tuner-rule", choices=RULES, default=RULES[0],
                   help="tuner: the tuner contender's rule (flowserve tune --rule)")
    p.add_argument("--sim-repeats", type=int, default=3,
                   help="simulate: traces replayed per pipeline (the p99 compared is over all of them)")
    _chaos_arguments(p)
    _against_arguments(p)
    p.set_defaults(func=cmd_bench)


def _chaos_arguments(p: argparse.ArgumentParser) -> None:
    """``flowserve bench chaos`` (the run itself: :mod:`flowserve.bench.chaos`)."""
    p.add_argument("--minutes", type=float, default=10.0, help="chaos: how long traffic and faults go on")
    p.add_argument("--nodes", type=int, choices=[1, 3], default=1,
                   help="chaos: Apache Kafka nodes (3: replicated topics, and broker kills join the faults)")
    p.add_argument("--seed", type=int, default=17, help="chaos: seed of the fault schedule")
    p.add_argument("--chaos-rate", type=float, default=20.0,
                   help="chaos: requests per second from each caller (HTTP and async)")
    p.add_argument("--gateways", type=int, choices=[1, 2, 3, 4], default=2,
                   help="chaos: gateway processes sharing the HTTP port (SO_REUSEPORT), restarted one at a time; "
                   "with 1, calls are refused while it restarts")
    p.add_argument("--fault-every", type=float, default=20.0, help="chaos: mean seconds between faults")
    p.add_argument("--pause-broker", action=argparse.BooleanOptionalAction, default=True,
                   help="chaos with --nodes 3: also freeze a broker node (SIGSTOP) for seconds (default: on)")


def _against_arguments(p: argparse.ArgumentParser) -> None:
    """``flowserve bench gateway --against URL``: flowserve's gateway against another V2 server."""
    p.add_argument("--against", metavar="URL",
                   help="gateway: compare with the V2 server at URL (e.g. MLServer), the same load on both")
    p.add_argument("--against-model", metavar="NAME",
                   help="gateway --against: the model to call there (default: the topology's name)")
    p.add_argument("--topology", action="append", metavar="FILE",
                   help="gateway --against: topology to deploy (repeatable; default digits-fused and digits)")
    p.add_argument("--levels", help="gateway --against: closed-loop concurrency levels (default 1,8,32,128)")
    p.add_argument("--rates", help="gateway --against: open-loop Poisson rates in req/s, e.g. 200,800 (default none)")
    p.add_argument("--brokers", help="gateway --against: run on each of these broker kinds in turn, e.g. "
                                     "embedded,kafka (default: the one --broker/--broker-kind gives)")
    p.add_argument("--gateway-processes", type=int, default=1,
                   help="gateway --against: flowserve gateway processes sharing the port (default 1)")
    p.add_argument("--warm-max-seconds", type=float, default=90.0, metavar="S",
                   help="gateway --against: before the first level, drive both sides in turn until the broker's "
                        "JIT compiler is quiet, for at most S seconds (default 90; 0: no such warm-up)")


def cmd_bench(args: argparse.Namespace) -> int:
    # each workload's module is imported when it runs: they bring aiokafka, the gateway, torch, matplotlib
    common.stop_on_sigterm()  # a killed bench still stops the broker and workers it started

    if args.workload == "chaos":  # it starts, faults and stops its own Apache Kafka
        from flowserve.bench.chaos import chaos_bench

        result = chaos_bench(args)
    elif args.workload == "tuner" and args.simulated:  # the contenders in the simulated cluster: no broker
        from flowserve.bench.tuner_sim import DEFAULT_PIPELINES, simulated_bench

        result = simulated_bench(args.pipelines or DEFAULT_PIPELINES, trace_file=args.trace, log=console.print)
    elif args.workload == "tuner" and args.part == "planner":  # the planner and simulator alone: no broker
        from flowserve.bench.planner_speed import planner_bench

        result = planner_bench(log=console.print)
    else:  # Apache Kafka as its start script runs it: the test suite's fast-start JVM would be measured instead
        with common.broker(args.broker, args.broker_kind, server_jvm=True) as kafka:
            result = run_bench(args.workload, kafka, args)
    if args.plot:
        from flowserve.bench.plot import plot_result

        plot_result(result, args.plot)
        console.print(f"plot written to {args.plot}")
    if args.save:
        from flowserve.bench.results import save

        console.print(f"result written to {save(args.save, args.workload, result)}")
    print(json.dumps(result))
    return 0
