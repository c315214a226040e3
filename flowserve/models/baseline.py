"""The contender without a scheduler: load on demand, evict the least recently used, serve in arrival order.

What a model server that loads and unloads models but schedules nothing does (Triton's and MLServer's
explicit model control, driven by requests): the compute lane runs the oldest waiting request whose model is
resident, batched with that model's other waiting requests (dynamic batching, up to ``max_batch``); the copy
lane loads the model of the oldest waiting request that is not resident, evicting the least recently used
models that are not in use. It knows no deadlines: it refuses nothing and answers everything, late or not.
It shares the lanes and memory of :class:`~flowserve.models.scheduler.Scheduler`, so the two differ in
policy alone.
"""

from __future__ import annotations

import math
from collections import deque

from flowserve.models.catalogue import Catalogue
from flowserve.models.scheduler import Action, Lanes, Step


class LruServer(Lanes):
    """Load-on-demand LRU in arrival order, for one worker."""

    def __init__(self, catalogue: Catalogue, capacity: int, *, max_batch: int = 16, margin: float = 1.0) -> None:
        super().__init__(catalogue, capacity, max_batch=max_batch, margin=margin)
        self.queues: dict[str, deque[tuple[float, int]]] = {}  # model -> (arrival, request id), oldest first

    def submit(self, rid: int, model: str, *, deadline: float, now: float) -> None:  # noqa: ARG002 - no deadlines
        self.spec(model)
        self.queues.setdefault(model, deque()).append((now, rid))

    def step(self, now: float) -> Step:
        out = Step()
        if self.compute is None and (batch := self._batch(now)) is not None:
            out.actions.append(batch)
        if self.copy is None and (load := self._load(now)) is not None:
            out.actions.append(load)
        return out

    def _batch(self, now: float) -> Action | None:
        runnable = [(q[0], m) for m, q in self.queues.items() if m in self.ready]
        if not runnable:
            return None
        _, model = min(runnable)
        queue = self.queues[model]
        taken = tuple(queue.popleft()[1] for _ in range(min(len(queue), self.max_batch)))
        if not queue:
            del self.queues[model]
        return self.start_batch(model, taken, now, math.inf)

    def _load(self, now: float) -> Action | None:
        cold = [(q[0], m) for m, q in self.queues.items() if m not in self.ready and m not in self.loading]
        if not cold:
            return None
        _, model = min(cold)
        evict = self.memory.victims(self.spec(model).size_bytes, now=now, next_use={})  # no prediction: LRU
        if evict is None:
            return None  # every resident model is in use: wait for one to finish
        return self.start_load(model, evict, now, math.inf)
