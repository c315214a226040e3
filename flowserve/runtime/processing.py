"""Running a stage worker's requests through ``process``: checked, grouped, planned, batched.

Requests are checked against the input ports and grouped by tensor signature; each group is worked off
batch by batch as the batch policy plans it (refusing what cannot make its deadline). Around each
``process`` the hooks may answer requests themselves (:meth:`~flowserve.runtime.hooks.StageHooks.answer`;
an answer in parts is sent part by part, as each is ready) and observe the batch (``begin``/``end``); a
batch that fails is retried request by request, so only the request at fault is dead-lettered.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import aclosing
from typing import Any

import numpy as np

from flowserve.component import Batch, read_result
from flowserve.errors import ErrorKind, Failure, WireError
from flowserve.runtime.batching import BatchPolicy
from flowserve.runtime.emit import Emitter, Item
from flowserve.runtime.execute import Executor
from flowserve.runtime.hooks import Answered, AnsweredInParts, BatchOutcome, StageHooks
from flowserve.runtime.join import JoinBuffer
from flowserve.runtime.metrics import NodeMetrics
from flowserve.runtime.profiles import ExecProfile
from flowserve.wire.envelope import H_DEADLINE, deadline_of, now_ms


class Processing(Emitter):
    """Mixin of :class:`~flowserve.runtime.worker.StageWorker`: everything between intake and emit."""

    hooks: tuple[StageHooks, ...]
    join: JoinBuffer | None
    metrics: NodeMetrics | None
    policy: BatchPolicy
    profile: ExecProfile
    executor: Executor
    _deadlines: bool
    _expired: Failure
    #: acknowledgements of batches sent before the step ends
    _early: list[Any]

    async def _process(self, items: list[Item], now: int) -> None:
        groups: dict[tuple, list[Item]] = {}
        ports = self.component.inputs
        for item in items:
            r = item.ready
            if r.error is not None:
                await self._emit_error(r, r.error, count=False)
                continue
            deadline = deadline_of(r.headers.get(H_DEADLINE)) if self._deadlines else None
            if deadline is not None and deadline < now:
                self.counters.expired += 1
                await self._emit_error(r, self._expired)
                continue
            if item.signature is not None:  # checked as a whole batch on intake
                groups.setdefault(item.signature, []).append(item)
                continue
            try:
                rows = None
                for port, array in r.tensors.items():
                    ports[port].check(port, array)
                    if rows is None:
                        rows = array.shape[0]
                    elif array.shape[0] != rows:
                        raise WireError(f"input ports disagree on the number of rows ({rows} vs {array.shape[0]})")
            except WireError as exc:
                await self._dead_letter_item(item, Failure(exc.kind, str(exc)))
                continue
            signature = tuple((p, a.dtype.str, a.shape[1:]) for p, a in r.tensors.items())
            groups.setdefault(signature, []).append(item)
        for group in groups.values():
            await self._work_off(group)

    async def _work_off(self, queue: list[Item]) -> None:
        """Run a FIFO queue batch by batch as the policy plans it, re-planning with the real clock after
        each batch. Requests the policy says cannot make their deadline are answered at once (error result:
        kind ``refused`` when hopeless even alone, ``deadline`` when doomed by the queue ahead).

        Each plan sees only the head of the queue (the policy's ``window``), so working off a queue of n
        costs O(n * window / batch) in Python, not O(n^2)."""
        deadlines: list[float | None] = ([deadline_of(it.ready.headers.get(H_DEADLINE)) for it in queue]
                                         if self._deadlines else [None] * len(queue))
        window = self.policy.window or 4 * self.node.max_batch
        pos, first = 0, True
        while pos < len(queue):
            now = now_ms()
            end = min(len(queue), pos + window)
            drop: dict[int, str] = {}
            if not first:  # expired while earlier batches ran (checked as they reach the window)
                for i in range(pos, end):
                    d = deadlines[i]
                    if d is not None and d < now:
                        self.counters.expired += 1
                        drop[i] = ""
                        await self._emit_error(queue[i].ready, self._expired)
            first = False
            plan = None
            if len(drop) < end - pos:
                live = [i for i in range(pos, end) if i not in drop] if drop else list(range(pos, end))
                plan = self.policy.plan([deadlines[i] for i in live], now)
                for k, why in sorted(plan.refuse.items()):
                    self.counters.refused += 1
                    drop[live[k]] = why
                    await self._emit_error(queue[live[k]].ready,
                                           Failure(ErrorKind.REFUSED, f"refused by node '{self.node.id}': {why}"))
                for k, why in sorted(plan.doomed.items()):
                    self.counters.doomed += 1
                    drop[live[k]] = why
                    await self._emit_error(queue[live[k]].ready,
                                           Failure(ErrorKind.DEADLINE, f"dropped by node '{self.node.id}': {why}"))
            if drop:  # close the gaps inside the window (a C-level slice move, not per-record Python)
                kept = [i for i in range(pos, end) if i not in drop]
                queue[pos:end] = [queue[i] for i in kept]
                deadlines[pos:end] = [deadlines[i] for i in kept]
                end = pos + len(kept)
            if plan is None or pos == end:
                continue
            take = max(1, min(plan.take, self.node.max_batch, end - pos))
            batch = queue[pos:pos + take]
            pos += take
            started = time.perf_counter()
            seconds = await self._run_batch(batch)
            if pos < len(queue):  # results of this batch leave now, not after the queue
                await self._send_early()
            if seconds is not None:  # what a batch costs here besides process: assembling, encoding, producing
                self.policy.observe_overhead(time.perf_counter() - started - seconds)

    def _observe(self, size: int, seconds: float) -> None:
        self.executor.observe(seconds)
        self.profile.observe(size, seconds)
        self.policy.observe(size, seconds)
        if self.metrics is not None:
            self.metrics.batch(size, seconds)

    async def _run_batch(self, group: list[Item]) -> float | None:
        """Process one batch and emit its results; the seconds ``process`` took (None when it failed, or
        when the hooks answered every request and ``process`` did not run)."""
        sizes = [next(iter(it.ready.tensors.values())).shape[0] if it.ready.tensors else 1 for it in group]
        # Hooks that answer requests themselves (the prediction cache): the rest run as one smaller batch
        todo, todo_sizes = group, sizes
        place: Sequence[int] = range(len(group))  # each request of todo's index in group
        answered: list[tuple[Answered, list[int]]] = []
        failed: dict[int, Failure] = {}  # group index -> why a hook answered it with an error
        for hook in self.hooks:
            answer = hook.answer(todo, todo_sizes) if todo else None
            if answer is None:
                continue
            if isinstance(answer, AnsweredInParts):
                if not answered and all(answer.skip):  # the whole batch: each part leaves as it is ready
                    await self._run_parts(group, sizes, answer)
                    return None
                async with aclosing(answer.parts()) as parts:  # merged with the others: wait for the whole
                    async for _ in parts:
                        pass
            answered.append((answer, todo_sizes))
            for k, failure in answer.failures.items():
                failed[place[k]] = failure
            if any(answer.skip):
                place = [i for i, s in zip(place, answer.skip, strict=True) if not s]
                todo = [it for it, s in zip(todo, answer.skip, strict=True) if not s]
                todo_sizes = [n for n, s in zip(todo_sizes, answer.skip, strict=True) if not s]
        return await self._finish_batch(group, sizes, todo, todo_sizes, answered, failed)

    async def _run_parts(self, group: list[Item], sizes: list[int], answer: AnsweredInParts) -> None:
        """A hook answers the whole batch in parts: each part is written and sent as it comes (a request
        answered early does not wait for the batch's last one); the step settles their acknowledgements
        before the batch's offsets commit, as for :meth:`_work_off`'s early batches."""
        async with aclosing(answer.parts()) as parts:
            async for part in parts:
                items = [group[i] for i in part.requests]
                part_sizes = [sizes[i] for i in part.requests]
                await self._finish_batch(items, part_sizes, [], [], [(part.answer, part_sizes)],
                                         dict(part.answer.failures))
                await self._send_early()

    async def _send_early(self) -> None:
        """Send what the outbox holds now, before the step ends; the step settles these acknowledgements
        before the batch's offsets commit (:meth:`~flowserve.runtime.delivery.Delivery._deliver`)."""
        if self.outbox.count:
            sent, futures = await self.outbox.send()
            self.counters.records_out += sent
            self._early.extend(futures)

    async def _finish_batch(self, group: list[Item], sizes: list[int], todo: list[Item], todo_sizes: list[int],
                            answered: list[tuple[Answered, list[int]]], failed: dict[int, Failure]) -> float | None:
        """``process`` on what the hooks left (``todo``), then the whole batch's results merged and emitted."""
        tokens = [hook.begin(group) for hook in self.hooks] if self.hooks else None
        outputs: dict[str, np.ndarray] = {}
        mask: dict[str, np.ndarray] = {}
        errors: dict[int, str] = {}
        seconds: float | None = None
        if todo:
            batch = _batch_of(todo, todo_sizes, absent=self.join is not None and self.join.kind == "deadline")
            self.counters.batches += 1
            self.counters.last_batch = len(todo)
            try:
                result, seconds = await self.executor.run(batch)
                outputs, mask, errors = read_result(self.component, result, batch.rows, node=self.node.id)
            except Exception as exc:  # noqa: BLE001 - a component bug must not kill the worker
                if len(group) == 1:
                    await self._dead_letter_item(group[0], Failure(
                        ErrorKind.COMPONENT_FAILURE, f"{type(self.component).__name__}.process failed: {exc!r}"))
                    return None
                # Isolate the request that broke the batch: retry each one alone (the hooks asked again).
                for item in group:
                    await self._run_batch([item])
                return None
            self._observe(len(todo), seconds)
        for answer, answer_sizes in reversed(answered):
            outputs, mask, errors = answer.complete(answer_sizes, outputs, mask, errors)
        for i, failure in failed.items():
            await self._hook_failure(group[i], failure)
        await self._emit(group, sizes, outputs, mask, errors, failed)
        done = now_ms()
        for i, item in enumerate(group):
            if i in failed:  # answered at once
                continue
            deadline = deadline_of(item.ready.headers.get(H_DEADLINE))
            if deadline is not None and deadline < done:
                self.counters.late += 1
        if tokens is not None:
            outcome = BatchOutcome(sizes, outputs, mask, errors)
            for hook, token in zip(self.hooks, tokens, strict=True):
                hook.end(token, outcome)
        return seconds


def _batch_of(group: list[Item], sizes: list[int], absent: bool = False) -> Batch:
    """The requests of ``group`` as one batch: each port's tensors concatenated in order."""
    first = group[0].ready.tensors
    if len(group) == 1:
        tensors = dict(first)
    else:
        tensors = {port: np.concatenate([it.ready.tensors[port] for it in group]) for port in first}
    masks = _absent_masks(group, sizes) if absent else None  # behind a deadline join only
    return Batch(tensors, sizes, [it.ready.request_id for it in group], [it.ready.headers for it in group],
                 masks)


def _absent_masks(group: list[Item], sizes: list[int]) -> dict[str, np.ndarray] | None:
    """Per port with an absent input somewhere in the batch, which rows are present (``Batch.present``)."""
    if not any(it.ready.absent for it in group):
        return None
    masks: dict[str, np.ndarray] = {}
    start = 0
    for it, rows in zip(group, sizes, strict=True):
        for port in it.ready.absent:
            mask = masks.get(port)
            if mask is None:
                mask = masks[port] = np.ones(sum(sizes), dtype=bool)
            mask[start:start + rows] = False
        start += rows
    return masks
