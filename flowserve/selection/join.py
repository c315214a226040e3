"""Join feedback to what a learning node did for the same request: its decision and the answer it names.

The three arrive on different topics in any order (the decision from the selector's worker, the answer
from the chosen branch's output port, the feedback from a caller), so each request id waits here until
its parts are in, for at most ``window_ms`` and at most ``max_pending`` request ids (the oldest goes
first). Whatever expires unjoined is counted, never learned from.

The join also keeps the *watermark* of the feedback topic per partition: every feedback record below it
was joined (and so handed on) or dropped. A restarted learner reads feedback from the watermark and
skips the offsets listed in ``applied_above`` (joined while an older record still waited).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowserve.selection.capabilities import Joined
from flowserve.wire.feedback import Feedback


@dataclass(slots=True)
class _Pending:
    since_ms: int
    decision: Mapping[str, Any] | None = None
    answers: dict[str, Mapping[str, np.ndarray]] = field(default_factory=dict)
    feedback: Feedback | None = None
    offset: tuple[int, int] | None = None  # the feedback record's (partition, offset)


@dataclass(slots=True)
class JoinCounts:
    joined: int = 0
    expired: int = 0           # request ids whose parts did not all arrive in the window
    expired_feedback: int = 0  # of those, the ones that had feedback (feedback not learned from)
    evicted: int = 0           # pushed out by max_pending


class FeedbackJoin:
    """Decisions, answers (by ``node.port``) and feedback, joined by request id in a bounded window."""

    def __init__(self, *, window_ms: int, max_pending: int) -> None:
        self.window_ms = window_ms
        self.max_pending = max_pending
        self.counts = JoinCounts()
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        #: feedback partition -> offset of the next record not yet read
        self._read_to: dict[int, int] = {}
        #: feedback partition -> offsets joined while an older feedback record of the partition still waits
        self._applied: dict[int, set[int]] = {}
        self._skip: dict[int, set[int]] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def resume(self, watermark: Mapping[int, int], applied_above: Mapping[int, list[int]]) -> None:
        """Start from a saved watermark: feedback below it, or at the offsets listed, was learned from."""
        self._read_to = dict(watermark)
        self._skip = {p: set(offs) for p, offs in applied_above.items()}

    def _entry(self, request_id: str, now_ms: int) -> _Pending:
        entry = self._pending.get(request_id)
        if entry is None:
            entry = self._pending[request_id] = _Pending(now_ms)
            if len(self._pending) > self.max_pending:
                self._drop(*self._pending.popitem(last=False))
                self.counts.evicted += 1
        return entry

    def decision(self, decision: Mapping[str, Any], now_ms: int) -> Joined | None:
        rid = decision.get("id")
        if not isinstance(rid, str):
            return None
        entry = self._entry(rid, now_ms)
        entry.decision = decision
        return self._complete(rid, entry)

    def answer(self, ref: str, request_id: str, tensors: Mapping[str, np.ndarray], now_ms: int) -> Joined | None:
        entry = self._entry(request_id, now_ms)
        entry.answers[ref] = tensors
        return self._complete(request_id, entry)

    def feedback(self, feedback: Feedback, partition: int, offset: int, now_ms: int) -> Joined | None:
        self._read_to[partition] = max(self._read_to.get(partition, 0), offset + 1)
        skip = self._skip.get(partition)
        if skip is not None and offset in skip:
            skip.discard(offset)  # learned from before the restart
            return None
        entry = self._entry(feedback.request_id, now_ms)
        entry.feedback, entry.offset = feedback, (partition, offset)
        return self._complete(feedback.request_id, entry)

    def read_to(self, partition: int, offset: int) -> None:
        """The feedback consumer's position moved to ``offset`` (records skipped as unreadable count as read)."""
        self._read_to[partition] = max(self._read_to.get(partition, 0), offset)

    def _complete(self, rid: str, entry: _Pending) -> Joined | None:
        d, fb = entry.decision, entry.feedback
        if d is None or fb is None:
            return None
        ref = d.get("answer")
        if isinstance(ref, str) and ref not in entry.answers:
            return None
        del self._pending[rid]
        self.counts.joined += 1
        if entry.offset is not None:
            partition, offset = entry.offset
            self._applied.setdefault(partition, set()).add(offset)
        context = fb.context if fb.context is not None else d.get("context")
        answer = entry.answers.get(ref, {}) if isinstance(ref, str) else {}
        return Joined(rid, context if isinstance(context, str) else None, d, answer, fb.outputs)

    def expire(self, now_ms: int) -> None:
        """Drop the request ids that waited longer than the window."""
        while self._pending:
            rid, entry = next(iter(self._pending.items()))
            if now_ms - entry.since_ms <= self.window_ms:
                break
            del self._pending[rid]
            self._drop(rid, entry)

    def _drop(self, rid: str, entry: _Pending) -> None:
        self.counts.expired += 1
        if entry.feedback is not None:
            self.counts.expired_feedback += 1

    def watermark(self) -> tuple[dict[int, int], dict[int, list[int]]]:
        """Per feedback partition, the offset below which every record was handed on or dropped, and the
        offsets at or above it that were handed on already."""
        waiting: dict[int, int] = {}
        for entry in self._pending.values():
            if entry.offset is not None:
                p, o = entry.offset
                waiting[p] = min(waiting.get(p, o), o)
        marks = {p: waiting.get(p, end) for p, end in self._read_to.items()}
        applied: dict[int, list[int]] = {}
        for p, offsets in self._applied.items():
            mark = marks.get(p, 0)
            offsets.difference_update([o for o in offsets if o < mark])  # below the mark: implied
            if offsets:
                applied[p] = sorted(offsets)
        return marks, applied
