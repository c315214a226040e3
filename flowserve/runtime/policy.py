"""Batch policies: how many queued records a stage takes at once.

A policy is a small object the worker asks twice per step: ``next_size(lag)`` says how many records
to fetch (and ``max_wait_ms`` how long to keep fetching for more once the first arrived); then, with the
fetched requests' deadlines in hand, ``plan(deadlines, now_ms)`` says which requests to refuse at once
and how many of the rest, from the head of the queue, form the next batch. The worker re-plans after
every batch with the real clock, so a long queue is worked off batch by batch, FIFO.

``LagPolicy`` and ``FixedPolicy`` are the simple baselines; the SLO-aware policy, the timeout batcher
and the execution-time profiles live in :mod:`flowserve.runtime.batching`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Plan:
    """The next step on a queue of requests (in FIFO order).

    ``refuse``: queue index -> why that request is refused now (it cannot meet its deadline).
    ``take``: how many of the remaining requests (queue order, refused ones removed) form the next batch.
    """

    take: int
    refuse: dict[int, str] = field(default_factory=dict)


class BatchPolicy(Protocol):
    def next_size(self, lag: int) -> int:
        """Most records to take in the next batch, given ``lag`` records queued for this worker."""
        ...

    def observe(self, size: int, seconds: float) -> None:
        """Feedback: a batch of ``size`` records took ``seconds`` to process."""
        ...


def plan_with(policy: BatchPolicy, deadlines: Sequence[float | None], now_ms: float) -> Plan:
    """``policy.plan`` when the policy has one; otherwise batches of ``next_size`` (older policies)."""
    plan = getattr(policy, "plan", None)
    if plan is not None:
        return plan(deadlines, now_ms)
    return Plan(take=max(1, min(len(deadlines), policy.next_size(len(deadlines)))))


@dataclass
class LagPolicy:
    """Take what is queued, up to ``max_batch``: batch 1 under light load, large batches in a backlog."""

    max_batch: int = 1024
    max_wait_ms: float = 0.0

    def next_size(self, lag: int) -> int:
        return max(1, min(lag, self.max_batch)) if lag > 0 else self.max_batch

    def observe(self, size: int, seconds: float) -> None:
        return None

    def plan(self, deadlines: Sequence[float | None], now_ms: float) -> Plan:
        return Plan(take=max(1, min(len(deadlines), self.max_batch)))


@dataclass
class FixedPolicy:
    """A static batch size (up to ``size`` of what is queued, without waiting), for baselines in benchmarks.

    ``fetch``: records to fetch per step when more are queued (0: ``size``); each ``process`` call still
    gets at most ``size``, so a small static batch does not also pay a fetch and a commit per batch.
    """

    size: int
    max_wait_ms: float = 0.0
    fetch: int = 0

    def next_size(self, lag: int) -> int:
        if self.fetch > self.size and lag > self.size:
            return min(lag, self.fetch)
        return self.size

    def observe(self, size: int, seconds: float) -> None:
        return None

    def plan(self, deadlines: Sequence[float | None], now_ms: float) -> Plan:
        return Plan(take=max(1, min(len(deadlines), self.size)))
