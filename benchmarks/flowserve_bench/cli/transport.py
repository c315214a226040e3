"""The workloads of the data path: ``passthrough``, ``latency``, ``gateway``, ``hop-cpu``, ``broker``,
``scale``, ``capture`` and ``batching``."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from flowserve_bench.cli.shared import Result, on_broker, rate, rounds, slices, workload


def register(workloads: Any) -> None:
    p = workload(workloads, "passthrough", _passthrough, summary="records/s through one stage against raw "
                 "client loops", description="Throughput of a flowserve identity node against raw aiokafka and "
                 "librdkafka consume-produce loops, on the same broker and the same 100-byte records.")
    p.add_argument("--records", type=int, default=200_000, help="records per contender")

    p = workload(workloads, "latency", _latency, summary="per-hop latency against a hand-written aiokafka chain",
                 description="Per-hop latency, open loop: a 3-node identity topology against a 3-hop aiokafka "
                 "chain, both in this process at the same request rate.")
    rate(p)
    p.add_argument("--seconds", type=float, default=20.0, help="how long to send")

    p = workload(workloads, "gateway", _gateway, summary="the HTTP gateway against the async Kafka path, or "
                 "against another V2 server (--against)", description="The V2 HTTP gateway against the async "
                 "Kafka client, closed loop, on digits and digits-fused. With --against URL: flowserve's gateway "
                 "against the V2 server at URL (e.g. MLServer) under the same load, in interleaved slices.")
    p.add_argument("--seconds", type=float, default=20.0, help="per concurrency level (without --against)")
    _against_arguments(p)

    p = workload(workloads, "hop-cpu", _hop_cpu, summary="a stage worker's CPU per record per hop against an "
                 "earlier commit's", description="This code's stage workers against an earlier commit's (checked "
                 "out with git worktree), both deployed with their gateways on one broker and driven in "
                 "interleaved slices: CPU per record per hop from /proc, the ratio now / before with its interval.")
    p.add_argument("--before", default="bb77cab", metavar="REF",
                   help="the commit to compare with (default: issue 35's, whose figures its target halves)")
    p.add_argument("--topology", default="topologies/digits.yaml", metavar="FILE", help="the topology both deploy")
    p.add_argument("--levels", default="1,8,32,128", help="closed-loop concurrency levels")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting for this code's deployment only, e.g. FLOWSERVE_WORKER_CLIENT=librdkafka")
    slices(p, 2.0, "the two deployments take turns")
    rounds(p)

    p = workload(workloads, "broker", _broker, broker=False, summary="the default broker against Apache Kafka "
                 "and Tansu", description="The default broker against Apache Kafka as its start script runs it "
                 "and against Tansu: the three started here, throughput through the gateway in interleaved slices.")
    slices(p, 2.0, "the brokers take turns")
    rounds(p)

    p = workload(workloads, "scale", _scale, summary="one stage's throughput as consumers are added",
                 description="Scale-out by consumers: a CPU stage and an emulated accelerator stage with 1, 2, ... "
                 "consumers sharing its partitions, in interleaved slices.")
    slices(p, 2.0, "the deployments take turns")
    rounds(p)

    p = workload(workloads, "capture", _capture, summary="what capture and a drift detector cost the pipeline",
                 description="The cost of capture as `flowserve run` deploys: saturation throughput with and "
                 "without capture, and a detector's effect on the critical path's latency.")
    rate(p, what="the detector part's requests per second")
    p.add_argument("--seconds", type=float, default=20.0, help="per configuration")
    slices(p, 2.0, "the configurations take turns")
    p.add_argument("--blocks", type=int, default=3,
                   help="deploy afresh this many times per part (deployments differ on their own)")
    p.add_argument("--only", choices=["saturation", "detector", "cpu"],
                   help="run one part of the bench; cpu (not run otherwise): CPU per request with capture off "
                   "and at 100%%, every stage in this process, and the part spent in capture's hooks")
    p.add_argument("--requests", type=int, default=3000, help="the cpu part: requests per configuration and block")

    p = workload(workloads, "batching", _batching, summary="SLO-aware batching against static and timeout "
                 "batching", description="SLO-aware batching against static batch sizes and timeout batching "
                 "on a torch classifier behind the real broker, at loads relative to its measured capacity.")
    p.add_argument("--cell-seconds", type=float, default=3.0, help="seconds per slice of a load cell")
    rounds(p, what="slices per policy and load cell")


def _against_arguments(p: argparse.ArgumentParser) -> None:
    """``flowserve bench gateway --against URL`` (the run itself: :mod:`flowserve_bench.against`)."""
    p.add_argument("--against", metavar="URL", help="compare with the V2 server at URL (e.g. MLServer), the same "
                   "load on both")
    p.add_argument("--against-model", metavar="NAME",
                   help="--against: the model to call there (default: the topology's name)")
    p.add_argument("--topology", action="append", metavar="FILE[:PLAN]",
                   help="--against: topology to deploy (repeatable), with a plan file (flowserve plan) applied as "
                        "'flowserve run --plan' does, or ':auto' for the plan flowserve plan makes for it at the "
                        "bench's start (default: digits-fused, digits, and topologies/digits-planned.yaml:auto)")
    p.add_argument("--levels", help="--against: closed-loop concurrency levels (default 1,8,32,128)")
    p.add_argument("--rates", help="--against: open-loop Poisson rates in req/s, e.g. 200,800 (default none)")
    p.add_argument("--brokers", help="--against: run on each of these broker kinds in turn, e.g. embedded,kafka "
                   "(default: the one --broker/--broker-kind gives)")
    p.add_argument("--gateway-processes", type=int, default=1,
                   help="--against: flowserve gateway processes sharing the port")
    p.add_argument("--warm-max-seconds", type=float, default=90.0, metavar="S",
                   help="--against: before the first level, drive both sides in turn until the broker's JIT "
                   "compiler is quiet, for at most S seconds (0: no such warm-up)")
    slices(p, 2.0, "--against: the two servers take turns")
    rounds(p, what="--against: slices per server and load")


def _hop_cpu(args: argparse.Namespace) -> Result:
    from pathlib import Path

    from flowserve_bench.hop_cpu import hop_cpu

    levels = tuple(int(x) for x in args.levels.split(","))
    return on_broker(args, lambda kafka: hop_cpu(kafka, before=args.before, topology=Path(args.topology),
                                                 levels=levels, rounds=args.rounds, slice_s=args.slice_seconds,
                                                 env=dict(x.split("=", 1) for x in args.env)))


def _passthrough(args: argparse.Namespace) -> Result:
    from flowserve_bench.passthrough import passthrough

    return on_broker(args, lambda kafka: passthrough(kafka, records=args.records))


def _latency(args: argparse.Namespace) -> Result:
    from flowserve_bench.latency import latency

    return on_broker(args, lambda kafka: latency(kafka, rate=args.rate, seconds=args.seconds))


def _gateway(args: argparse.Namespace) -> Result:
    from flowserve_bench.against import against_bench
    from flowserve_bench.gateway import gateway_bench

    if args.against:
        return on_broker(args, lambda kafka: against_bench(kafka, args))
    return on_broker(args, lambda kafka: gateway_bench(kafka, seconds=args.seconds))


def _broker(args: argparse.Namespace) -> Result:
    from flowserve_bench.default_broker import broker_bench

    return asyncio.run(broker_bench(slice_s=args.slice_seconds, rounds=args.rounds))


def _scale(args: argparse.Namespace) -> Result:
    from flowserve_bench.scale import scale_bench

    return on_broker(args, lambda kafka: scale_bench(kafka, slice_s=args.slice_seconds, rounds=args.rounds))


def _capture(args: argparse.Namespace) -> Result:
    from flowserve_bench.capture import PARTS, capture_bench
    from flowserve_bench.capture_cpu import capture_cpu
    from flowserve_bench.procs import listener_pids

    if args.only == "cpu":  # the broker's CPU too: the process listening on the bootstrap port
        return on_broker(args, lambda kafka: capture_cpu(
            kafka, args.requests, args.blocks, next(iter(listener_pids(_port(kafka.bootstrap))), None)))
    parts = (args.only,) if args.only else PARTS
    return on_broker(args, lambda kafka: capture_bench(kafka, rate=args.rate, seconds=args.seconds,
                                                       slice_s=args.slice_seconds, parts=parts, blocks=args.blocks))


def _port(bootstrap: str) -> int:
    return int(bootstrap.split(",")[0].rsplit(":", 1)[1])


def _batching(args: argparse.Namespace) -> Result:
    from flowserve_bench.batching import batching

    return on_broker(args, lambda kafka: batching(kafka, cell_seconds=args.cell_seconds, rounds=args.rounds))
