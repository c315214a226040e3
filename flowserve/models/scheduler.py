"""The predictive scheduler of a many-model worker (Clockwork's action windows), pure and deterministic.

A worker has two lanes, as a GPU has: the copy lane loads one model at a time over the host link, the
compute lane runs one batch at a time; they overlap. Whenever a lane is free, :meth:`Scheduler.step` picks
its next action by earliest deadline, from predicted times (each model's batch table and load time, times
``margin``, the ratio of a high percentile of the measured times to their mean):

- **compute**: among resident models with requests waiting, the one whose earliest deadline is first; its
  batch is the most of its waiting requests (earliest deadlines first, up to ``max_batch``) whose predicted
  end is within that earliest deadline.
- **copy**: among models not resident with requests waiting, the one whose earliest deadline is first and
  whose load can make room (:meth:`~flowserve.models.memory.DeviceMemory.victims`: the resident model whose
  next predicted use is furthest away goes first, and none needed before the newcomer is); the load must
  end in time for a batch of one before that deadline. When the lane cannot make every waiting load's
  deadline, the loads that cost the most copy time per waiting request give way (:meth:`Scheduler._load_order`).

Every action carries its window (the latest predicted end that still serves its earliest request) and no
action starts whose predicted end is past it. A request whose earliest possible answer (its model's next
free compute slot, after its load where it is not resident) is past its deadline is refused at once, early,
with kind ``deadline``, rather than answered late.

>>> from flowserve.models.catalogue import Catalogue
>>> cat = Catalogue.emulated(2)
>>> s = Scheduler(cat, capacity=cat.total_bytes)
>>> s.submit(0, "m-00000", deadline=0.1, now=0.0)
>>> [(a.kind.value, a.model) for a in s.step(0.0).actions]  # not resident: load it first
[('load', 'm-00000')]
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from flowserve.errors import ErrorKind, FlowserveError
from flowserve.models.catalogue import Catalogue, ModelSpec
from flowserve.models.memory import DeviceMemory, Predictor


class ActionKind(StrEnum):
    LOAD = "load"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class Action:
    """One load or one batch, started at ``start`` with predicted end ``end``."""

    kind: ActionKind
    model: str
    start: float
    end: float
    #: the latest predicted end that still serves the action's earliest request
    window: float
    requests: tuple[int, ...] = ()
    evicted: tuple[str, ...] = ()


@dataclass(slots=True)
class Step:
    """What one :meth:`Scheduler.step` started, and the requests it refused (kind ``deadline``)."""

    actions: list[Action] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    #: when to step again though nothing happens (the next time a waiting request would become too late)
    wake: float = math.inf


#: the kind of a refused request's error result
REFUSED_KIND = ErrorKind.DEADLINE


class Lanes:
    """The state a policy shares: the catalogue, device memory, the two lanes and what is loaded."""

    def __init__(self, catalogue: Catalogue, capacity: int, *, max_batch: int = 16, margin: float = 1.0) -> None:
        if max_batch < 1 or margin < 1.0:
            raise FlowserveError(f"max_batch {max_batch} must be >= 1 and margin {margin} >= 1 (a prediction "
                                 "below the mean is no bound)", kind=ErrorKind.INVALID_SETTINGS)
        self.catalogue = catalogue
        self.memory = DeviceMemory(capacity)
        self.max_batch = max_batch
        self.margin = margin
        self.ready: set[str] = set()  # resident, loaded
        self.loading: dict[str, float] = {}  # model -> predicted end of its load
        self.compute: Action | None = None
        self.copy: Action | None = None
        self.refusals: Counter[str] = Counter()
        #: a lane changed since the last step (every waiting request's earliest answer may have moved)
        self.dirty = True

    def spec(self, model: str) -> ModelSpec:
        return self.catalogue.spec(model)

    def batch_s(self, model: str, n: int) -> float:
        return self.spec(model).batch_s(n) * self.margin

    def load_s(self, model: str) -> float:
        return self.spec(model).load_s * self.margin

    def compute_free(self, now: float) -> float:
        return max(now, self.compute.end) if self.compute else now

    def copy_free(self, now: float) -> float:
        return max(now, self.copy.end) if self.copy else now

    def start_batch(self, model: str, requests: tuple[int, ...], now: float, window: float) -> Action:
        action = Action(ActionKind.BATCH, model, now, now + self.batch_s(model, len(requests)), window, requests)
        self.memory.pin(model)
        self.memory.touch(model, now)
        self.compute = action
        return action

    def start_load(self, model: str, evict: tuple[str, ...], now: float, window: float) -> Action:
        self.memory.admit(model, self.spec(model).size_bytes, now=now, evict=evict)
        self.ready.difference_update(evict)
        action = Action(ActionKind.LOAD, model, now, now + self.load_s(model), window, evicted=evict)
        self.loading[model] = action.end
        self.copy = action
        return action

    def preload(self, models: list[str]) -> list[str]:
        """Make ``models`` resident at once, in order, while they fit (a warm start: what a worker loads
        before it takes requests); returns those loaded."""
        loaded = []
        for model in models:
            size = self.spec(model).size_bytes
            if model in self.memory or size > self.memory.free:
                continue
            self.memory.admit(model, size, now=0.0)
            self.memory.unpin(model)
            self.ready.add(model)
            loaded.append(model)
        return loaded

    def finished(self, action: Action, now: float) -> None:
        """``action`` ended at ``now`` (its lane is free again)."""
        self.dirty = True
        self.memory.unpin(action.model)
        if action.kind is ActionKind.LOAD:
            self.loading.pop(action.model, None)
            self.ready.add(action.model)
            self.copy = None
        else:
            self.memory.touch(action.model, now)
            self.compute = None


class Scheduler(Lanes):
    """flowserve's predictive scheduler for one worker (see the module's doc)."""

    def __init__(self, catalogue: Catalogue, capacity: int, *, max_batch: int = 16, margin: float = 1.0,
                 tau: float = 10.0, horizon: float = math.inf) -> None:
        super().__init__(catalogue, capacity, max_batch=max_batch, margin=margin)
        self.predictor = Predictor(tau)
        self.queues: dict[str, list[tuple[float, int]]] = {}  # model -> heap of (deadline, request id)
        self._fresh: set[str] = set()  # models with requests submitted since the last step
        self._wake = math.inf
        #: an idle resident model (no request waiting) is kept for a predicted use only within this many
        #: seconds (and before the newcomer's deadline); one with requests waiting is kept whenever its
        #: earliest deadline comes first. With deadlines far off (a minute), every idle model's next
        #: predicted use comes before them, and a newcomer would wait its whole deadline out behind a
        #: prediction: a live worker sets 0 (a request waiting now beats a predicted one)
        self.horizon = horizon

    def expect(self, rates: Mapping[str, float], now: float = 0.0) -> None:
        """Prior arrival rates (requests per second) of models, as placement knows them from their shares,
        for the predictions until requests are seen (:meth:`Predictor.expect`)."""
        for model, rate in rates.items():
            self.spec(model)
            self.predictor.expect(model, rate, now)

    def submit(self, rid: int, model: str, *, deadline: float, now: float) -> None:
        self.spec(model)  # an unknown model fails here, naming it
        self.predictor.observe(model, now)
        heapq.heappush(self.queues.setdefault(model, []), (deadline, rid))
        self._fresh.add(model)

    def step(self, now: float) -> Step:
        """Refuse what can no longer make its deadline, then start an action on each free lane."""
        out = Step()
        # while the lanes are as they were and no wake-up is due, only new requests need a look
        self._refuse(now, out, None if self.dirty or now >= self._wake else self._fresh)
        self._fresh = set()
        self.dirty = False
        if self.compute is None and (batch := self._batch(now)) is not None:
            out.actions.append(batch)
        if self.copy is None and (load := self._load(now)) is not None:
            out.actions.append(load)
        if out.actions:
            self._refuse(now, out, None)  # the lanes' next free times moved
        self._wake = out.wake
        return out

    def earliest_answer(self, model: str, now: float) -> float:
        """The soonest predicted end of a batch of one of ``model``, given the lanes' work in progress."""
        one = self.batch_s(model, 1)
        if model in self.ready:
            return self.compute_free(now) + one
        if model in self.loading:
            return max(self.loading[model], self.compute_free(now)) + one
        return max(self.copy_free(now) + self.load_s(model), self.compute_free(now)) + one

    def _refuse(self, now: float, out: Step, only: set[str] | None) -> None:
        """Refuse the waiting requests (of ``only``'s models; None: all) that can no longer be answered in
        time, and set ``out.wake`` to when the next one would become too late."""
        wake = math.inf if only is None else self._wake
        for model in list(self.queues) if only is None else [m for m in only if m in self.queues]:
            queue = self.queues[model]
            soonest = self.earliest_answer(model, now)
            while queue and queue[0][0] < soonest:
                out.refused.append(heapq.heappop(queue)[1])
                self.refusals[model] += 1
            if queue:  # with nothing else happening, its head becomes too late when the slack runs out
                # (a microsecond on, so a request with no slack left is refused then, not stepped on forever)
                wake = min(wake, max(now, queue[0][0] - (soonest - now)) + 1e-6)
            else:
                del self.queues[model]
        out.wake = wake

    def _batch(self, now: float) -> Action | None:
        runnable = [(q[0][0], m) for m, q in self.queues.items() if m in self.ready]
        if not runnable:
            return None
        window, model = min(runnable)
        queue = self.queues[model]
        n = min(len(queue), self.max_batch)
        while n > 1 and now + self.batch_s(model, n) > window:
            n -= 1
        if now + self.batch_s(model, n) > window:
            return None  # cannot happen after _refuse; never start what cannot end in its window
        taken = tuple(heapq.heappop(queue)[1] for _ in range(n))
        if not queue:
            del self.queues[model]
        return self.start_batch(model, taken, now, window)

    def _load(self, now: float) -> Action | None:
        cold = sorted((q[0][0], m) for m, q in self.queues.items() if m not in self.ready and m not in self.loading)
        if not cold:
            return None
        next_use = self.next_use(now)
        for deadline, model in self._load_order(cold, now):
            window = deadline - self.batch_s(model, 1)
            if now + self.load_s(model) > window:
                continue
            evict = self.memory.victims(self.spec(model).size_bytes, now=now,
                                        next_use=self._beyond_horizon(next_use, now, deadline), keep_before=deadline)
            if evict is not None:
                return self.start_load(model, evict, now, window)
        return None

    def _load_order(self, cold: list[tuple[float, str]], now: float) -> list[tuple[float, str]]:
        """``cold`` (earliest deadline first) reordered so the loads that serve the most requests go first
        when the copy lane cannot make every deadline: Moore and Hodgson's rule for the fewest late jobs on
        one machine, weighted. Loads are taken in deadline order; whenever one would end past its window,
        the load so far that costs the most copy seconds per waiting request is set aside (a 35-ms load for
        one request gives way to two 8-ms loads for one request each). Those kept go first, in deadline
        order, then those set aside (they still run if the lane frees up in time)."""
        end = now
        kept: list[tuple[float, int, str]] = []  # heap of (-seconds per request, position, model)
        aside: set[str] = set()
        for pos, (deadline, model) in enumerate(cold):
            took = self.load_s(model)
            end += took
            heapq.heappush(kept, (-took / len(self.queues[model]), pos, model))
            if end > deadline - self.batch_s(model, 1):
                _, _, worst = heapq.heappop(kept)
                aside.add(worst)
                end -= self.load_s(worst)
        if not aside:
            return cold
        return [c for c in cold if c[1] not in aside] + [c for c in cold if c[1] in aside]

    def _beyond_horizon(self, next_use: dict[str, float], now: float, deadline: float) -> dict[str, float]:
        """``next_use`` with each idle model predicted past the horizon moved to ``deadline`` at the
        soonest, so that the newcomer due then may evict it."""
        if math.isinf(self.horizon):
            return next_use
        edge = now + self.horizon
        return {m: max(u, deadline) if m not in self.queues and u >= edge else u for m, u in next_use.items()}

    def next_use(self, now: float) -> dict[str, float]:
        """Each resident model's next predicted use: its earliest deadline when requests wait for it, else
        its next predicted arrival."""
        out = {}
        for model in self.memory.resident:
            queue = self.queues.get(model)
            out[model] = queue[0][0] if queue else self.predictor.next_use(model, now)
        return out


def never_late(action: Action) -> bool:
    """Whether ``action``'s predicted end is within its window (the scheduler's invariant)."""
    return action.end <= action.window or math.isclose(action.end, action.window)
