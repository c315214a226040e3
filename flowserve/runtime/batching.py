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
  deadline (Clockwork: refuse rather than finish late).
* *Doomed* (Clockwork's early drop): a request that could make it alone, but not behind the requests
  kept ahead of it even were they worked off in full batches at their median, is answered at once with a
  deadline error (``Plan.doomed``), so its work goes to those that can still make it. Predicted completion
  = now + the full batches ahead + its own batch, each at its p50 plus the worker's per-batch overhead.
* *Batch*: the largest batch ``b``, no larger than what is queued and the node's maximum, whose predicted
  **p99** lets the earliest node-deadline in it be met. When that is smaller than what is queued, a full
  batch is taken when two full batches are queued (a backlog); otherwise the candidates double from ``b``
  up to a full batch, each scored by the misses it predicts over the window (the candidate at its p99,
  the batches queued behind it in full batches at their **p50**: summing p99s over several batches is far
  too pessimistic); fewest misses wins, the larger batch on ties (under load throughput is what drains the
  queue and so helps the later deadlines). Only the first batch runs; the worker re-plans with the real
  clock after it. Batches are prefixes of the queue, so a new request never overtakes an old one.
* *Overhead*: the profile times ``process`` only; the worker also reports what each batch cost it besides
  (assembling, encoding, producing: ``observe_overhead``), and every prediction adds it once per batch,
  which is what makes many small batches dear on a long queue.

Until the profile knows two batch sizes the policy falls back to Clipper's AIMD: grow the batch by one
while a full batch takes under 90% of its budget, multiply it by 0.9 on a violation.

Policies are plain objects with a fake-clock-friendly API: ``plan(deadlines_ms, now_ms)``.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flowserve.runtime.budget import Budget, budget_for
from flowserve.runtime.profiles import ExecProfile

if TYPE_CHECKING:
    from flowserve.topology.graph import Topology


#: the worker's per-batch overhead is the median of this many of its last reports
OVERHEAD_WINDOW = 51


@dataclass(frozen=True, slots=True)
class Plan:
    """The next step on a queue of requests (in FIFO order).

    ``refuse``: queue index -> why that request is refused now (it cannot meet its deadline even alone).
    ``doomed``: queue index -> why that request is answered now with a deadline error (see below).
    ``take``: how many of the remaining requests (queue order, refused and doomed removed) form the next batch.
    """

    take: int
    refuse: dict[int, str] = field(default_factory=dict)
    #: queue index -> why that request is answered now with a deadline error: it could make its deadline
    #: alone, but not behind the requests ahead of it (Clockwork's early drop).
    doomed: dict[int, str] = field(default_factory=dict)


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

    def observe_overhead(self, seconds: float) -> None:
        """Feedback: besides ``process``, a batch cost the worker ``seconds`` (assembling it, encoding and
        producing its results): what the execution-time profile does not see."""

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
    #: the worker's own cost per batch besides ``process`` (seconds; the median of what it reports):
    #: it is paid once per batch, so it is what makes small batches dear when the queue is long.
    overhead_s: float = 0.0
    _overheads: deque[float] = field(default_factory=lambda: deque(maxlen=OVERHEAD_WINDOW), repr=False)
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

    def observe_overhead(self, seconds: float) -> None:
        """The median of the last ``OVERHEAD_WINDOW`` reports: one stall (a collection, the process
        descheduled on a busy machine) must not make every batch look dear and the policy drop requests."""
        if math.isfinite(seconds) and seconds >= 0:
            self._overheads.append(seconds)
            self.overhead_s = statistics.median(self._overheads)

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
        top = self.max_batch
        most = min(top, len(deadlines))  # the largest batch this plan can take
        p99, p50 = self.profile.curve(99, most), self.profile.curve(50, most)
        budget, over = self.budget, self.overhead_s
        after_ms = (budget.reserve_s + budget.downstream_s) * 1000
        # Earliest finish of the request at kept position k, were the queue worked in full batches at their
        # median (the fastest FIFO can go): full batches ahead, then its own batch of what remains.
        full_ms = ((self.profile.p50(top) or 0.0) + over) * 1000
        part_ms = [0.0, *((p50[b] + over) * 1000 for b in range(1, most + 1))]
        refuse: dict[int, str] = {}
        doomed: dict[int, str] = {}
        local: list[float] = []  # node-deadlines of the requests kept, in FIFO order
        share, keep_ms = budget.share, now_ms + budget.reserve_s * 1000
        for i, d in enumerate(deadlines):
            if d is None:
                local.append(math.inf)
                continue
            k = len(local)
            ahead_ms = (k // top) * full_ms
            finish = now_ms + ahead_ms + part_ms[k % top + 1]
            if d - after_ms >= finish:
                local.append(now_ms + share * (d - keep_ms))
            elif d - after_ms < now_ms + part_ms[1]:
                # Admission: it could not make it even if it ran next, alone, in a typical time.
                refuse[i] = self._refusal(d, now_ms, part_ms[1] / 1000, now_ms) or "cannot finish before its deadline"
            else:
                # Doomed (Clockwork): it could have made it alone, but not behind the queue ahead of it
                # even at full batches; answering now gives its work to the requests that can still make it.
                doomed[i] = (f"deadline cannot be met: {d - now_ms:.1f} ms left, {k} requests ahead "
                             f"(~{ahead_ms + part_ms[k % top + 1]:.1f} ms at full batches) "
                             f"+ {after_ms:.1f} ms downstream")
        n = len(local)
        if not n:
            return Plan(take=0, refuse=refuse, doomed=doomed)
        cap = min(n, top)
        # The largest prefix whose p99 meets the earliest node-deadline in it (at least 1: FIFO).
        best, earliest = 1, local[0]
        for size in range(2, cap + 1):
            earliest = min(earliest, local[size - 1])
            if now_ms + (p99[size] + over) * 1000 > earliest:
                break
            best = size
        if best < cap:
            if n >= 2 * top:
                best = cap  # a backlog: throughput is what saves the later deadlines
            else:
                # Fewer misses over the window wins; the larger batch wins ties (it drains the queue faster).
                # Candidates double from the fitting batch: O(window * log(max_batch)) per plan.
                misses, size = self._misses(local, best, now_ms), best
                while size < cap:
                    size = min(cap, size * 2)
                    m = self._misses(local, size, now_ms)
                    if m <= misses:
                        best, misses = size, m
        return Plan(take=best, refuse=refuse, doomed=doomed)

    def _misses(self, local: list[float], first: int, now_ms: float) -> int:
        """Predicted deadline misses over ``local`` when the next batch is ``first`` requests (at its p99)
        and the rest follow in full batches (at their p50). O(len(local))."""
        top, over = self.max_batch, self.overhead_s
        p99, p50 = self.profile.curve(99, first), self.profile.curve(50, min(top, len(local)))
        t = now_ms + (p99[first] + over) * 1000
        misses = sum(1 for d in local[:first] if d < t)
        pos, n = first, len(local)
        while pos < n:
            size = min(top, n - pos)
            t += (p50[size] + over) * 1000
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
