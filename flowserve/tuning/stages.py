"""What the planner knows of a stage (:class:`StageOptions`) and what it chooses for one (:class:`StageConfig`):
plain records at the bottom of the tuning package, so that the planner's bounds and search both use them."""

from __future__ import annotations

from dataclasses import dataclass, field


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
