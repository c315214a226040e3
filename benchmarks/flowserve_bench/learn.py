"""``flowserve bench learn``: the learning layer's four parts in a row (each prints its own table)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from flowserve.kafka.settings import KafkaSettings
from flowserve_bench.learn_cache import learn_cache_bench
from flowserve_bench.learn_continual import learn_continual_bench
from flowserve_bench.learn_ensemble import learn_ensemble
from flowserve_bench.learn_selection import learn_selection_bench


async def learn_bench(kafka: KafkaSettings, *, rate: float = 10.0, slice_s: float | None = None,
                      rounds: int = 4) -> dict[str, Any]:
    """The four parts' results under one key each, and every part's targets prefixed with the part's name.
    ``slice_s``: the cache's and the ensemble's slices (default 2 s and 6 s); ``rate``: the ensemble's;
    ``rounds``: the cache's."""
    parts: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
        "cache": lambda: learn_cache_bench(kafka, slice_s=slice_s or 2.0, rounds=rounds),
        "selection": lambda: learn_selection_bench(kafka),
        "ensemble": lambda: learn_ensemble(kafka, rate=rate, slice_s=slice_s or 6.0),
        "continual": lambda: learn_continual_bench(kafka),
    }
    out: dict[str, Any] = {"workload": "learn", "targets": {}}
    for name, run in parts.items():
        result = await run()
        out[name] = {k: v for k, v in result.items() if k != "targets"}
        out["targets"].update({f"{name}.{k}": v for k, v in result.get("targets", {}).items()})
    return out
