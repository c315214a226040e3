"""The tuner (``flowserve tune``): resize each stage's consumers as the live arrival envelope changes.

InferLine's high-frequency tuner. Every second the controller takes the arrivals of the last
``horizon_s`` seconds (the inputs topic's record timestamps) and asks, per stage, how many consumers it
needs, by one of the rules of :mod:`flowserve.tuning.rules` (``profile``, the default: the live rate
against one consumer's simulated safe rate, spread over partitions; ``bound``: the network-calculus delay
bound; ``relative``: the plan's consumers times the live envelope's excess over the plan's).

Then:

- more consumers than running: **scale up at once** to the need, then leave the
  stage alone for ``settle_s`` while its group rebalances;
- fewer, with the need inflated by ``hysteresis``, for ``hold_s`` on end: **scale down** to the most the
  stage needed over its hold (the HPA's scale-down stabilisation); a stage scaled up again within four
  holds of a scale-down doubles its hold, up to ``MAX_HOLD_S`` (a workload that switches between rates
  keeps its high-rate consumers instead of paying a start delay at every switch), and one scaled up
  later halves it back;
- never beyond the topology's partitions (consumers past them would sit idle), never below one; given a
  :class:`~flowserve.tuning.partitions.PartitionGrowth` (``flowserve tune --max-partitions``, Apache
  Kafka), a stage that needs more consumers than there are partitions first grows every topic of the
  topology (at least doubling, up to the limit).

Every action is logged with the envelope figure that caused it. Actuators: :mod:`flowserve.tuning.scalers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from aiokafka.errors import KafkaError

from flowserve.errors import BrokerError, ErrorKind, FlowserveError
from flowserve.kafka.lag import LagReader
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology.graph import Topology
from flowserve.tuning.curves import TokenBucket, envelope, max_arrivals
from flowserve.tuning.partitions import PartitionGrowth
from flowserve.tuning.plan import Plan, stage_options
from flowserve.tuning.rules import (
    RULES,
    StageTarget,
    needed_consumers,
    plan_excess,
    profiled_consumers,
    relative_consumers,
)
from flowserve.tuning.scalers import Scaler
from flowserve.tuning.targets import targets_from_plan

log = logging.getLogger("flowserve.tuner")

#: a scale-up within this many hold times of a scale-down doubles the stage's hold (the adaptive hold)
REGRET_FACTOR = 4.0
#: the longest hold: KEDA's HPA default stabilisation window
MAX_HOLD_S = 300.0


@dataclass(frozen=True)
class Action:
    stage: str
    before: int
    after: int
    at: float
    reason: str


@dataclass
class Controller:
    """Decides scaling actions from observed arrival times (seconds); pure, so it is unit-tested."""

    targets: list[StageTarget]
    hold_s: float = 30.0
    #: scale down only below (1 - h) of the need: the HPA's tolerance (its --horizontal-pod-autoscaler-tolerance
    #: default 0.1); 0.25 kept a stage on 20 partitions at 10 consumers where 7 serve (tuner-simulated, mmpp)
    hysteresis: float = 0.1
    horizon_s: float = 60.0
    #: after an action on a stage, leave it alone this long: its group is rebalancing, and the envelope
    #: it sees meanwhile holds the backlog the pause built, not new traffic
    settle_s: float = 5.0
    #: how stages are sized (:data:`~flowserve.tuning.rules.RULES`)
    rule: str = "profile"
    #: the plan's envelope (window, most arrivals): the relative rule scales against it
    planned: list[tuple[float, int]] = field(default_factory=list)
    _arrivals: deque[float] = field(default_factory=deque)
    _last_action: dict[str, float] = field(default_factory=dict)
    _last_down: dict[str, float] = field(default_factory=dict)
    _hold: dict[str, float] = field(default_factory=dict)
    _downs: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)
    _tracked: dict[str, float] = field(default_factory=dict)

    def observe(self, times_s: Sequence[float] | np.ndarray) -> None:
        self._arrivals.extend(float(t) for t in times_s)

    def envelope(self, now: float, shortest: float) -> list[TokenBucket]:
        live = self._live(now)
        return envelope(live, shortest, longest=self.horizon_s) if live.size else []

    def count(self, live: np.ndarray, window: float) -> int:
        """The most of the ``live`` arrivals in any window of ``window`` seconds (the simulated cluster of
        flowserve_bench.tuner_sim answers it from an index over its whole trace, the same figure faster)."""
        return max_arrivals(live, window)

    def _live(self, now: float) -> np.ndarray:
        """The arrivals of the last ``horizon_s`` seconds."""
        while self._arrivals and self._arrivals[0] < now - self.horizon_s:
            self._arrivals.popleft()
        return np.fromiter(self._arrivals, dtype=float)

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise FlowserveError(f"unknown tuner rule '{self.rule}' (rules: {', '.join(RULES)})",
                                 kind=ErrorKind.INVALID_INPUT)
        if self.rule == "relative" and not self.planned:
            raise FlowserveError("the relative rule scales against the plan's arrival envelope and this plan has "
                                 "none (written before plans kept it): make it again with 'flowserve plan'",
                                 kind=ErrorKind.INVALID_INPUT)

    def decide(self, now: float, current: dict[str, int], lags: dict[str, int] | None = None) -> list[Action]:
        """The actions due at ``now`` for stages running ``current`` consumers; ``lags`` (records each
        stage has not committed), where the caller reads them, let the profile rule drain a backlog."""
        actions = []
        excess = plan_excess(self._live(now), self.planned, self.count) if self.rule == "relative" else None
        for t in self.targets:
            have = current.get(t.id, 1)
            need = self._rule(now, t, excess, (lags or {}).get(t.id, 0))
            up, why = need(scale=1.0)
            settling = now - self._last_action.get(t.id, -math.inf) < self.settle_s
            # while a stage settles only a larger need acts: a step in the rate shows in the busiest
            # second before it fills the window, and waiting out the settle time to act on the rest
            # left the spike trace's backlog growing for it (tuner-simulated)
            if settling and not (up > have and self.rule == "profile"):
                continue
            if up > have:
                self._forget_needs(t.id)
                self._regret(t.id, now)
                self._last_action[t.id] = now
                # to the need at once: every step costs a rebalance, and a pod's start delay is paid per step
                # (doubling steps left the spike trace's backlog to grow for two start delays: tuner-simulated)
                actions.append(Action(t.id, have, up, now, why))
                continue
            # down on the arrivals alone (the same envelope, no lag): a lag is drained by then, and its need
            # would hold the stage up
            down, why_down = (need if self.rule != "profile" else functools.partial(need, lag=0))(
                scale=1.0 + self.hysteresis)
            target, span = self._stabilised(t.id, now, down)
            hold = self._hold.get(t.id, self.hold_s)
            if target < have and span >= hold:
                self._forget_needs(t.id)
                self._last_action[t.id] = now
                self._last_down[t.id] = now
                actions.append(Action(t.id, have, target, now, f"below for {hold:.0f} s: {why_down}"))
        return actions

    def _forget_needs(self, stage: str) -> None:
        """After an action the stage's scale-down window starts again."""
        self._downs.pop(stage, None)
        self._tracked.pop(stage, None)

    def _stabilised(self, stage: str, now: float, down: int) -> tuple[int, float]:
        """The most consumers the stage needed (inflated by the hysteresis) over its hold, and the seconds
        of need that covers (since its last action at most): the HPA's scale-down stabilisation, over a
        window that adapts (:meth:`_regret`). The span counts from the first need recorded since the last
        action, not from the oldest kept: decisions a little over ``interval_s`` apart on a live clock would
        never keep one exactly a hold old."""
        needs = self._downs.setdefault(stage, deque())
        first = needs[0][0] if needs else now
        self._tracked.setdefault(stage, first)
        needs.append((now, down))
        hold = self._hold.get(stage, self.hold_s)
        while needs and needs[0][0] < now - hold:
            needs.popleft()
        return max(c for _, c in needs), now - self._tracked[stage]

    def _regret(self, stage: str, now: float) -> None:
        """A scale-up soon after a scale-down: that scale-down cost a start delay and a rebalance for little,
        so the next one waits twice as long (up to ``MAX_HOLD_S``); a scale-up long after one halves it back.
        Each scale-down counts once (the steps of one scale-up do not double it again)."""
        if stage not in self._last_down:
            return
        hold = self._hold.get(stage, self.hold_s)
        since = now - self._last_down.pop(stage)
        self._hold[stage] = min(MAX_HOLD_S, 2 * hold) if since < REGRET_FACTOR * hold else max(self.hold_s, hold / 2)

    def _rule(self, now: float, t: StageTarget, excess: tuple[float, str] | None,
              lag: int) -> Callable[..., tuple[int, str]]:
        if excess is not None:
            return functools.partial(relative_consumers, excess, t)
        family = self.envelope(now, min(t.batch_s, self.horizon_s / 2))
        if self.rule == "bound":
            return functools.partial(needed_consumers, family, t)
        return functools.partial(profiled_consumers, family, t, lag=lag)


async def tail_arrivals(kafka: KafkaSettings, topic: str, partitions: int | range,
                        sink: Callable[[list[float]], None], stop: asyncio.Event, *, from_start: bool = False) -> None:
    """Feed ``sink`` the timestamps (seconds) of new records on ``topic``'s ``partitions`` (a count: the
    first ones) until ``stop`` is set; ``from_start`` reads them from their start (partitions just added)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, fetch_max_wait_ms=kafka.fetch_max_wait_ms,
                                **kafka.client_kwargs())
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in (range(partitions) if isinstance(partitions, int) else partitions)]
        consumer.assign(tps)
        await (consumer.seek_to_beginning(*tps) if from_start else consumer.seek_to_end(*tps))
        while not stop.is_set():
            fetched = await consumer.getmany(timeout_ms=200, max_records=100_000)
            times = [r.timestamp / 1000.0 for records in fetched.values() for r in records]
            if times:
                sink(times)
    finally:
        await consumer.stop()


async def run_tuner(controller: Controller, scaler: Scaler, *, interval_s: float = 1.0,
                    stop: asyncio.Event, on_action: Callable[[Action], None] | None = None,
                    growth: PartitionGrowth | None = None,
                    on_grow: Callable[[int, int, Action], Awaitable[None]] | None = None,
                    lags: Callable[[], Awaitable[dict[str, int]]] | None = None) -> list[Action]:
    """Every ``interval_s``: decide and apply; returns every action taken. With ``growth``, a scale-up
    past the partitions grows them first (``on_grow(before, after, action)`` is awaited after a growth).
    ``lags`` reads each stage's lag for the controller (a failed read decides on the arrivals alone)."""
    taken: list[Action] = []
    while not stop.is_set():
        current = scaler.current()
        behind = None
        if lags is not None:
            try:
                behind = await lags()
            except (BrokerError, KafkaError, OSError) as exc:
                log.warning("tuner: could not read the groups' lag (%r); deciding on arrivals alone", exc)
        for action in controller.decide(time.time(), current, behind):
            if growth is not None and action.after > growth.partitions:
                grown = await apply_growth(growth, action, scaler, on_grow)
                if grown is None:
                    continue
                action = grown
            log.warning("scale %s %d -> %d: %s", action.stage, action.before, action.after, action.reason)
            await scaler.scale(action.stage, action.after)
            taken.append(action)
            if on_action:
                on_action(action)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
    return taken


async def apply_growth(growth: PartitionGrowth, action: Action, scaler: Scaler,
                       on_grow: Callable[[int, int, Action], Awaitable[None]] | None) -> Action | None:
    """Grow the partitions for ``action``; the action as it can be taken (capped), or None if not at all."""
    before = growth.partitions
    try:
        await growth.grow(action.after)
    except BrokerError as exc:
        # the broker refused (or could not) grow: stay within what exists, and stop asking
        log.error("tuner: cannot add partitions, so stages stay within %d: %s", before, exc)
        growth.limit = growth.partitions
    if growth.partitions > before:
        log.warning("partitions %d -> %d for stage %s: %s", before, growth.partitions, action.stage, action.reason)
        await scaler.grown(growth.partitions)
        if on_grow is not None:
            await on_grow(before, growth.partitions, action)
    if action.after <= growth.partitions:
        return action
    if growth.partitions <= action.before:
        return None
    return dataclasses.replace(action, after=growth.partitions,
                               reason=f"{action.reason} (capped at {growth.partitions} partitions)")


async def tune(topology: Topology, plan: Plan, kafka: KafkaSettings, scaler: Scaler, *, stop: asyncio.Event,
               hold_s: float = 30.0, hysteresis: float = 0.1, horizon_s: float = 60.0, interval_s: float = 1.0,
               settle_s: float = 5.0, rule: str = "profile", max_partitions: int | None = None,
               on_action: Callable[[Action], None] | None = None) -> list[Action]:
    """Tail the topology's inputs topic and resize its stages through ``scaler`` until ``stop`` is set;
    ``rule``: one of :data:`~flowserve.tuning.rules.RULES`.
    ``max_partitions`` above the plan's lets stages scale past them by growing every topic
    (:class:`~flowserve.tuning.partitions.PartitionGrowth`; refused by brokers without CreatePartitions).

    Every action is also published to the topology's actions topic (``flowserve ui`` shows it)."""
    growth = None
    targets = targets_from_plan(stage_options(topology), plan, profile=rule == "profile")
    if max_partitions is not None and max_partitions > topology.spec.partitions:
        growth = PartitionGrowth(topology, kafka, partitions=topology.spec.partitions, limit=max_partitions)
        targets = [dataclasses.replace(t, max_consumers=max_partitions) for t in targets]
    controller = Controller(targets, hold_s=hold_s, hysteresis=hysteresis, horizon_s=horizon_s, settle_s=settle_s,
                            rule=rule, planned=list(plan.envelope))
    tails = [asyncio.create_task(tail_arrivals(kafka, topology.inputs_topic, topology.spec.partitions,
                                               controller.observe, stop))]
    # the profile rule drains each stage's lag: read its group's, as KEDA's scaler does
    reader = LagReader(kafka, topology) if rule == "profile" else None

    async def follow(before: int, after: int, action: Action) -> None:
        if reader is not None:
            reader.partitions = after
        # the new partitions' arrivals count too: read them from their start
        tails.append(asyncio.create_task(tail_arrivals(kafka, topology.inputs_topic, range(before, after),
                                                       controller.observe, stop, from_start=True)))
        log_action.grown(before, after, action)
    log_action = ActionLog(topology, kafka)
    await log_action.start()

    def acted(action: Action) -> None:
        log_action(action)
        if on_action is not None:
            on_action(action)

    try:
        if reader is not None:
            await reader.start()
        return await run_tuner(controller, scaler, interval_s=interval_s, stop=stop, on_action=acted,
                               growth=growth, on_grow=follow, lags=reader.per_stage if reader else None)
    finally:
        stop.set()
        await asyncio.gather(*tails)
        await log_action.close()
        if reader is not None:
            await reader.close()


class ActionLog:
    """Publishes actions to a topology's actions topic without waiting: an action that cannot be published
    is logged, and never stops the tuner."""

    def __init__(self, topology: Topology, kafka: KafkaSettings) -> None:
        from flowserve.kafka.clients import make_producer
        from flowserve.kafka.settings import WorkerSettings

        self.topology = topology
        self.kafka = kafka
        self._producer = make_producer(kafka, WorkerSettings(acks=1), max_message_bytes=64 * 1024)
        self._pending: set[asyncio.Future[object]] = set()

    async def start(self) -> None:
        from flowserve.kafka.admin import ensure_topics

        await ensure_topics(self.kafka, [self.topology.actions_topic], self.topology.spec.partitions)
        await self._producer.start()

    def __call__(self, action: Action) -> None:
        self._publish(action.stage, action.at, {"consumers": [action.before, action.after], "reason": action.reason})

    def grown(self, before: int, after: int, action: Action) -> None:
        """Every topic of the topology went from ``before`` to ``after`` partitions, for ``action``."""
        self._publish(action.stage, action.at, {"partitions": [before, after],
                                                "reason": f"{action.stage} needs {action.after}: {action.reason}"})

    def _publish(self, stage: str, at: float, what: dict[str, object]) -> None:
        body = {"ts_ms": int(at * 1000), "source": "tuner", "node": stage, "action": what}
        send = asyncio.ensure_future(self._producer.send_and_wait(
            self.topology.actions_topic, json.dumps(body).encode(), key=stage.encode()))
        self._pending.add(send)
        send.add_done_callback(self._published)

    def _published(self, send: asyncio.Future[object]) -> None:
        self._pending.discard(send)
        if not send.cancelled() and send.exception() is not None:
            log.warning("tuner: action not published to %s: %r", self.topology.actions_topic, send.exception())

    async def close(self) -> None:
        if self._pending:
            await asyncio.wait(self._pending, timeout=5)
        await self._producer.stop()
