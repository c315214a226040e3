"""Per-request joins for nodes that read several topics (fan-in) or wait on triggers.

Semantics per node (Seldon Core 2's): ``inner`` waits for every input within the window and fails the
request with an error result when the window closes first; ``outer`` waits the window, then goes with
what arrived (every port needs at least one source); ``any`` fires on the first complete alternative and
drops later arrivals.

The buffer holds no state Kafka does not also hold: the worker never commits past the oldest record a
pending join still needs, so a restarted worker rebuilds its buffers by re-reading those records.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from flowserve.errors import ErrorKind, Failure
from flowserve.topology.graph import Node
from flowserve.wire.envelope import Envelope

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


@dataclass(slots=True)
class _Pending:
    first_ms: int
    partition: int
    arrived: dict[str, Envelope] = field(default_factory=dict)  # topic -> envelope
    offsets: list[tuple[TP, int]] = field(default_factory=list)


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

    def _finish(self, request_id: str, p: _Pending, tensors: dict[str, np.ndarray] | None,
                error: Failure | None) -> Ready:
        del self._pending[request_id]
        self._done[request_id] = None
        if len(self._done) > self._remember:
            self._done.popitem(last=False)
        first = next(iter(p.arrived.values()))
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

    def expire(self, now_ms: int) -> list[Ready]:
        """Close the joins whose window has passed."""
        out: list[Ready] = []
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
            del self._pending[rid]
