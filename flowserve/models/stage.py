"""The many-model stage: a worker hook that serves a node's ``models:`` through the predictive scheduler.

A request names its model in the ``fs-model`` header. Before a batch's ``process`` the hook answers every
request of the batch itself (:meth:`~flowserve.runtime.hooks.StageHooks.answer`): each is submitted to the
node's :class:`~flowserve.models.scheduler.Scheduler` with its deadline (``fs-deadline``, else now plus the
node's ``slo_ms``), and the scheduler is stepped on the monotonic clock until every one is answered or
refused. The answer comes in parts (:class:`~flowserve.runtime.hooks.AnsweredInParts`): each request's
result as soon as its scheduler batch ends, each refusal at once, so the worker sends an early answer while
the batch's later loads still run. Its loads and batches run on two lanes, a thread each (copy and
compute, overlapping as on a GPU), through the component's
:class:`~flowserve.models.capabilities.ServesModels` methods. The resident set, the arrival rates and the
counts carry over from batch to batch.

An answer carries ``fs-served-by: <model>`` (the model that computed it). A request the scheduler refuses
gets an error result of kind ``deadline`` at once (the worker counts it ``refused``); one naming no model,
or a model the node does not serve, fails with ``invalid_input``, and one whose model fails to load or run
with ``component_failure`` (the worker dead-letters both, as it does its own). The worker's step waits until
the consumed batch is settled (its loop stays free meanwhile: the lanes are awaited, not blocked on): a
batch lasts no longer than its requests' deadlines allow (what cannot make it is refused).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncGenerator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import aclosing
from typing import Any

import numpy as np

from flowserve.component import Batch, Component, read_result, require
from flowserve.errors import ErrorKind, Failure, FlowserveError
from flowserve.kafka.control import MODEL_COMMAND, ControlFollower, ModelAction, model_action
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.models.capabilities import ServesModels
from flowserve.models.catalogue import Catalogue
from flowserve.models.scheduler import Action, ActionKind, Scheduler
from flowserve.runtime.emit import Item
from flowserve.runtime.hooks import HookFactory, Outcome, Part, StageContext, StageHooks
from flowserve.runtime.metrics import PER_MODEL
from flowserve.topology.graph import Node, Topology
from flowserve.topology.spec import ModelsSpec
from flowserve.wire.envelope import (
    H_DEADLINE,
    H_MODEL,
    H_SERVED_BY,
    deadline_of,
    now_ms,
)

log = logging.getLogger("flowserve.models")

#: at most this many models' own counts in a metrics snapshot (resident ones first, then the busiest)
PER_MODEL_SHOWN = 500

#: one request's rows per output port, or why it failed
Served = dict[str, np.ndarray] | Failure


class ModelsAnswer:
    """A batch the hook answered whole: :meth:`complete` lays each request's rows out in the batch's order,
    masking the rows of failed requests (:attr:`failures`: the worker writes their error results)."""

    __slots__ = ("failures", "served", "skip")

    def __init__(self, served: list[Served]) -> None:
        self.served = served
        self.skip = [True] * len(served)
        self.failures = {i: s for i, s in enumerate(served) if isinstance(s, Failure)}

    def complete(self, sizes: Sequence[int], outputs: dict[str, np.ndarray], mask: dict[str, np.ndarray],
                 errors: dict[int, str]) -> Outcome:
        ports: dict[str, np.ndarray] = {}  # port -> a template row block (dtype, trailing shape)
        for s in self.served:
            if isinstance(s, dict):
                for port, rows in s.items():
                    ports.setdefault(port, rows)
        out: dict[str, list[np.ndarray]] = {p: [] for p in ports}
        flags: dict[str, list[np.ndarray]] = {p: [] for p in ports}
        for s, n in zip(self.served, sizes, strict=True):
            for port, template in ports.items():
                got = s.get(port) if isinstance(s, dict) else None
                if got is None or got.shape[0] != n:
                    out[port].append(np.zeros((n, *template.shape[1:]), template.dtype))
                    flags[port].append(np.zeros(n, bool))
                else:
                    out[port].append(got)
                    flags[port].append(np.ones(n, bool))
        merged = {p: np.concatenate(v) for p, v in out.items()}
        masks = {p: np.concatenate(f) for p, f in flags.items() if not all(x.all() for x in f)}
        return merged, masks, {}


class ModelsInParts:
    """A batch the hook answers in parts (:class:`~flowserve.runtime.hooks.AnsweredInParts`): each request's
    result as its scheduler batch ends, or its refusal at once; whole (:meth:`complete`) once served."""

    __slots__ = ("_hook", "_items", "served", "skip")

    def __init__(self, hook: ModelHooks, items: Sequence[Item]) -> None:
        self._hook, self._items = hook, items
        self.served: list[Served | None] = [None] * len(items)
        self.skip = [True] * len(items)

    async def parts(self) -> AsyncGenerator[Part, None]:
        async with aclosing(self._hook.steps(self._items, self.served)) as steps:
            async for settled in steps:
                yield Part(settled, ModelsAnswer([_settled(self.served[i]) for i in settled]))

    @property
    def failures(self) -> dict[int, Failure]:
        return {i: s for i, s in enumerate(self.served) if isinstance(s, Failure)}

    def complete(self, sizes: Sequence[int], outputs: dict[str, np.ndarray], mask: dict[str, np.ndarray],
                 errors: dict[int, str]) -> Outcome:
        return ModelsAnswer(self._whole()).complete(sizes, outputs, mask, errors)

    def _whole(self) -> list[Served]:
        return [_settled(s) for s in self.served]


def _settled(served: Served | None) -> Served:
    return served if served is not None else Failure(ErrorKind.UNKNOWN, "unanswered")


class ModelHooks(StageHooks):
    """Serves a many-model node's requests by their ``fs-model`` header (see the module's doc)."""

    def __init__(self, node: Node, component: ServesModels, catalogue: Catalogue, spec: ModelsSpec, *,
                 topology: Topology | None = None, kafka: KafkaSettings | None = None,
                 settings: WorkerSettings | None = None) -> None:
        self.node = node
        self.topology = topology
        self.kafka = kafka
        self.settings = settings or WorkerSettings()
        self.component = component
        self.catalogue = catalogue
        self.spec = spec
        capacity = (int(spec.memory_mb * 1e6) if spec.memory_mb is not None
                    else max(max(s.size_bytes for s in catalogue), catalogue.total_bytes // 10))
        too_big = [s.name for s in catalogue if s.size_bytes > capacity]
        if too_big:
            raise FlowserveError(f"node '{node.id}': model '{too_big[0]}' does not fit in {capacity} bytes of "
                                 "device memory; raise models.memory_mb", kind=ErrorKind.INVALID_TOPOLOGY)
        # horizon 0: a request waiting now may evict an idle model whatever its prediction (the scheduler
        # sees one batch at a time, and a wait behind a prediction would hold the worker's loop)
        self.scheduler = Scheduler(catalogue, capacity, max_batch=spec.max_batch, margin=spec.margin, horizon=0.0)
        self.answers: Counter[str] = Counter()
        self.loads: Counter[str] = Counter()
        self.evictions: Counter[str] = Counter()
        self._lanes = {ActionKind.LOAD: ThreadPoolExecutor(1, thread_name_prefix=f"{node.id}-copy"),
                       ActionKind.BATCH: ThreadPoolExecutor(1, thread_name_prefix=f"{node.id}-compute")}
        self._by: dict[int, str] = {}  # id of a request's Ready -> the model that answered it
        self._commands: list[tuple[str, ModelAction]] = []  # from the control topic, applied between batches
        self._follower = (ControlFollower(topology, kafka, self.settings, command=MODEL_COMMAND, node=node.id,
                                          on_command=self._command)
                          if kafka is not None and topology is not None else None)

    def start(self, stage: StageContext) -> None:
        if self._follower is not None:
            self._follower.start()

    # -- operator commands: load and unload (the V2 repository API, flowserve models) ----------------

    def _command(self, body: dict[str, Any]) -> None:
        command = model_action(body)
        if command is not None:
            self._commands.append(command)

    def after_step(self, *, force: bool) -> bool:
        commands, self._commands = self._commands, []
        for model, action in commands:
            if model not in self.catalogue.by_name:
                log.warning("node %s: %s of unknown model '%s' ignored", self.node.id, action, model)
            elif action == "load":
                self.load(model)
            else:
                self.unload(model)
        return True

    def load(self, model: str) -> bool:
        """Make ``model`` resident now (between batches), evicting as a load on demand would; False when
        it is resident already or memory cannot be made."""
        sched, now = self.scheduler, time.monotonic()
        if model in sched.memory:
            return False
        evict = sched.memory.victims(self.catalogue.spec(model).size_bytes, now=now,
                                     next_use=sched.next_use(now))
        if evict is None:
            log.warning("node %s: cannot load model '%s': every resident model is in use", self.node.id, model)
            return False
        action = sched.start_load(model, evict, now, math.inf)
        self._started(action)
        future = self._lanes[ActionKind.LOAD].submit(self._run, action, ())
        served: list[Served | None] = []
        wait([future])
        self._finish(action, future, (), served, time.monotonic())
        return True

    def unload(self, model: str) -> bool:
        """Drop ``model`` from device memory (False when it is not resident or is in use)."""
        sched = self.scheduler
        resident = sched.memory.resident.get(model)
        if resident is None or resident.pins or model in sched.loading:
            return False
        sched.memory.evict(model)
        sched.ready.discard(model)
        self.evictions[model] += 1
        self._lanes[ActionKind.LOAD].submit(self.component.unload_model, model).result()
        return True

    # -- serving a batch ---------------------------------------------------------------------------

    def answer(self, items: Sequence[Item], sizes: Sequence[int]) -> ModelsInParts:
        return ModelsInParts(self, items)

    def serve(self, items: Sequence[Item]) -> list[Served]:
        """Each request's outputs, or why it failed, once the scheduler has answered or refused them all
        (outside a worker's loop: tests, a bench)."""
        answer = ModelsInParts(self, items)

        async def whole() -> None:
            async for _ in answer.parts():
                pass

        asyncio.run(whole())
        return answer._whole()

    async def steps(self, items: Sequence[Item], served: list[Served | None]) -> AsyncGenerator[list[int], None]:
        """Serve ``items`` through the scheduler, filling ``served``; yields the indexes settled (answered or
        refused) as each scheduler batch ends, each index once. Waits on the lanes without holding the
        worker's loop, so what is yielded is sent while the device works on. Closed early, it still drives
        the scheduler until every request is settled (the next batch reuses the request ids)."""
        now, wall = time.monotonic(), now_ms()
        invalid: list[int] = []
        for i, item in enumerate(items):
            headers = item.ready.headers
            raw = headers.get(H_MODEL)
            model = raw.decode("utf-8", "replace") if raw else ""
            if model not in self.catalogue.by_name:
                served[i] = Failure(ErrorKind.INVALID_INPUT, f"node '{self.node.id}' serves many models: name one "
                                    f"of its {len(self.catalogue)} models in the '{H_MODEL}' header"
                                    + (f" (no model '{model}')" if model else ""))
                invalid.append(i)
                continue
            deadline_ms = deadline_of(headers.get(H_DEADLINE))
            deadline = (now + (deadline_ms - wall) / 1000 if deadline_ms is not None
                        else now + self.spec.slo_ms / 1000)
            self.scheduler.submit(i, model, deadline=deadline, now=now)
        running: dict[asyncio.Future[Any], Action] = {}
        loop = self._drive(items, served, running)
        whole = False
        try:
            if invalid:
                yield invalid
            async for settled in loop:
                yield settled
            whole = True
        finally:
            if not whole:  # closed early: settle the rest, unreported
                await loop.aclose()
                async for _ in self._drive(items, served, running):
                    pass
                for item in items:  # maybe never written: no ``begin`` will take their models
                    self._by.pop(id(item.ready), None)

    async def _drive(self, items: Sequence[Item], served: list[Served | None],
                     running: dict[asyncio.Future[Any], Action]) -> AsyncGenerator[list[int], None]:
        """:meth:`steps`' scheduler loop, from wherever ``served`` and ``running`` stand."""
        clock, sched = time.monotonic, self.scheduler
        left = sum(s is None for s in served)
        while left or running:
            now = clock()
            step = sched.step(now)
            ready: list[int] = []
            for rid in step.refused:
                served[rid] = Failure(ErrorKind.DEADLINE, f"refused by node '{self.node.id}': model "
                                      f"'{_model(items[rid])}' cannot answer before the request's deadline")
                ready.append(rid)
            for action in step.actions:
                self._started(action)
                running[asyncio.wrap_future(self._lanes[action.kind].submit(self._run, action, items))] = action
            if not running and math.isinf(step.wake) and len(ready) < left:
                # nothing can start and nothing will: cannot happen; never hang
                for i, s in enumerate(served):
                    if s is None:
                        served[i] = Failure(ErrorKind.DEADLINE, f"node '{self.node.id}' could not schedule it")
                        ready.append(i)
            if ready:
                left -= len(ready)
                yield ready
                if not left and not running:
                    return
            timeout = None if math.isinf(step.wake) else max(0.0, step.wake - clock())
            if not running:
                await asyncio.sleep(timeout or 0.0)
                continue
            done, _ = await asyncio.wait(running, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            settled: list[int] = []
            for future in done:
                settled += self._finish(running.pop(future), future, items, served, clock())
            if settled:
                left -= len(settled)
                yield settled

    def _started(self, action: Action) -> None:
        if action.kind is ActionKind.LOAD:
            self.loads[action.model] += 1
            self.evictions.update(action.evicted)

    def _run(self, action: Action, items: Sequence[Item]) -> Any:
        """On a lane's thread: the component's load (after its evictions) or batch."""
        spec = self.catalogue.spec(action.model)
        if action.kind is ActionKind.LOAD:
            for victim in action.evicted:
                self.component.unload_model(victim)
            self.component.load_model(spec)
            return None
        group = [items[i].ready for i in action.requests]
        sizes = [next(iter(r.tensors.values())).shape[0] if r.tensors else 1 for r in group]
        tensors = ({p: np.concatenate([r.tensors[p] for r in group]) for p in group[0].tensors} if len(group) > 1
                   else dict(group[0].tensors))
        batch = Batch(tensors, sizes, [r.request_id for r in group], [r.headers for r in group])
        result = self.component.run_model(spec, batch)
        return sizes, read_result(self.component, result, batch.rows, node=self.node.id)  # type: ignore[arg-type]

    def _finish(self, action: Action, future: Future[Any] | asyncio.Future[Any], items: Sequence[Item],
                served: list[Served | None], now: float) -> list[int]:
        """Settle an action that ended: the requests it answered or failed (their indexes)."""
        sched = self.scheduler
        try:
            out = future.result()
        except Exception as exc:  # noqa: BLE001 - a component's failure fails its requests, not the worker
            sched.finished(action, now)
            why = Failure(ErrorKind.COMPONENT_FAILURE, f"{type(self.component).__name__}.{action.kind.value} of "
                          f"model '{action.model}' failed: {exc!r}")
            requests = list(action.requests)
            if action.kind is ActionKind.LOAD:  # not resident after all: its waiting requests fail with it
                sched.ready.discard(action.model)
                sched.memory.evict(action.model)
                requests += [rid for _, rid in sched.queues.pop(action.model, [])]
            for i in requests:
                served[i] = why
            return requests
        sched.finished(action, now)
        if action.kind is ActionKind.LOAD:
            return []
        sizes, (outputs, _mask, errors) = out
        start = 0
        for i, n in zip(action.requests, sizes, strict=True):
            stop = start + n
            bad = next((errors[r] for r in range(start, stop) if r in errors), None)
            if bad is not None:
                served[i] = Failure(ErrorKind.INVALID_INPUT, f"model '{action.model}': {bad}")
            else:
                served[i] = {p: a[start:stop] for p, a in outputs.items()}
                self._by[id(items[i].ready)] = action.model
                self.answers[action.model] += 1
            start = stop
        return list(action.requests)

    def begin(self, items: Sequence[Item]) -> None:
        for item in items:  # each answer names the model that computed it
            model = self._by.pop(id(item.ready), None)
            if model is not None:
                item.ready.headers[H_SERVED_BY] = model.encode()

    # -- reporting ---------------------------------------------------------------------------------

    def counters(self) -> Mapping[str, int]:
        """Totals, and per model ``model/<name>/<what>`` for each count that is not zero (``flowserve
        stats``, the V2 repository index), for the resident models and the busiest others."""
        sched = self.scheduler
        out = {"models_resident": len(sched.memory.resident), "model_loads": sched.memory.loads,
               "model_evictions": sched.memory.evictions, "model_refusals": sum(sched.refusals.values()),
               "model_answers": sum(self.answers.values())}
        per = self.per_model()
        # a snapshot stays small with thousands of models: the resident ones, and the busiest of the rest
        shown = sorted(per, key=lambda n: (not per[n]["resident"] and not per[n]["loading"],
                                           -per[n]["answers"] - per[n]["refusals"], n))[:PER_MODEL_SHOWN]
        for name in shown:
            out.update({f"model/{name}/{what}": n for what, n in per[name].items() if n})
        return out

    def per_model(self) -> dict[str, dict[str, int]]:
        """Per model with any activity: :data:`~flowserve.runtime.metrics.PER_MODEL`'s counts."""
        sched = self.scheduler
        per = {name: dict.fromkeys(PER_MODEL, 0) for name in (set(sched.memory.resident) | set(self.answers)
                                                             | set(sched.refusals) | set(self.loads))}
        for name, counts in per.items():
            counts.update(resident=int(name in sched.ready), loading=int(name in sched.loading),
                          loads=self.loads[name], evictions=self.evictions[name], refusals=sched.refusals[name],
                          answers=self.answers[name])
        return per

    def close(self) -> None:
        if self._follower is not None:
            self._follower.stop()
        for lane in self._lanes.values():
            lane.shutdown(wait=True)


def _model(item: Item) -> str:
    raw = item.ready.headers.get(H_MODEL)
    return raw.decode("utf-8", "replace") if raw else ""


def model_hooks(kafka: KafkaSettings | None = None, settings: WorkerSettings | None = None) -> HookFactory:
    """The :data:`~flowserve.runtime.hooks.HookFactory` of many-model nodes: a :class:`ModelHooks` for a node
    whose YAML declares ``models:``, nothing elsewhere. With ``kafka`` the hook also follows the control
    topic for load and unload commands (:func:`flowserve.kafka.control.model_command`)."""

    def factory(topology: Topology, node: Node, component: Component) -> list[StageHooks]:
        spec = node.models
        if spec is None:
            return []
        serves = require(component, ServesModels, "serve many models", "use a component with load_model, "
                         "unload_model and run_model (flowserve.models.ServesModels)")
        return [ModelHooks(node, serves, Catalogue.declared(spec, node=node.id), spec, topology=topology,
                           kafka=kafka, settings=settings)]

    return factory
