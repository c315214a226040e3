"""Turn a CSV of request timestamps (a production trace) into a flowserve trace file, scaled up.

``python benchmarks/traces/from_csv.py IN.csv OUT.json [--column TIMESTAMP] [--copies K] [--seed S]``

Used for ``flowserve bench tuner --simulated --trace OUT.json`` with a trace the bench did not generate:
the Azure LLM inference trace 2023 (conversation service, 19,365 requests in an hour on 2023-11-16;
github.com/Azure/AzurePublicDataset, data/AzureLLMInferenceTrace_conv.csv, CC-BY, from the Splitwise
paper, ISCA 2024). A service of 5 requests/s is not one that needs a cluster, so ``--copies K`` stands K
such services behind one pipeline: each request becomes K requests, each moved by a uniform draw within
half a second. The trace's rate over time (its seconds, minutes and hour) is kept, K times over; what is
lost is the order within each second.
"""

from __future__ import annotations

import argparse
import csv
from datetime import datetime
from pathlib import Path

import numpy as np

from flowserve.tuning.traces import Trace, save_trace


def read_times(path: Path, column: str) -> np.ndarray:
    """Seconds from the first request, from an ISO-like timestamp column (fractions past microseconds cut)."""
    with path.open(newline="") as f:
        stamps = [row[column].strip() for row in csv.DictReader(f)]
    times = np.array([datetime.fromisoformat(s[:26]).timestamp() for s in stamps])
    times.sort()
    return times - times[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--column", default="TIMESTAMP")
    p.add_argument("--copies", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    base = read_times(args.csv, args.column)
    rng = np.random.default_rng(args.seed)
    arrivals = np.sort(np.concatenate([np.clip(base + rng.uniform(-0.5, 0.5, base.size), 0, None)
                                       for _ in range(args.copies)]))
    seconds = float(np.ceil(arrivals[-1]))
    save_trace(Trace(arrivals, seconds, "recorded", {"source": args.csv.name, "copies": args.copies}), args.out)
    counts = np.bincount(arrivals.astype(int))
    print(f"{args.out}: {arrivals.size} requests over {seconds:.0f} s, mean {arrivals.size / seconds:.0f}/s, "
          f"busiest second {counts.max()}, busiest minute {np.convolve(counts, np.ones(60), 'valid').max() / 60:.0f}/s")


if __name__ == "__main__":
    main()
