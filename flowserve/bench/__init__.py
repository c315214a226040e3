"""``flowserve bench`` workloads: each measures flowserve and its baseline in the same run."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from flowserve.kafka.settings import KafkaSettings

#: every ``flowserve bench`` workload (benchmarks/render.py lists the ones with no saved result)
WORKLOADS = ("passthrough", "latency", "gateway", "capture", "batching", "tuner", "simulate", "parity", "scale",
             "broker", "learn", "learn-cache", "learn-selection", "learn-ensemble", "learn-continual", "chaos")


def run_bench(workload: str, kafka: KafkaSettings, args: argparse.Namespace) -> dict[str, Any]:
    if workload == "passthrough":
        from flowserve.bench.passthrough import passthrough

        return asyncio.run(passthrough(kafka, records=args.records))
    if workload == "latency":
        from flowserve.bench.latency import latency

        return asyncio.run(latency(kafka, rate=args.rate, seconds=args.seconds))
    if workload == "gateway" and getattr(args, "against", None):
        from flowserve.bench.against import against_bench

        return asyncio.run(against_bench(kafka, args))
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

        return asyncio.run(batching(kafka, cell_seconds=getattr(args, "cell_seconds", 3.0),
                                    rounds=getattr(args, "rounds", 4)))
    if workload in ("tuner", "simulate"):
        from flowserve.bench.tuner import tuner_bench

        only = "simulate" if workload == "simulate" else getattr(args, "part", None)
        return asyncio.run(tuner_bench(kafka, rate=args.tuner_rate, seconds=args.trace_seconds, slo_ms=args.slo_ms,
                                       sim_rate=args.tuner_rate, only=only, rule=args.tuner_rule,
                                       sim_repeats=getattr(args, "sim_repeats", 3)))
    if workload == "parity":
        from flowserve.bench.parity import parity_bench

        return asyncio.run(parity_bench(kafka, rate=args.rate, slice_s=args.slice_seconds or 4.0,
                                        rounds=args.rounds, k=args.k, stop_s=args.stop_seconds,
                                        encoder=args.encoder, stage=args.stage))
    if workload == "scale":
        from flowserve.bench.scale import scale_bench

        return asyncio.run(scale_bench(kafka, slice_s=args.slice_seconds or 2.0, rounds=args.rounds))
    if workload == "learn":
        return asyncio.run(_learn(kafka, args))
    if workload == "learn-cache":
        from flowserve.bench.learn_cache import learn_cache_bench

        return asyncio.run(learn_cache_bench(kafka, slice_s=args.slice_seconds or 2.0, rounds=args.rounds))
    if workload == "learn-selection":
        from flowserve.bench.learn_selection import learn_selection_bench

        return asyncio.run(learn_selection_bench(kafka))
    if workload == "learn-ensemble":
        from flowserve.bench.learn_ensemble import learn_ensemble

        return asyncio.run(learn_ensemble(kafka, rate=args.rate, slice_s=args.slice_seconds or 6.0))
    if workload == "learn-continual":
        from flowserve.bench.learn_continual import learn_continual_bench

        return asyncio.run(learn_continual_bench(kafka))
    if workload == "broker":
        from flowserve.bench.default_broker import broker_bench

        return asyncio.run(broker_bench(slice_s=args.slice_seconds or 2.0, rounds=args.rounds))
    raise ValueError(f"unknown workload {workload}")


async def _learn(kafka: KafkaSettings, args: argparse.Namespace) -> dict[str, Any]:
    """``flowserve bench learn``: the learning layer's four parts in a row (each prints its own table);
    their results under one key each, and every part's targets prefixed with the part's name."""
    from flowserve.bench.learn_cache import learn_cache_bench
    from flowserve.bench.learn_continual import learn_continual_bench
    from flowserve.bench.learn_ensemble import learn_ensemble
    from flowserve.bench.learn_selection import learn_selection_bench

    parts = {
        "cache": lambda: learn_cache_bench(kafka, slice_s=args.slice_seconds or 2.0, rounds=args.rounds),
        "selection": lambda: learn_selection_bench(kafka),
        "ensemble": lambda: learn_ensemble(kafka, rate=min(args.rate, 10.0), slice_s=args.slice_seconds or 6.0),
        "continual": lambda: learn_continual_bench(kafka),
    }
    out: dict[str, Any] = {"workload": "learn", "targets": {}}
    for name, run in parts.items():
        result = await run()
        out[name] = {k: v for k, v in result.items() if k != "targets"}
        out["targets"].update({f"{name}.{k}": v for k, v in result.get("targets", {}).items()})
    return out
