"""What the planner knows of a stage (:class:`StageOptions`) and what it chooses for one (:class:`StageConfig`):
plain records at the bottom of the tuning package, so that the planner's bounds and search both use them;
and what a configuration means: its stages in the simulator, its price, its partitions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from flowserve.tuning.simulate import SimStage


@dataclass(frozen=True)
class StageConfig:
    hardware: str
    max_batch: int
    consumers: int


@dataclass
class StageOptions:
    """A node as the planner sees it: its wiring and a latency table per hardware kind it runs on."""

    id: str
    tables: dict[str, dict[int, float]]
    inputs: list[tuple[str | None, str]]
    join: str = "inner"
    fractions: dict[str, float] = field(default_factory=dict)
    output: bool = False


def sim_stages(options: Sequence[StageOptions], config: dict[str, StageConfig]) -> list[SimStage]:
    return [SimStage(o.id, o.tables[config[o.id].hardware], o.inputs, config[o.id].consumers,
                     config[o.id].max_batch, o.join, o.fractions, o.output) for o in options]


def cost(config: dict[str, StageConfig], prices: dict[str, float]) -> float:
    return sum(c.consumers * prices[c.hardware] for c in config.values())


def partitions_for(config: dict[str, StageConfig], minimum: int = 1, headroom: float = 2.0) -> int:
    """The topology's partitions under ``config``: at least the most consumers of any stage times
    ``headroom``, and up to twice that, the count that spreads most evenly over every stage's consumers
    (the range assignor gives some consumers ``ceil(P / c)`` partitions: the worst such excess decides)."""
    base = max(minimum, math.ceil(max(c.consumers for c in config.values()) * headroom))
    counts = {c.consumers for c in config.values() if c.consumers > 1}

    def excess(p: int) -> float:
        return max((math.ceil(p / c) * c / p for c in counts), default=1.0)

    return min(range(base, 2 * base), key=lambda p: (excess(p), p)) if counts else base
