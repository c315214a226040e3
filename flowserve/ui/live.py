"""Live figures per node, folded from the workers' metrics snapshots, with a few minutes of history.

Workers publish one JSON snapshot every couple of seconds (:mod:`flowserve.runtime.metrics`); the page
wants one figure set per node: the workers of a node are summed (counters, lag) or maxed (p99s). The
request rate is the change of a node's ``requests_ok`` between two polls, so a worker restart (its
counters start again at zero) never shows a negative rate.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from flowserve.runtime.metrics import CACHE_COUNTERS, COUNTERS

#: the energy hook's counters (flowserve.energy.hooks: millijoules active and idle, micrograms CO2e), read by
#: name: the UI and energy are sibling features and import nothing of each other
ENERGY_COUNTERS = ("energy_mj", "energy_idle_mj", "co2e_ug")

#: a node whose newest snapshot is older than this is shown as down
STALE_S = 15.0
#: records queued before a node is shown as lagging
LAG_WARN = 200
#: points of history kept per node (with the default 2 s poll: ten minutes)
HISTORY = 300


@dataclass
class NodeFigures:
    node: str
    workers: int = 0
    age_s: float | None = None
    lag: int = 0
    batch_mean: float = 0.0
    batch_p99: float = 0.0
    exec_p50_ms: float = 0.0
    exec_p99_ms: float = 0.0
    wait_p50_ms: float = 0.0
    wait_p99_ms: float = 0.0
    rate_rps: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)
    health: str = "unknown"

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def fold(node: str, snaps: list[dict[str, Any]], now_ms: int) -> NodeFigures:
    """One node's figures from its workers' latest snapshots."""
    figures = NodeFigures(node, workers=len(snaps), counters=dict.fromkeys(COUNTERS, 0))
    if not snaps:
        return figures
    figures.age_s = min((now_ms - int(s.get("ts_ms", now_ms))) / 1000 for s in snaps)
    batches = 0
    for s in snaps:
        m, c = s.get("metrics", {}), s.get("counters", {})
        size, exe, wait = m.get("batch.size", {}), m.get("batch.exec_time", {}), m.get("queue.wait", {})
        figures.lag += int(m.get("lag", 0) or 0)
        n = int(size.get("count", 0))
        figures.batch_mean += float(size.get("mean", 0.0)) * n
        batches += n
        figures.batch_p99 = max(figures.batch_p99, float(size.get("p99", 0)))
        figures.exec_p50_ms = max(figures.exec_p50_ms, float(exe.get("p50", 0)))
        figures.exec_p99_ms = max(figures.exec_p99_ms, float(exe.get("p99", 0)))
        figures.wait_p50_ms = max(figures.wait_p50_ms, float(wait.get("p50", 0)))
        figures.wait_p99_ms = max(figures.wait_p99_ms, float(wait.get("p99", 0)))
        for key in COUNTERS:
            figures.counters[key] += int(c.get(key, 0) or 0)
        for key in (*CACHE_COUNTERS, *ENERGY_COUNTERS):  # only nodes with a cache, or metering energy, have these
            if key in c:
                figures.counters[key] = figures.counters.get(key, 0) + int(c[key] or 0)
    figures.batch_mean = figures.batch_mean / batches if batches else 0.0
    return figures


def health(figures: NodeFigures, dead_letters_grew: bool) -> str:
    """``down`` (no fresh snapshot), ``failing`` (new dead letters), ``lagging``, ``ok`` or ``unknown``."""
    if figures.workers == 0:
        return "unknown"
    if figures.age_s is None or figures.age_s > STALE_S:
        return "down"
    if dead_letters_grew:
        return "failing"
    if figures.lag > LAG_WARN:
        return "lagging"
    return "ok"


class LiveState:
    """The latest figures of every node of one topology, and their recent history."""

    def __init__(self, nodes: list[str], *, history: int = HISTORY) -> None:
        self.nodes = list(nodes)
        self.figures: dict[str, NodeFigures] = {n: NodeFigures(n) for n in nodes}
        self.history: dict[str, deque[dict[str, Any]]] = {n: deque(maxlen=history) for n in nodes}
        self._last: dict[str, tuple[float, dict[str, int]]] = {}  # worker -> (ts_s, counters)
        self.updated_ms = 0

    def update(self, snaps: list[dict[str, Any]], now_ms: int | None = None) -> None:
        """Fold a poll's snapshots (the latest per worker) into figures and one history point per node."""
        now_ms = now_ms or int(time.time() * 1000)
        by_node: dict[str, list[dict[str, Any]]] = {n: [] for n in self.nodes}
        for s in snaps:
            if s.get("node") in by_node:
                by_node[str(s["node"])].append(s)
        for node, mine in by_node.items():
            figures = fold(node, mine, now_ms)
            ok_delta = dead_delta = 0
            seconds = 0.0
            for s in mine:
                worker, ts = str(s.get("worker")), int(s.get("ts_ms", now_ms)) / 1000
                counters = {k: int(s.get("counters", {}).get(k, 0) or 0) for k in COUNTERS}
                before = self._last.get(worker)
                if before is not None and ts > before[0]:
                    ok_delta += max(0, counters["requests_ok"] - before[1]["requests_ok"])
                    dead_delta += max(0, counters["dead_lettered"] - before[1]["dead_lettered"])
                    seconds = max(seconds, ts - before[0])
                if before is None or ts > before[0]:
                    self._last[worker] = (ts, counters)
            previous = self.figures[node]
            figures.rate_rps = ok_delta / seconds if seconds else (previous.rate_rps if mine else 0.0)
            figures.health = health(figures, dead_delta > 0)
            self.figures[node] = figures
            self.history[node].append({"ts_ms": now_ms, "rate_rps": round(figures.rate_rps, 2),
                                       "exec_p99_ms": figures.exec_p99_ms, "lag": figures.lag,
                                       "batch_mean": round(figures.batch_mean, 2)})
        self.updated_ms = now_ms

    def stats(self) -> dict[str, Any]:
        return {"updated_ms": self.updated_ms, "nodes": {n: f.to_dict() for n, f in self.figures.items()}}

    def series(self, last: int | None = None) -> dict[str, list[dict[str, Any]]]:
        return {n: list(h)[-last:] if last else list(h) for n, h in self.history.items()}
