"""The flowserve bench workloads, a distribution of their own (``pip install -e ./benchmarks``).

Each workload measures flowserve and its baseline in the same run; ``flowserve bench WORKLOAD`` runs one
(:mod:`flowserve_bench.cli`, found by the core CLI through the ``flowserve.commands`` entry point).
"""

from __future__ import annotations

#: every ``flowserve bench`` workload (benchmarks/render.py lists the ones with no saved result)
WORKLOADS = ("passthrough", "latency", "gateway", "capture", "batching", "tuner", "simulate", "parity", "scale",
             "broker", "learn", "learn-cache", "learn-selection", "learn-ensemble", "learn-continual", "chaos",
             "models", "plan-objectives", "explain", "hop-cpu")

__all__ = ["WORKLOADS"]
