"""The tuner (``flowserve tune``): resize each stage's consumers as the live arrival envelope changes.

InferLine's high-frequency tuner, in network-calculus terms (:mod:`flowserve.tuning.curves`). Every
second the controller takes the arrivals of the last ``horizon_s`` seconds (the inputs topic's record
timestamps) and asks, per stage, how many consumers it needs, by one of two rules:

- ``bound`` (the default), **on the delay bound**: the live token-bucket envelope, scaled by each
  stage's share of the traffic (a cascade's expensive stage sees only its unsure share), against the
  stage's rate-latency service curve ``R = c n / l(n)``, ``T = l(n)``: the fewest ``c`` whose delay bound
  ``T + b / R`` stays within the stage's share of the SLO and whose ``R`` covers every window's rate. The
  bound is the worst case of every burst, so it provisions for more than a p99 needs.
- ``relative``, **to the plan** (plans made by ``flowserve plan`` keep the envelope of their trace): the plan
  meets the SLO for that trace, so a stage needs its planned consumers times the most by which the live
  envelope (the most arrivals in any window of each length, doubling from the slowest stage's batch time)
  exceeds the planned one; windows where the plan's trace had fewer than ``MIN_COUNT`` arrivals are noise
  and left out. This is InferLine's trigger: act when the workload leaves the sample the plan was made for.
  It keeps a stationary workload at the plan's cost, but the plan's envelope holds its own sample's
  noise, so it under-reacts to a change of rate and over-reacts to noise (docs/benchmarks.md).

Then:

- more consumers than running: **scale up at once** (on the bound, at most doubling), then leave the
  stage alone for ``settle_s`` while its group rebalances;
- fewer, with the envelope inflated by ``hysteresis``, for ``hold_s`` on end: **scale down** to that;
- never beyond the topology's partitions (consumers past them would sit idle), never below one; given a
  :class:`~flowserve.tuning.partitions.PartitionGrowth` (``flowserve tune --max-partitions``, Apache
  Kafka), a stage that needs more consumers than there are partitions first grows every topic of the
  topology (at least doubling, up to the limit).

Every action is logged with the envelope figure that caused it. Actuators (:class:`Scaler`): local
``flowserve worker`` processes (:class:`LocalScaler`), or a Kubernetes deployment's replica count.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import math
import subprocess
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from flowserve.errors import BrokerError, ErrorKind, FlowserveError
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import ProcessHost
from flowserve.topology.graph import Topology
from flowserve.topology.names import deployment_name, k8s_name
from flowserve.tuning.curves import TokenBucket, envelope, max_arrivals
from flowserve.tuning.partitions import PartitionGrowth
from flowserve.tuning.plan import Plan, StageOptions, stage_options
from flowserve.tuning.simulate import batch_time

log = logging.getLogger("flowserve.tuner")


@dataclass(frozen=True)
class StageTarget:
    """What the controller knows of a stage: its batch, batch time, SLO share and traffic share."""

    id: str
    batch: int
    batch_s: float
    slo_share_s: float
    traffic_share: float = 1.0
    max_consumers: int = 64
    #: the plan's consumers: what the plan's trace needs (the relative rule scales from it)
    consumers: int = 1


@dataclass(frozen=True)
class Action:
    stage: str
    before: int
    after: int
    at: float
    reason: str


def needed_consumers(family: Sequence[TokenBucket], target: StageTarget, scale: float = 1.0) -> tuple[int, str]:
    """Consumers for the stage to bound its delay within its SLO share under ``family`` (times ``scale``)."""
    slack = target.slo_share_s - target.batch_s
    per_consumer = target.batch / target.batch_s
    if not family:
        return 1, "no arrivals"
    # alpha is the minimum of the buckets, so each bucket's bound holds: the tightest one decides
    worst, why = math.inf, ""
    for b in family:
        rate, burst = b.rate * scale * target.traffic_share, b.burst * scale * target.traffic_share
        need = max(rate, burst / slack) if slack > 0 else math.inf
        if need < worst:
            worst, why = need, f"window {b.window:.3g} s: rate {rate:.1f}/s, burst {burst:.1f}"
    if math.isinf(worst):
        return target.max_consumers, f"batch time {target.batch_s * 1000:.1f} ms exceeds the SLO share"
    c = max(1, math.ceil(worst / per_consumer - 1e-9))
    return min(c, target.max_consumers), f"{why} -> needs {worst:.1f}/s of {per_consumer:.1f}/s per consumer"


#: how the controller sizes a stage (see the module docstring)
RULES = ("bound", "relative")
#: a window where the plan's trace had fewer arrivals than this is left out of the ratio: 3 against 2 is noise
MIN_COUNT = 5


def plan_excess(arrivals: np.ndarray, planned: Sequence[tuple[float, int]],
                count: Callable[[np.ndarray, float], int] = max_arrivals) -> tuple[float, str]:
    """The most by which the live envelope exceeds the plan's at any window (0 without arrivals), and where.
    The same for every stage: the relative rule computes it once per decision. ``count`` is
    :func:`~flowserve.tuning.curves.max_arrivals` (a simulated clock passes an indexed equivalent)."""
    if arrivals.size == 0:
        return 0.0, "no arrivals"
    counted = [(w, n) for w, n in planned if n >= MIN_COUNT] or list(planned)
    factor, why = 0.0, ""
    for w, n in counted:
        live = count(arrivals, w)
        if live / max(n, 1) > factor:
            factor = live / max(n, 1)
            why = f"window {w:.3g} s: {live} arrivals where the plan's trace had {n}"
    return factor, why


def relative_consumers(excess: tuple[float, str], target: StageTarget, scale: float = 1.0) -> tuple[int, str]:
    """InferLine's rule: the plan meets the SLO for its trace, so a stage needs its planned consumers times
    the plan's :func:`plan_excess` (``scale`` inflates it)."""
    factor, why = excess
    if factor == 0:
        return 1, why
    c = max(1, math.ceil(target.consumers * factor * scale - 1e-9))
    return min(c, target.max_consumers), f"{why} -> x{factor:.2f} of the plan's {target.consumers} consumer(s)"


@dataclass
class Controller:
    """Decides scaling actions from observed arrival times (seconds); pure, so it is unit-tested."""

    targets: list[StageTarget]
    hold_s: float = 30.0
    hysteresis: float = 0.25
    horizon_s: float = 60.0
    #: after an action on a stage, leave it alone this long: its group is rebalancing, and the envelope
    #: it sees meanwhile holds the backlog the pause built, not new traffic
    settle_s: float = 5.0
    #: the plan's envelope (window, most arrivals): when given, stages scale relative to it
    #: (:func:`relative_consumers`); else on the delay bound (:func:`needed_consumers`)
    planned: list[tuple[float, int]] = field(default_factory=list)
    _arrivals: deque[float] = field(default_factory=deque)
    _below_since: dict[str, float] = field(default_factory=dict)
    _last_action: dict[str, float] = field(default_factory=dict)

    def observe(self, times_s: Sequence[float] | np.ndarray) -> None:
        self._arrivals.extend(float(t) for t in times_s)

    def envelope(self, now: float, shortest: float) -> list[TokenBucket]:
        live = self._live(now)
        return envelope(live, shortest, longest=self.horizon_s) if live.size else []

    def count(self, live: np.ndarray, window: float) -> int:
        """The most of the ``live`` arrivals in any window of ``window`` seconds (the simulated cluster of
        flowserve.bench.tuner_sim answers it from an index over its whole trace, the same figure faster)."""
        return max_arrivals(live, window)

    def _live(self, now: float) -> np.ndarray:
        """The arrivals of the last ``horizon_s`` seconds."""
        while self._arrivals and self._arrivals[0] < now - self.horizon_s:
            self._arrivals.popleft()
        return np.fromiter(self._arrivals, dtype=float)

    def decide(self, now: float, current: dict[str, int]) -> list[Action]:
        actions = []
        excess = plan_excess(self._live(now), self.planned, self.count) if self.planned else None
        for t in self.targets:
            have = current.get(t.id, 1)
            if now - self._last_action.get(t.id, -math.inf) < self.settle_s:
                continue
            need = (functools.partial(relative_consumers, excess, t) if excess is not None else
                    functools.partial(needed_consumers, self.envelope(now, min(t.batch_s, self.horizon_s / 2)), t))
            up, why = need(scale=1.0)
            if up > have:
                self._below_since.pop(t.id, None)
                self._last_action[t.id] = now
                # the bound reads every burst as the worst case, and a burst has often passed before the next
                # step, so it steps at most doubling (going to the need at once measured no better:
                # docs/benchmarks.md); the relative rule scales from a plan shown to hold, so it goes at once
                # (each step costs a rebalance)
                actions.append(Action(t.id, have, up if excess is not None else min(up, 2 * have), now, why))
                continue
            down, why_down = need(scale=1.0 + self.hysteresis)
            if down >= have:
                self._below_since.pop(t.id, None)
                continue
            since = self._below_since.setdefault(t.id, now)
            if now - since >= self.hold_s:
                self._below_since.pop(t.id, None)
                self._last_action[t.id] = now
                actions.append(Action(t.id, have, down, now, f"below for {now - since:.0f} s: {why_down}"))
        return actions


def targets_from_plan(options: Sequence[StageOptions], plan: Plan) -> list[StageTarget]:
    """Per stage: the plan's batch and its batch time, an SLO share (that batch time plus an equal part of
    what the SLO leaves after hops and batch times), and the stage's share of the traffic."""
    share: dict[str, float] = {}
    for o in options:  # topological order
        parts = []
        for src, port in o.inputs:
            if src is None:
                parts.append(1.0)
            else:
                up = next(x for x in options if x.id == src)
                parts.append(share[src] * up.fractions.get(port, 1.0))
        share[o.id] = (sum(parts) if o.join == "any" else min(parts)) if parts else 1.0
    times = {o.id: batch_time(o.tables[plan.stages[o.id].hardware], plan.stages[o.id].max_batch) for o in options}
    budget = plan.slo_ms / 1000 - plan.hop_ms / 1000 * (len(options) + 1)
    # each stage gets its batch time plus an equal part of the queueing slack: a share proportional to
    # batch time would leave a sub-millisecond stage no room for the bursts a produce batch makes
    slack = max(0.0, budget - sum(times.values())) / max(1, len(options))
    return [StageTarget(o.id, plan.stages[o.id].max_batch, times[o.id], times[o.id] + slack, share[o.id],
                        plan.partitions, plan.stages[o.id].consumers) for o in options]


class Scaler(Protocol):
    """Changes the number of consumers of a stage."""

    def current(self) -> dict[str, int]: ...

    async def scale(self, stage: str, consumers: int) -> None: ...

    async def grown(self, partitions: int) -> None:
        """The topology now has ``partitions`` partitions (see :class:`PartitionGrowth`)."""


class LocalScaler:
    """Starts and stops local ``flowserve worker`` processes through a ProcessHost."""

    def __init__(self, host: ProcessHost) -> None:
        self.host = host

    def current(self) -> dict[str, int]:
        return {n: c for n, c in self.host.alive().items()}

    async def scale(self, stage: str, consumers: int) -> None:
        while self.host.alive().get(stage, 0) < consumers:
            self.host.spawn(stage)
        while self.host.alive().get(stage, 0) > consumers:
            await asyncio.to_thread(self.host.retire, stage)

    async def grown(self, partitions: int) -> None:
        # the host warns when a stage has more consumers than partitions: it must know the new count
        self.host.topology = self.host.topology.with_partitions(partitions)


class KubernetesScaler:
    """Sets each stage's replicas on Kubernetes with ``kubectl``, on the Deployments ``flowserve deploy``
    renders (``flowserve-<topology>-<node>``, :func:`~flowserve.topology.names.deployment_name`).

    ``flowserve deploy`` also renders a KEDA ScaledObject per stage; where one is installed, KEDA's
    autoscaler owns the Deployment's replicas and would undo a ``kubectl scale`` at its next poll. The
    tuner then pins the ScaledObject's ``minReplicaCount`` and ``maxReplicaCount`` to its count instead.
    :meth:`load` reads where the stages stand first; a ``kubectl`` that fails is logged and the stage left
    as it was (the controller asks again after its settle time). After the tuner grows the partitions of
    ``topics`` (``--max-partitions``), their Strimzi KafkaTopics are set to the new count, so that what the
    cluster declares matches what Kafka has (Strimzi cannot take partitions away, and would report the
    topics not ready)."""

    def __init__(self, topology: str, namespace: str = "default", kubectl: str = "kubectl",
                 topics: Sequence[str] = ()) -> None:
        self.topology = topology
        self.namespace = namespace
        self.kubectl = kubectl
        self.topics = list(topics)
        self._replicas: dict[str, int] = {}
        self._keda: set[str] = set()

    def _kubectl(self, *args: str) -> str:
        """Run ``kubectl -n <namespace> args``; its output, or a FlowserveError saying why not (it failed,
        hung for a minute, or is not installed)."""
        what = f"kubectl {args[0]} {args[1]} in namespace '{self.namespace}'"
        try:
            done = subprocess.run([self.kubectl, "-n", self.namespace, *args], capture_output=True, text=True,
                                  timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise FlowserveError(f"{what}: {exc}", kind=ErrorKind.UNAVAILABLE) from exc
        if done.returncode != 0:
            raise FlowserveError(f"{what}: {done.stderr.strip() or f'exit status {done.returncode}'}")
        return done.stdout

    def load(self) -> None:
        """Read each stage's replicas from its Deployment, and which stages KEDA scales."""
        selector = f"flowserve/topology={self.topology}"
        deployments = json.loads(self._kubectl("get", "deployments", "-l", selector, "-o", "json"))
        by_name = {}
        for item in deployments.get("items", []):
            node = item["metadata"].get("labels", {}).get("flowserve/node")
            # the gateway's Deployment carries the topology's labels too, but it is not a stage
            if node and node != "gateway" and item["metadata"]["name"] == deployment_name(self.topology, node):
                self._replicas[node] = int(item["spec"].get("replicas", 1))
                by_name[item["metadata"]["name"]] = node
        if not self._replicas:
            raise FlowserveError(f"no Deployments of topology '{self.topology}' in namespace '{self.namespace}' "
                                 f"(label {selector}): deploy it first (flowserve deploy ... | kubectl apply -f -)")
        try:
            scaled = json.loads(self._kubectl("get", "scaledobjects.keda.sh", "-l", selector, "-o", "json"))
        except FlowserveError as exc:  # KEDA not installed: the Deployments are ours alone
            log.info("tuner: no KEDA ScaledObjects (%s); scaling the Deployments", exc)
            return
        targets = (item["spec"].get("scaleTargetRef", {}).get("name") for item in scaled.get("items", []))
        self._keda = {by_name[t] for t in targets if t in by_name}

    def current(self) -> dict[str, int]:
        return dict(self._replicas)

    async def scale(self, stage: str, consumers: int) -> None:
        name = deployment_name(self.topology, stage)
        args: tuple[str, ...]
        if stage in self._keda:
            pin = json.dumps({"spec": {"minReplicaCount": consumers, "maxReplicaCount": consumers}})
            args = ("patch", f"scaledobjects.keda.sh/{name}", "--type", "merge", "-p", pin)
        else:
            args = ("scale", f"deployment/{name}", f"--replicas={consumers}")
        try:
            await asyncio.to_thread(self._kubectl, *args)
        except FlowserveError as exc:
            log.error("tuner: could not scale %s to %d: %s", stage, consumers, exc)
            return
        self._replicas[stage] = consumers

    async def grown(self, partitions: int) -> None:
        # the Deployments' workers subscribe to their topics and follow the growth on their own
        pin = json.dumps({"spec": {"partitions": partitions}})
        for topic in self.topics:
            try:  # off the event loop, as scale's: the tuner's tails and action log run on it
                await asyncio.to_thread(self._kubectl, "patch", f"kafkatopics.kafka.strimzi.io/{k8s_name(topic)}",
                                        "--type", "merge", "-p", pin)
            except FlowserveError as exc:
                log.error("tuner: KafkaTopic of %s not set to %d partitions: %s", topic, partitions, exc)


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
                    on_grow: Callable[[int, int, Action], Awaitable[None]] | None = None) -> list[Action]:
    """Every ``interval_s``: decide and apply; returns every action taken. With ``growth``, a scale-up
    past the partitions grows them first (``on_grow(before, after, action)`` is awaited after a growth)."""
    taken: list[Action] = []
    while not stop.is_set():
        current = scaler.current()
        for action in controller.decide(time.time(), current):
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
               hold_s: float = 30.0, hysteresis: float = 0.25, horizon_s: float = 60.0, interval_s: float = 1.0,
               settle_s: float = 5.0, rule: str = "bound", max_partitions: int | None = None,
               on_action: Callable[[Action], None] | None = None) -> list[Action]:
    """Tail the topology's inputs topic and resize its stages through ``scaler`` until ``stop`` is set;
    ``rule`` is ``bound`` (the delay bound) or ``relative`` (to the plan's envelope; see the module).
    ``max_partitions`` above the plan's lets stages scale past them by growing every topic
    (:class:`~flowserve.tuning.partitions.PartitionGrowth`; refused by brokers without CreatePartitions).

    Every action is also published to the topology's actions topic (``flowserve ui`` shows it)."""
    if rule not in RULES:
        raise FlowserveError(f"unknown tuner rule '{rule}' (rules: {', '.join(RULES)})")
    if rule == "relative" and not plan.envelope:
        raise FlowserveError("the relative rule scales against the plan's arrival envelope and this plan has "
                             "none (written before plans kept it): make it again with 'flowserve plan'")
    growth = None
    targets = targets_from_plan(stage_options(topology), plan)
    if max_partitions is not None and max_partitions > topology.spec.partitions:
        growth = PartitionGrowth(topology, kafka, partitions=topology.spec.partitions, limit=max_partitions)
        targets = [dataclasses.replace(t, max_consumers=max_partitions) for t in targets]
    controller = Controller(targets, hold_s=hold_s, hysteresis=hysteresis, horizon_s=horizon_s, settle_s=settle_s,
                            planned=list(plan.envelope) if rule == "relative" else [])
    tails = [asyncio.create_task(tail_arrivals(kafka, topology.inputs_topic, topology.spec.partitions,
                                               controller.observe, stop))]

    async def follow(before: int, after: int, action: Action) -> None:
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
        return await run_tuner(controller, scaler, interval_s=interval_s, stop=stop, on_action=acted,
                               growth=growth, on_grow=follow)
    finally:
        stop.set()
        await asyncio.gather(*tails)
        await log_action.close()


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
