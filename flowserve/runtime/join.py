"""Per-request joins for nodes that read several topics (fan-in) or wait on triggers.

Semantics per node (Seldon Core 2's): ``inner`` waits for every input within the window and fails the
request with an error result when the window closes first; ``outer`` waits the window, then goes with
what arrived (every port needs at least one source); ``any`` fires on the first complete alternative and
drops later arrivals; ``deadline`` (an ensemble's) fires when every input is in or at ``fraction`` of
the request's remaining deadline, with what arrived: absent inputs are zero-filled and named in
``Ready.absent``, an input's error result counts as absent, and arrivals after it fired are dropped
(counted in ``late``), so a request is answered once. Fire times sit in one heap per buffer (per worker),
which the worker's loop drains each step: no timer or coroutine per request.

Memory: a pending request lives at most ``window_ms``; the ids already answered are remembered, the
``remember`` most recent; a deadline join also drops any arrival past its request's deadline, so an
answered id forgotten early cannot start a second answer unless ``remember`` requests were answered
within one deadline.

The buffer holds no state Kafka does not also hold: the worker never commits past the oldest record a
pending join still needs, so a restarted worker rebuilds its buffers by re-reading those records.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from flowserve.errors import ErrorKind, Failure
from flowserve.topology.graph import Node
from flowserve.wire.envelope import Envelope
from flowserve.wire.tensors import DATATYPES

TP = tuple[str, int]


@dataclass(slots=True)
class Ready:
    """A request whose inputs are complete (or whose join failed, when ``error`` is set)."""

    request_id: str
    tensors: dict[str, np.ndarray]
    headers: dict[str, bytes]
    partition: int
    error: Failure | None = None
    #: the records the join assembled this request from: ((topic, partition), offset), for lineage.
    offsets: list[tuple[TP, int]] = field(default_factory=list)
    #: input ports that had not arrived when a deadline join fired (zero-filled in ``tensors``).
    absent: tuple[str, ...] = ()


@dataclass(slots=True)
class _Pending:
    first_ms: int
    partition: int
    arrived: dict[str, Envelope] = field(default_factory=dict)  # topic -> envelope
    offsets: list[tuple[TP, int]] = field(default_factory=list)
    #: deadline join: topic -> an error result that came instead of the input (counted as absent)
    failed: dict[str, Envelope] = field(default_factory=dict)


class JoinBuffer:
    def __init__(self, node: Node, *, remember: int = 100_000) -> None:
        self.node = node
        self.kind = node.join.type
        self.window_ms = node.join.window_ms
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        # Ids already emitted, so late or duplicate arrivals are dropped (bounded: oldest forgotten).
        self._done: OrderedDict[str, None] = OrderedDict()
        self._remember = remember
        self._trigger_topics = {s.topic for s in node.triggers}
        #: deadline join: (fire at ms, request key) for every pending request; stale entries (already
        #: complete) are skipped when they come up.
        self._timers: list[tuple[int, str]] = []
        #: deadline join: inputs dropped because the request had already been answered (or was past due).
        self.late = 0
        #: deadline join: requests that went at their fire time with inputs absent.
        self.partial = 0

    def fire_at(self, env: Envelope, now_ms: int) -> int:
        """When a deadline join gives up waiting for a request whose first input arrived at ``now_ms``.

        ``fraction`` of the time left to the request's deadline, or ``timeout_ms`` without one; never more
        than ``window_ms``.
        """
        join = self.node.join
        deadline = env.deadline_ms
        wait = join.timeout_ms if deadline is None else max(0, int(join.fraction * (deadline - now_ms)))
        return now_ms + min(wait, self.window_ms)

    def next_fire(self) -> int | None:
        """The earliest pending fire time (ms), for the worker's poll timeout; None when nothing waits."""
        while self._timers and self._timers[0][1] not in self._pending:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def __len__(self) -> int:
        return len(self._pending)

    def _assemble(self, p: _Pending) -> dict[str, np.ndarray] | None:
        tensors: dict[str, np.ndarray] = {}
        for port, sources in self.node.bindings.items():
            for src in sources:
                env = p.arrived.get(src.topic)
                if env is not None and src.tensor in env.tensors:
                    tensors[port] = env.tensors[src.tensor]
                    break
            else:
                return None
        return tensors

    def _triggers_ok(self, p: _Pending, *, any_one: bool) -> bool:
        if not self._trigger_topics:
            return True
        hits = sum(1 for t in self._trigger_topics if t in p.arrived)
        return hits > 0 if any_one else hits == len(self._trigger_topics)

    def _partial(self, p: _Pending) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
        """Deadline join: the inputs present, absent ports zero-filled with as many rows, and their names."""
        tensors: dict[str, np.ndarray] = {}
        absent: list[str] = []
        for port, (src,) in self.node.bindings.items():
            env = p.arrived.get(src.topic)
            if env is not None and src.tensor in env.tensors:
                tensors[port] = env.tensors[src.tensor]
            else:
                absent.append(port)
        rows = next(iter(tensors.values())).shape[0]
        for port in absent:
            spec = self.node.component.inputs[port]
            dtype = DATATYPES[spec.datatype]
            shape = (rows, *spec.shape[1:])
            tensors[port] = np.full(shape, b"", dtype=object) if spec.datatype == "BYTES" else np.zeros(shape, dtype)
        return tensors, tuple(absent)

    def _fire(self, rid: str, p: _Pending) -> Ready:
        """Deadline join: answer with what arrived (or fail when every input came as an error)."""
        if not any(src.topic in p.arrived for (src,) in self.node.bindings.values()):
            return self._finish(rid, p, None, next(iter(p.failed.values())).error)
        tensors, absent = self._partial(p)
        if absent:
            self.partial += 1
        ready = self._finish(rid, p, tensors, None)
        ready.absent = absent
        return ready

    def _finish(self, request_id: str, p: _Pending, tensors: dict[str, np.ndarray] | None,
                error: Failure | None) -> Ready:
        del self._pending[request_id]
        self._done[request_id] = None
        if len(self._done) > self._remember:
            self._done.popitem(last=False)
        first = next(iter((p.arrived or p.failed).values()))
        headers = dict(first.headers)
        tightest = first.deadline_ms
        for env in p.arrived.values():  # the tightest deadline of the inputs wins
            d = env.deadline_ms
            if d is not None and (tightest is None or d < tightest):
                tightest = d
                headers["fs-deadline"] = str(d).encode()
        return Ready(first.request_id, tensors or {}, headers, p.partition, error, p.offsets)

    def add(self, env: Envelope, topic: str, tp: TP, offset: int, now_ms: int,
            key: str | None = None) -> Ready | None:
        """Record one arrival; returns the request when it is ready (or failed) now.

        ``key`` tells visits of one request apart (a cycle brings it back to the same node); it defaults
        to the request id.
        """
        rid = key or env.request_id
        if self.kind == "deadline":
            return self._add_deadline(rid, env, topic, tp, offset, now_ms)
        if rid in self._done:
            return None
        p = self._pending.get(rid)
        if p is None:
            p = self._pending[rid] = _Pending(now_ms, tp[1])
        p.arrived.setdefault(topic, env)
        p.offsets.append((tp, offset))
        if env.error is not None:
            return self._finish(rid, p, None, env.error)
        tensors = self._assemble(p)
        if tensors is None:
            return None
        if self.kind == "any":
            if self._triggers_ok(p, any_one=True):
                return self._finish(rid, p, tensors, None)
            return None
        if len(p.arrived) == len(self.node.input_topics):
            return self._finish(rid, p, tensors, None)
        return None

    def _add_deadline(self, rid: str, env: Envelope, topic: str, tp: TP, offset: int, now_ms: int) -> Ready | None:
        p = self._pending.get(rid)
        if p is None:
            deadline = env.deadline_ms
            if rid in self._done or (deadline is not None and deadline <= now_ms):
                # Answered already, or nobody waits any more: a new entry would answer a second time.
                self.late += 1
                return None
            p = self._pending[rid] = _Pending(now_ms, tp[1])
            heapq.heappush(self._timers, (self.fire_at(env, now_ms), rid))
        p.offsets.append((tp, offset))
        if env.error is not None:
            p.failed.setdefault(topic, env)
        else:
            p.arrived.setdefault(topic, env)
        if len(p.arrived) + len(p.failed) < len(self.node.input_topics):
            return None
        return self._fire(rid, p)

    def expire(self, now_ms: int) -> list[Ready]:
        """Close the joins whose window (deadline join: fire time) has passed."""
        out: list[Ready] = []
        if self.kind == "deadline":
            while self._timers and self._timers[0][0] <= now_ms:
                _, rid = heapq.heappop(self._timers)
                p = self._pending.get(rid)
                if p is not None:
                    out.append(self._fire(rid, p))
            return out
        while self._pending:
            rid, p = next(iter(self._pending.items()))
            if now_ms - p.first_ms < self.window_ms:
                break
            tensors = self._assemble(p)
            if self.kind == "outer" and tensors is not None:
                out.append(self._finish(rid, p, tensors, None))
                continue
            missing = [t for t in self.node.input_topics if t not in p.arrived]
            out.append(self._finish(rid, p, None, Failure(
                ErrorKind.JOIN_TIMEOUT,
                f"node '{self.node.id}': {self.kind} join window of {self.window_ms} ms closed "
                f"without input from {', '.join(missing)}",
            )))
        return out

    def oldest_offsets(self) -> dict[TP, int]:
        """Per topic-partition, the oldest offset a pending join still needs (commit must stay below it)."""
        oldest: dict[TP, int] = {}
        for p in self._pending.values():
            for tp, off in p.offsets:
                if off < oldest.get(tp, off + 1):
                    oldest[tp] = off
        return oldest

    def drop_partitions(self, partitions: set[int]) -> None:
        """Forget joins of partitions this worker no longer owns; their new owner re-reads them."""
        for rid in [rid for rid, p in self._pending.items() if p.partition in partitions]:
            del self._pending[rid]  # its timer, if any, is skipped when it comes up
