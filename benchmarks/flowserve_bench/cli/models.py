"""``flowserve bench models``: thousands of models on a few workers, simulated (no broker)."""

from __future__ import annotations

import argparse
from typing import Any

from flowserve.cli import common
from flowserve.cli.common import console
from flowserve_bench.cli.shared import Result, on_broker, workload


def register(workloads: Any) -> None:
    p = workload(workloads, "models", _models, broker=False,
                 summary="many models on a few workers: the predictive scheduler against load-on-demand LRU "
                 "(simulated emulated T4 workers, no broker)",
                 description="1,000 and 4,000 emulated models with Zipf popularity on 2 and 4 SIMULATED emulated "
                 "T4 workers with memory for 5% of the models each, Poisson arrivals at 50-90% of capacity "
                 "(all models resident, 99% within the SLO): flowserve's scheduler, load-on-demand LRU, and "
                 "the workers one model per worker would need. Not a live run (docs/models.md).")
    p.add_argument("--models", type=int, nargs="+", default=[1000, 4000], help="catalogue sizes")
    p.add_argument("--zipf", type=float, nargs="+", default=[0.9, 1.2], help="Zipf exponents of popularity")
    p.add_argument("--workers", type=int, nargs="+", help="worker counts (default: 2 4; --fidelity: 1 2)")
    p.add_argument("--loads", type=float, nargs="+",
                   help="shares of capacity offered (default: 0.5 0.7 0.9; --fidelity: 0.3 0.6 0.9)")
    p.add_argument("--seconds", type=float, help="seconds of arrivals per cell (default: 30; --fidelity: 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals, popularity and jitter")
    p.add_argument("--no-highest", dest="highest", action="store_false",
                   help="skip the search for the highest load at which each contender meets 99.9%% (done by default)")
    p.add_argument("--real", action="store_true",
                   help="instead, the LIVE run with real models: 100 digits variants from the registry on one "
                   "worker on a broker, every answer checked against its variant run alone (flowserve_bench."
                   "models_real)")
    p.add_argument("--per-model", type=int, default=4, help="--real: requests per variant")
    p.add_argument("--fidelity", action="store_true",
                   help="instead, the simulator checked against LIVE runs: 100 emulated models on 1 and 2 worker "
                   "processes on a broker and in the simulator, on the same arrivals (flowserve_bench.models_fidelity;"
                   " --workers, --zipf, --loads, --seconds and --seed apply)")
    common.broker_options(p)  # --real and --fidelity only: the broker it runs on


def _models(args: argparse.Namespace) -> Result:
    from flowserve_bench.models import models_bench

    if args.real:
        from flowserve_bench.models_real import real_bench

        return on_broker(args, lambda kafka: real_bench(kafka, per_model=args.per_model, seed=args.seed,
                                                        log=console.print))
    if args.fidelity:
        from flowserve_bench.models_fidelity import fidelity_bench

        return on_broker(args, lambda kafka: fidelity_bench(
            kafka, workers=args.workers or [1, 2], zipf_s=args.zipf, loads=args.loads or [0.3, 0.6, 0.9],
            seconds=args.seconds or 20.0, seed=args.seed, broker=args.broker_kind if args.broker is None else "given",
            log=console.print))
    return models_bench(args.models, args.zipf, args.workers or [2, 4], args.loads or [0.5, 0.7, 0.9],
                        seconds=args.seconds or 30.0, seed=args.seed, highest=args.highest, log=console.print)
