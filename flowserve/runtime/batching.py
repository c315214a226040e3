"""Batch policies: how many queued records a stage takes at once.

A policy is a small object the worker asks twice per step: ``next_size(lag)`` says how many records
to fetch (and ``max_wait_ms`` how long to keep fetching for more once the first arrived); then, with the
fetched requests' deadlines in hand, ``plan(deadlines, now_ms)`` says which requests to refuse at once
and how many of the rest, from the head of the queue, form the next batch. The worker re-plans after
every batch with the real clock, so a long queue is worked off batch by batch, FIFO.

``LagPolicy`` and ``FixedPolicy`` are the simple baselines, ``TimeoutPolicy`` is the timeout batcher of
Ray Serve and Triton, and ``SLOPolicy`` (the default) plans with execution-time profiles
(:mod:`flowserve.runtime.profiles`) and deadline budgets (:mod:`flowserve.runtime.budget`).

**SLOPolicy.** Per step the worker hands the policy the deadlines of the fetched requests in FIFO order
(at most ``window`` of them: planning costs O(window) per batch, never O(queue) per request).

* *Admission*: a request is refused at once only when it is infeasible even if it ran next, alone:
  ``now + p50(1)`` (its typical time alone) plus the hops and the fastest downstream path ends past its
  deadline (Clockwork: refuse rather than finish late). Nothing that could still make it is refused on
  predicted queueing.
* *Batch*: the largest batch ``b``, no larger than what is queued and the node's maximum, whose predicted
  **p99** lets the earliest node-deadline in it be met. When that is smaller than a full batch and more is
  queued, a full batch is taken when two full batches are queued (a backlog), and otherwise considered:
  both are scored by the misses they predict over the window,
  the chosen batch at its p99 and the batches queued behind it at their **p50** (summing p99s over
  several batches is far too pessimistic); the full batch wins ties (under load throughput is what
  drains the queue and so helps the later deadlines). Only the first batch runs; the worker re-plans with
  the real clock after it. Batches are prefixes of the queue, so a new request never overtakes an old one.

Until the profile knows two batch sizes the policy falls back to Clipper's AIMD: grow the batch by one
while a full batch takes under 90% of its budget, multiply it by 0.9 on a violation.

Policies are plain objects with a fake-clock-friendly API: ``plan(deadlines_ms, now_ms)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flowserve.runtime.budget import Budget, budget_for
from flowserve.runtime.profiles import ExecProfile

if TYPE_CHECKING:
    from flowserve.topology.graph import Topology


@dataclass(frozen=True, slots=True)
class Plan:
    """The next step on a queue of requests (in FIFO order).

    ``refuse``: queue index -> why that request is refused now (it cannot meet its deadline).
    ``take``: how many of the remaining requests (queue order, refused ones removed) form the next batch.
    """

    take: int
    refuse: dict[int, str] = field(default_factory=dict)


class BatchPolicy:
    """What every batch policy offers the worker; subclasses override what differs.

    ``max_wait_ms``: once records arrived, keep fetching this long for a fuller batch (0: do not wait).
    ``window``: most queued requests one ``plan`` looks at (0: four of the node's largest batches).
    ``profile``: the execution-time profile the policy plans with, which the worker keeps live; None when
    the policy plans without one (the worker then keeps its own for metrics).
    """

    max_wait_ms: float = 0.0
    profile: ExecProfile | None = None

    @property
    def window(self) -> int:
        return 0

    def next_size(self, lag: int) -> int:
        """Most records to take in the next batch, given ``lag`` records queued for this worker."""
        raise NotImplementedError

    def observe(self, size: int, seconds: float) -> None:
        """Feedback: a batch of ``size`` records took ``seconds`` to process."""

    def plan(self, deadlines: Sequence[float | None], now_ms: float) -> Plan:
        """Which of the queued requests (their deadlines, FIFO) to refuse now, and how many form the next batch."""
        raise NotImplementedError


@dataclass
class LagPolicy(BatchPolicy):
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
class FixedPolicy(BatchPolicy):
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


@dataclass
class SLOPolicy(BatchPolicy):
    """The largest batch whose predicted p99 still meets the earliest deadline in it; refuse the hopeless.

    Example with a fake clock (deadlines and ``now`` in epoch milliseconds)::

        policy = SLOPolicy(max_batch=32, profile=ExecProfile({1: 0.001, 32: 0.010}))
        policy.plan([1_000_050.0] * 40, now_ms=1_000_000.0)   # Plan(take=32, refuse={})
    """

    max_batch: int = 256
    profile: ExecProfile = field(default_factory=ExecProfile)
    budget: Budget = field(default_factory=Budget)
    #: fetch and plan over up to ``lookahead * max_batch`` queued records (the planning window).
    lookahead: int = 4
    max_wait_ms: float = 0.0
    #: AIMD state (used while the profile is not ready).
    aimd_size: int = 1
    _aimd_budget_s: float | None = field(default=None, repr=False)
    _aimd_full: bool = field(default=False, repr=False)

    def next_size(self, lag: int) -> int:
        cap = self.max_batch * self.lookahead
        return max(1, min(lag, cap)) if lag > 0 else self.max_batch

    @property
    def window(self) -> int:
        """Most queued requests one ``plan`` looks at (the worker hands it no more)."""
        return max(1, self.max_batch * self.lookahead)

    @property
    def mode(self) -> str:
        return "profile" if self.profile.ready else "aimd"

    def observe(self, size: int, seconds: float) -> None:
        """AIMD feedback (Clipper); the profile itself is fed by the worker."""
        if self.profile.ready:
            return
        budget = self._aimd_budget_s
        if budget is not None and seconds > budget:
            self.aimd_size = max(1, int(self.aimd_size * 0.9))
        elif self._aimd_full and (budget is None or seconds < 0.9 * budget):
            self.aimd_size = min(self.max_batch, self.aimd_size + 1)

    def plan(self, deadlines: Sequence[float | None], now_ms: float) -> Plan:
        if not deadlines:
            return Plan(take=0)
        if self.profile.ready:
            return self._plan_profile(deadlines, now_ms)
        return self._plan_aimd(deadlines, now_ms)

    def _refusal(self, deadline: float, at_ms: float, exec_s: float, now_ms: float) -> str | None:
        """Why a request due at ``deadline`` cannot be served if its batch starts at ``at_ms`` (or None)."""
        if at_ms + exec_s * 1000 <= self.budget.latest_finish(deadline):
            return None
        after = (self.budget.reserve_s + self.budget.downstream_s) * 1000
        return (f"cannot finish before its deadline: {deadline - now_ms:.1f} ms left, predicted "
                f"{at_ms - now_ms + exec_s * 1000:.1f} ms of queueing and execution here "
                f"+ {after:.1f} ms downstream")

    def _plan_profile(self, deadlines: Sequence[float | None], now_ms: float) -> Plan:
        window = self.window
        if len(deadlines) > window:
            deadlines = deadlines[:window]
        p99 = self.profile.p99
        budget = self.budget
        # Admission: refuse only what cannot make it even if it ran next, alone, in a typical (p50) time.
        p1_ms = (self.profile.p50(1) or 0.0) * 1000
        hopeless = now_ms + p1_ms + (budget.reserve_s + budget.downstream_s) * 1000
        refuse: dict[int, str] = {}
        local: list[float] = []  # node-deadlines of the requests kept, in FIFO order
        share, keep_ms = budget.share, now_ms + budget.reserve_s * 1000
        for i, d in enumerate(deadlines):
            if d is None:
                local.append(math.inf)
            elif d < hopeless:
                refuse[i] = self._refusal(d, now_ms, p1_ms / 1000, now_ms) or "cannot finish before its deadline"
            else:
                local.append(now_ms + share * (d - keep_ms))
        n = len(local)
        if not n:
            return Plan(take=0, refuse=refuse)
        cap = min(n, self.max_batch)
        # The largest prefix whose p99 meets the earliest node-deadline in it (at least 1: FIFO).
        best, earliest = 1, local[0]
        for size in range(2, cap + 1):
            earliest = min(earliest, local[size - 1])
            if now_ms + (p99(size) or 0.0) * 1000 > earliest:
                break
            best = size
        if best < cap and (n >= 2 * self.max_batch  # a backlog: throughput is what saves the later deadlines
                           or self._misses(local, cap, now_ms) <= self._misses(local, best, now_ms)):
            best = cap  # a full batch loses no more deadlines and drains the queue faster
        return Plan(take=best, refuse=refuse)

    def _misses(self, local: list[float], first: int, now_ms: float) -> int:
        """Predicted deadline misses over ``local`` when the next batch is ``first`` requests (at its p99)
        and the rest follow in full batches (at their p50). O(len(local))."""
        p99, p50, top = self.profile.p99, self.profile.p50, self.max_batch
        t = now_ms + (p99(first) or 0.0) * 1000
        misses = sum(1 for d in local[:first] if d < t)
        pos, n = first, len(local)
        while pos < n:
            size = min(top, n - pos)
            t += (p50(size) or 0.0) * 1000
            misses += sum(1 for d in local[pos:pos + size] if d < t)
            pos += size
        return misses

    def _plan_aimd(self, deadlines: Sequence[float | None], now_ms: float) -> Plan:
        if len(deadlines) > self.window:
            deadlines = deadlines[:self.window]
        refuse: dict[int, str] = {}
        live: list[int] = []
        for i, d in enumerate(deadlines):
            if d is not None and (why := self._refusal(d, now_ms, 0.0, now_ms)) is not None:
                refuse[i] = why
            else:
                live.append(i)
        if all(d is None for d in deadlines):
            # No deadline to protect: take what is queued, as the lag policy does (throughput only).
            return Plan(take=min(len(live), self.max_batch), refuse=refuse)
        take = min(len(live), self.aimd_size, self.max_batch)
        budgets = [self.budget.node_deadline(d, now_ms) - now_ms
                   for d in (deadlines[i] for i in live[:take]) if d is not None]
        self._aimd_budget_s = min(budgets) / 1000 if budgets else None
        self._aimd_full = take >= self.aimd_size
        return Plan(take=take, refuse=refuse)


@dataclass
class TimeoutPolicy(BatchPolicy):
    """Timeout batching as Ray Serve's ``@serve.batch`` and Triton's dynamic batcher do it: once a request
    is there, wait up to ``max_wait_ms`` for ``max_batch`` of them, then run what arrived."""

    max_batch: int = 32
    max_wait_ms: float = 10.0

    def next_size(self, lag: int) -> int:
        return self.max_batch

    def observe(self, size: int, seconds: float) -> None:
        return None

    def plan(self, deadlines: Sequence[float | None], now_ms: float) -> Plan:
        return Plan(take=max(1, min(len(deadlines), self.max_batch)))


def make_policy(topology: Topology, node_id: str, profile: ExecProfile | None = None,
                profiles: dict[str, ExecProfile | None] | None = None) -> BatchPolicy:
    """The policy a node's ``batching:`` entry asks for (``slo`` by default)."""
    node = topology.nodes[node_id]
    spec = topology.spec.nodes.get(node_id)
    batching = spec.batching if spec is not None else None
    kind = batching.policy if batching is not None else "slo"
    if kind == "lag":
        return LagPolicy(node.max_batch)
    if kind == "fixed":
        size = (batching.size if batching is not None else None) or node.max_batch
        return FixedPolicy(size, fetch=max(size, 4 * node.max_batch))
    if kind == "timeout":
        size = (batching.size if batching is not None else None) or node.max_batch
        wait = batching.max_wait_ms if batching is not None and batching.max_wait_ms else 10.0
        return TimeoutPolicy(min(size, node.max_batch), wait)
    hop_ms = batching.hop_ms if batching is not None else 2.0
    profiles = dict(profiles or {})
    if profile is not None:
        profiles[node_id] = profile
    return SLOPolicy(max_batch=node.max_batch, profile=profile or ExecProfile(),
                     budget=budget_for(topology, node_id, profiles, hop_ms))


def describe(policy: object) -> str:
    if isinstance(policy, SLOPolicy):
        return f"slo({policy.mode}, share={policy.budget.share:.2f})"
    return type(policy).__name__
