"""The planner's and the tuner's workloads: ``tuner`` (live, simulated at cluster scale, or the planner's
speed), ``simulate`` (the simulator's p99 against live runs) and ``plan-objectives`` (the planner's cost,
energy and carbon objectives)."""

from __future__ import annotations

import argparse
from typing import Any

from flowserve.cli.common import console
from flowserve.tuning.rules import RULES
from flowserve_bench.cli.shared import Result, on_broker, workload


def register(workloads: Any) -> None:
    p = workload(workloads, "tuner", _tuner, summary="the tuner against static and KEDA provisioning (live, or "
                 "--simulated at cluster scale)", description="The tuner against static provisioning and KEDA's "
                 "Kafka scaler on live traces (and, first, the simulator against live runs); --simulated: the "
                 "contenders at cluster scale in the simulated cluster, no broker; --part planner: how long "
                 "planning takes, no broker.")
    live = p.add_argument_group("live run")
    live.add_argument("--part", choices=["tuner", "planner", "rebalance"],
                      help="run one section: tuner (the live contenders alone, no simulate section), planner "
                      "(how long planning 2,000 and 10,000 req/s takes; no broker), rebalance (what a member "
                      "joining or leaving a group costs, per group protocol; starts its own Apache Kafka)")
    live.add_argument("--rate", type=float, default=30.0, help="base request rate of the traces")
    live.add_argument("--trace-seconds", type=float, default=40.0, help="length of each trace")
    live.add_argument("--slo-ms", type=float, default=600.0, help="end-to-end SLO")
    live.add_argument("--rule", choices=RULES, default=RULES[0],
                      help="the tuner contender's rule (flowserve tune --rule)")
    live.add_argument("--sim-repeats", type=int, default=3,
                      help="simulate section: traces replayed per pipeline (the p99 compared is over all of them)")
    simulated = p.add_argument_group("simulated cluster (--simulated)")
    simulated.add_argument("--simulated", action="store_true",
                           help="static, KEDA, the tuner and a clairvoyant oracle in the simulated cluster, "
                           "one-hour traces peaking at 2,000 req/s (no broker)")
    simulated.add_argument("--trace", metavar="FILE", help="also run this trace file (flowserve trace record)")
    simulated.add_argument("--pipelines", nargs="+", default=None,
                           help="the emulated pipelines (default: all four)")
    simulated.add_argument("--traces", nargs="*", default=None,
                           help="the generated traces (default: diurnal spike bursty mmpp; none: --trace alone)")
    simulated.add_argument("--contenders", nargs="+", default=None,
                           help="the contenders (default: all; the targets need tuner, static, keda, keda-tuned "
                           "and oracle)")
    simulated.add_argument("--deadline", choices=("slo", "none"), default="slo",
                           help="slo: every request carries the SLO as its deadline (timeout_ms), so a worker "
                           "refuses at once what it can no longer make; none: no deadline, every request is served")
    simulated.add_argument("--start", choices=("kubernetes", "local"), default="kubernetes",
                           help="a new pod's start delay: kubernetes 2.3-6.3 s (image cached), local 1.3-3.5 s")
    simulated.add_argument("--pause", choices=("eager", "none"), default="eager",
                           help="eager: a stage whose consumers change pauses 0.1-1.0 s (a group rebalance); "
                           "none: no pause at all, a bound (KIP-848's consumer protocol does not approach it: "
                           "--part rebalance)")
    simulated.add_argument("--sim-seconds", type=float, default=3600.0,
                           help="length of each generated trace (seconds)")

    p = workload(workloads, "simulate", _simulate, summary="the simulator's p99 against live runs",
                 description="Per emulated pipeline: plan for a Poisson trace, deploy the plan, replay traces of "
                 "the same process open loop and compare the live p99 with the simulator's.")
    p.add_argument("--rate", type=float, default=30.0, help="base request rate of the traces")
    p.add_argument("--trace-seconds", type=float, default=40.0, help="length of each trace")
    p.add_argument("--sim-repeats", type=int, default=3,
                   help="traces replayed per pipeline (the p99 compared is over all of them)")

    p = workload(workloads, "plan-objectives", _plan_objectives, broker=False,
                 summary="the planner's cost, energy and carbon objectives side by side (no broker)",
                 description="Per emulated pipeline and rate: plan a Poisson trace for each objective (flowserve "
                 "plan --objective cost|energy|carbon --no-fuse), simulate each plan over fresh traces, and show "
                 "its dollars per hour, joules and grams CO2e per request side by side.")
    p.add_argument("--rates", type=float, nargs="+", default=[100.0, 1000.0, 3000.0],
                   help="request rates of the traces")
    p.add_argument("--trace-seconds", type=float, default=30.0, help="length of each trace")
    p.add_argument("--repeats", type=int, default=3, help="fresh traces each plan is simulated over")
    p.add_argument("--carbon-g-per-kwh", type=float, help="grams CO2e per kWh (default: --carbon-region's)")
    p.add_argument("--carbon-region", help="a region of flowserve.energy.REGIONS (default: world)")


def _plan_objectives(args: argparse.Namespace) -> Result:
    from flowserve_bench.plan_objectives import plan_objectives_bench

    return plan_objectives_bench(rates=args.rates, seconds=args.trace_seconds, repeats=args.repeats,
                                 g_per_kwh=args.carbon_g_per_kwh, region=args.carbon_region, log=console.print)


def _tuner(args: argparse.Namespace) -> Result:
    from flowserve.tuning.traces import SCALE_KINDS
    from flowserve_bench.planner_speed import planner_bench
    from flowserve_bench.tuner import tuner_bench
    from flowserve_bench.tuner_contenders import CONTENDERS
    from flowserve_bench.tuner_sim import DEFAULT_PIPELINES, simulated_bench

    if args.simulated:  # the contenders in the simulated cluster: no broker
        traces = SCALE_KINDS if args.traces is None else args.traces
        return simulated_bench(args.pipelines or DEFAULT_PIPELINES, traces, trace_file=args.trace,
                               seconds=args.sim_seconds, contenders=args.contenders or CONTENDERS,
                               deadline=args.deadline == "slo", start=args.start, pause=args.pause == "eager",
                               log=console.print)
    if args.part == "planner":  # the planner and simulator alone: no broker
        return planner_bench(log=console.print)
    if args.part == "rebalance":  # its brokers need the consumer protocol's heartbeat bounds: it starts them
        from flowserve_bench.rebalance import rebalance_bench

        return rebalance_bench(log=console.print)
    return on_broker(args, lambda kafka: tuner_bench(kafka, rate=args.rate, seconds=args.trace_seconds,
                                                     slo_ms=args.slo_ms, sim_rate=args.rate, only=args.part,
                                                     rule=args.rule, sim_repeats=args.sim_repeats))


def _simulate(args: argparse.Namespace) -> Result:
    from flowserve_bench.tuner import tuner_bench

    return on_broker(args, lambda kafka: tuner_bench(kafka, rate=args.rate, seconds=args.trace_seconds,
                                                     sim_rate=args.rate, only="simulate",
                                                     sim_repeats=args.sim_repeats))
