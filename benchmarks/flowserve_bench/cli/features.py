"""The features' workloads: ``parity``, the learning layer's (``learn`` runs its four parts in a row),
``explain`` and ``chaos``."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from flowserve_bench.cli.shared import Result, on_broker, rate, rounds, slices, workload


def register(workloads: Any) -> None:
    p = workload(workloads, "parity", _parity, summary="coded redundancy (ParM) against none and replication",
                 description="Coded redundancy (ParM) against no redundancy and replication at equal resources, "
                 "on the digits topology, with stragglers injected: the tail gap p99.9 - p50 per scenario.")
    rate(p)
    slices(p, 4.0, "the contenders take turns")
    rounds(p)
    p.add_argument("--k", type=int, default=2, help="requests per parity group")
    p.add_argument("--encoder", choices=("sum", "concat"), default="sum", help="the parity query's encoder")
    p.add_argument("--stage", choices=("digits", "emulated"), default="digits",
                   help="protect the digits classifier, or an emulated accelerator stage before it")
    p.add_argument("--stop-seconds", type=float, default=1.5,
                   help="how long the 'stopped' scenario SIGSTOPs a model worker")

    p = workload(workloads, "learn", _learn, summary="learn-cache, -selection, -ensemble and -continual in a row",
                 description="The learning layer's four workloads in a row: each part's result under its name, "
                 "its targets prefixed with it.")
    rate(p, 10.0, "the ensemble part's requests per second")
    p.add_argument("--slice-seconds", type=float, default=None, metavar="S",
                   help="the cache's and the ensemble's slices (default 2 s and 6 s)")
    rounds(p, what="the cache part's slices per contender")

    p = workload(workloads, "learn-cache", _learn_cache, summary="the prediction cache through the gateway",
                 description="A Zipf-distributed stream of digits through two gateways, with and without the "
                 "prediction cache, in interleaved slices.")
    slices(p, 2.0, "the two gateways take turns")
    rounds(p, what="slices per gateway")

    workload(workloads, "learn-selection", _learn_selection, summary="Exp3 model selection from feedback",
             description="Exp3 picks one of three digits models per request, learning from feedback on every "
             "request; one model's input turns noisy mid-run.")

    p = workload(workloads, "learn-ensemble", _learn_ensemble, summary="deadline-bound ensembles with a "
                 "stalling member", description="The digits ensemble answering at the deadline while one member "
                 "stalls, against waiting for every member.")
    rate(p)
    slices(p, 6.0, "the contenders take turns")

    workload(workloads, "learn-continual", _learn_continual, summary="drift, then feedback, learn, shadow, "
             "promote", description="Drift drops accuracy; feedback, learn, shadow and promote bring it back.")

    p = workload(workloads, "explain", _explain, summary="what sampled explanations cost the pipeline",
                 description="The digits topology with and without a sampled explain: section (its explainer "
                 "in a niced process of its own, as flowserve run starts it), at saturation in interleaved "
                 "slices: the throughput ratio with its interval and each process's CPU per request.")
    p.add_argument("--seconds", type=float, default=60.0, help="of load per side")
    slices(p, 2.0, "the two deployments take turns")
    p.add_argument("--blocks", type=int, default=3, help="deploy both sides afresh this many times")
    p.add_argument("--sample", type=float, default=0.01, help="the share of requests explained")

    p = workload(workloads, "chaos", _chaos, broker=False, summary="steady traffic through random faults, then a "
                 "full accounting", description="Steady traffic through faults injected at random (worker, "
                 "gateway and broker kills and pauses) on an Apache Kafka started here, then an accounting of "
                 "every request at the callers and on the topics.")
    p.add_argument("--minutes", type=float, default=10.0, help="how long traffic and faults go on")
    p.add_argument("--nodes", type=int, choices=[1, 3], default=1,
                   help="Apache Kafka nodes (3: replicated topics, and broker kills join the faults)")
    p.add_argument("--seed", type=int, default=17, help="seed of the fault schedule")
    rate(p, 20.0, "requests per second from each caller (HTTP and async)")
    p.add_argument("--gateways", type=int, choices=[1, 2, 3, 4], default=2,
                   help="gateway processes sharing the HTTP port (SO_REUSEPORT), restarted one at a time; "
                   "with 1, calls are refused while it restarts")
    p.add_argument("--fault-every", type=float, default=20.0, help="mean seconds between faults")
    p.add_argument("--pause-broker", action=argparse.BooleanOptionalAction, default=True,
                   help="with --nodes 3: also freeze a broker node (SIGSTOP) for seconds (default: on)")


def _parity(args: argparse.Namespace) -> Result:
    from flowserve_bench.parity import parity_bench

    return on_broker(args, lambda kafka: parity_bench(kafka, rate=args.rate, slice_s=args.slice_seconds,
                                                      rounds=args.rounds, k=args.k, stop_s=args.stop_seconds,
                                                      encoder=args.encoder, stage=args.stage))


def _learn(args: argparse.Namespace) -> Result:
    from flowserve_bench.learn import learn_bench

    return on_broker(args, lambda kafka: learn_bench(kafka, rate=args.rate, slice_s=args.slice_seconds,
                                                     rounds=args.rounds))


def _learn_cache(args: argparse.Namespace) -> Result:
    from flowserve_bench.learn_cache import learn_cache_bench

    return on_broker(args, lambda kafka: learn_cache_bench(kafka, slice_s=args.slice_seconds, rounds=args.rounds))


def _learn_selection(args: argparse.Namespace) -> Result:
    from flowserve_bench.learn_selection import learn_selection_bench

    return on_broker(args, learn_selection_bench)


def _learn_ensemble(args: argparse.Namespace) -> Result:
    from flowserve_bench.learn_ensemble import learn_ensemble

    return on_broker(args, lambda kafka: learn_ensemble(kafka, rate=args.rate, slice_s=args.slice_seconds))


def _learn_continual(args: argparse.Namespace) -> Result:
    from flowserve_bench.learn_continual import learn_continual_bench

    return on_broker(args, learn_continual_bench)


def _chaos(args: argparse.Namespace) -> Result:
    from flowserve_bench.chaos import ChaosConfig, chaos

    # it starts, faults and stops its own Apache Kafka
    cfg = ChaosConfig(seconds=args.minutes * 60, seed=args.seed, nodes=args.nodes, http_rate=args.rate,
                      async_rate=args.rate, fault_every_s=args.fault_every, pause_broker=args.pause_broker,
                      gateways=args.gateways)
    return asyncio.run(chaos(cfg))


def _explain(args: argparse.Namespace) -> Result:
    from flowserve_bench.explain import explain_bench

    return on_broker(args, lambda kafka: explain_bench(kafka, seconds=args.seconds, slice_s=args.slice_seconds,
                                                       blocks=args.blocks, sample=args.sample))
