"""The stage hook of a learning node (``Component.learns``): decisions out, learned weights in.

After each batch it writes the component's decisions to ``<base>.<node>.decisions`` through the worker's
outbox (acknowledged before the batch's offsets commit, so a decision that steered a request is durable
before the request moves on). Between batches it hands the feedback its :class:`Learner` joined to the
component's ``learn`` (in the worker's thread: the component is never touched from two threads) and
writes the contexts that changed, then the feedback watermark, to ``<base>.<node>.state`` (partition 0,
so they stay in order; compacted, so the last record per key is the state a restarted worker resumes).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flowserve.component import Component, require
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.hooks import BatchOutcome, Emit, HookFactory, StageContext, StageHooks
from flowserve.selection.capabilities import LearnsFromFeedback
from flowserve.selection.learner import CONTEXT_PREFIX, POSITION_KEY, Learner
from flowserve.topology.graph import Node, Topology
from flowserve.wire.envelope import H_NODE


class SelectionSettings(BaseModel):
    """How a learning node joins feedback to its decisions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_ms: int = Field(600_000, gt=0, description="how long a decision, answer or feedback waits for the "
                                                     "rest of its request's parts")
    max_pending: int = Field(100_000, gt=0, description="request ids waiting in the join at most (oldest go first)")
    restore_timeout_s: float = Field(60.0, gt=0, description="how long a starting worker may take to read its "
                                                            "learned state")


class SelectionHooks(StageHooks):
    """Decisions to their topic, joined feedback to the component, learned state to the state topic."""

    def __init__(self, topology: Topology, node: Node, component: Component, kafka: KafkaSettings,
                 settings: SelectionSettings) -> None:
        self.topology = topology
        self.node = node
        self.component = component
        self.learning = require(component, LearnsFromFeedback, "learn from feedback (it declares 'learns')")
        self.partitions = topology.spec.partitions
        self.decisions_topic = topology.decisions_topic(node.id)
        self.state_topic = topology.state_topic(node.id)
        self.learner = Learner(topology, node, self.learning, kafka, window_ms=settings.window_ms,
                               max_pending=settings.max_pending, restore_timeout_s=settings.restore_timeout_s)
        self._emit: Emit | None = None
        self._header = [(H_NODE, node.id.encode())]
        self._mark: tuple[dict[int, int], dict[int, list[int]]] | None = None
        self.decisions = 0
        self.learned = 0
        self.state_records = 0
        self.restored_contexts = 0

    def start(self, stage: StageContext) -> None:
        self._emit = stage.emit
        restored = self.learner.start()
        for context, state in restored.states.items():
            self.learning.restore_learned(context, state)
        self.restored_contexts = len(restored.states)
        self._mark = (restored.watermark, restored.applied_above)

    def end(self, token: Any, outcome: BatchOutcome) -> None:
        self._write_decisions()

    def after_step(self, *, force: bool) -> bool:
        self._write_decisions()
        progress = self.learner.drain()
        if not progress:
            return True
        joined = [j for p in progress for j in p.joined]
        changed = self.learning.learn(joined) if joined else set()
        self.learned += len(joined)
        for context in sorted(changed):
            self._write_state(f"{CONTEXT_PREFIX}{context}".encode(), self.learning.learned_state(context))
        mark = (progress[-1].watermark, progress[-1].applied_above)
        if changed or mark != self._mark:
            self._mark = mark
            self._write_state(POSITION_KEY, {"watermark": {str(p): o for p, o in mark[0].items()},
                                             "applied_above": {str(p): o for p, o in mark[1].items()}})
        return True

    def _write_decisions(self) -> None:
        decisions = self.learning.drain_decisions()
        if not decisions:
            return
        emit = self._emit
        assert emit is not None, "start() runs before any batch"
        for d in decisions:
            key = str(d.get("id", "")).encode()
            emit(self.decisions_topic, zlib.crc32(key) % self.partitions, key,
                 json.dumps(d, separators=(",", ":")).encode(), self._header)
        self.decisions += len(decisions)

    def _write_state(self, key: bytes, state: Mapping[str, Any]) -> None:
        assert self._emit is not None
        self._emit(self.state_topic, 0, key, json.dumps(state, separators=(",", ":")).encode(), self._header)
        self.state_records += 1

    def counters(self) -> Mapping[str, int]:
        counts = self.learner.join.counts
        return {"decisions": self.decisions, "feedback_learned": self.learned,
                "feedback_expired": counts.expired_feedback, "feedback_unreadable": self.learner.bad_feedback,
                "state_records": self.state_records, "restored_contexts": self.restored_contexts}

    def close(self) -> None:
        self.learner.close()


def selection_hooks(kafka: KafkaSettings, settings: SelectionSettings | None = None) -> HookFactory:
    """The :data:`~flowserve.runtime.hooks.HookFactory` of model selection: a :class:`SelectionHooks` for each
    node whose component learns from feedback (``Component.learns``), none for the others."""
    chosen = settings or SelectionSettings()

    def factory(topology: Topology, node: Node, component: Component) -> list[StageHooks]:
        if not component.learns:
            return []
        return [SelectionHooks(topology, node, component, kafka, chosen)]

    return factory
