"""Batch policies: how many queued records a stage takes at once.

A policy is a small object the worker asks before each fetch. Swap it to change batching without
touching the worker (the SLO-aware policy of a later issue plugs in here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class BatchPolicy(Protocol):
    def next_size(self, lag: int) -> int:
        """Most records to take in the next batch, given ``lag`` records queued for this worker."""
        ...

    def observe(self, size: int, seconds: float) -> None:
        """Feedback: a batch of ``size`` records took ``seconds`` to process."""
        ...


@dataclass
class LagPolicy:
    """Take what is queued, up to ``max_batch``: batch 1 under light load, large batches in a backlog."""

    max_batch: int = 1024

    def next_size(self, lag: int) -> int:
        return max(1, min(lag, self.max_batch)) if lag > 0 else self.max_batch

    def observe(self, size: int, seconds: float) -> None:
        return None


@dataclass
class FixedPolicy:
    """A static batch size, for baselines in benchmarks."""

    size: int

    def next_size(self, lag: int) -> int:
        return self.size

    def observe(self, size: int, seconds: float) -> None:
        return None
