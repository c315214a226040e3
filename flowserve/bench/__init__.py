"""``flowserve bench`` workloads: each measures flowserve and its baseline in the same run."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from flowserve.kafka.settings import KafkaSettings


def run_bench(workload: str, kafka: KafkaSettings, args: argparse.Namespace) -> dict[str, Any]:
    if workload == "passthrough":
        from flowserve.bench.passthrough import passthrough

        return asyncio.run(passthrough(kafka, records=args.records))
    if workload == "latency":
        from flowserve.bench.latency import latency

        return asyncio.run(latency(kafka, rate=args.rate, seconds=args.seconds))
    if workload == "gateway":
        from flowserve.bench.gateway import gateway_bench

        return asyncio.run(gateway_bench(kafka, seconds=args.seconds))
    if workload == "capture":
        from flowserve.bench.capture import PARTS, capture_bench

        parts = (args.only,) if getattr(args, "only", None) else PARTS
        return asyncio.run(capture_bench(kafka, rate=args.rate, seconds=args.seconds, slice_s=args.slice_seconds or 2.0,
                                         parts=parts, blocks=args.blocks))
    if workload == "batching":
        from flowserve.bench.batching import batching

        return asyncio.run(batching(kafka, cell_seconds=getattr(args, "cell_seconds", 3.0)))
    if workload in ("tuner", "simulate"):
        from flowserve.bench.tuner import tuner_bench

        only = "simulate" if workload == "simulate" else getattr(args, "part", None)
        return asyncio.run(tuner_bench(kafka, rate=args.tuner_rate, seconds=args.trace_seconds, slo_ms=args.slo_ms,
                                       sim_rate=args.tuner_rate, only=only))
    if workload == "parity":
        from flowserve.bench.parity import parity_bench

        return asyncio.run(parity_bench(kafka, rate=args.rate, slice_s=args.slice_seconds or 4.0,
                                        rounds=args.rounds, k=args.k, stop_s=args.stop_seconds))
    if workload == "scale":
        from flowserve.bench.scale import scale_bench

        return asyncio.run(scale_bench(kafka, slice_s=args.slice_seconds or 2.0, rounds=args.rounds))
    raise ValueError(f"unknown workload {workload}")
