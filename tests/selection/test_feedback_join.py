"""The feedback join: parts in any order, bounded by a window and a count, and its feedback watermark."""

from __future__ import annotations

import numpy as np

from flowserve.selection.join import FeedbackJoin
from flowserve.wire.feedback import Feedback


def fb(rid: str, label: int = 1, context: str | None = None) -> Feedback:
    return Feedback(rid, {"label": np.array([label])}, context, 0)


def decision(rid: str, answer: str | None = "a.label") -> dict[str, object]:
    return {"id": rid, "context": "d", "arm": 0, "p": 0.5, "answer": answer}


def test_parts_join_in_any_order() -> None:
    join = FeedbackJoin(window_ms=1000, max_pending=10)
    assert join.feedback(fb("r", context="f"), 0, 0, now_ms=0) is None
    assert join.answer("a.label", "r", {"label": np.array([1])}, now_ms=1) is None
    done = join.decision(decision("r"), now_ms=2)
    assert done is not None and done.context == "f" and done.answer["label"].tolist() == [1]
    assert len(join) == 0 and join.counts.joined == 1
    # no answer named (an ensemble): decision + feedback is enough, and the decision's context is used
    join.decision(decision("s", answer=None), now_ms=3)
    done = join.feedback(fb("s"), 0, 1, now_ms=3)
    assert done is not None and done.context == "d" and done.answer == {}


def test_window_and_count_bound_the_wait() -> None:
    join = FeedbackJoin(window_ms=100, max_pending=2)
    join.feedback(fb("old"), 0, 0, now_ms=0)
    join.decision(decision("x"), now_ms=50)
    join.expire(now_ms=150)
    assert len(join) == 1 and join.counts.expired_feedback == 1
    join.decision(decision("y"), now_ms=160)
    join.decision(decision("z"), now_ms=170)
    assert len(join) == 2 and join.counts.evicted == 1


def test_watermark_stops_at_the_oldest_waiting_feedback_and_resume_skips_what_was_learned() -> None:
    join = FeedbackJoin(window_ms=1000, max_pending=10)
    join.feedback(fb("waits"), 0, 5, now_ms=0)
    join.decision(decision("done", answer=None), now_ms=0)
    join.feedback(fb("done"), 0, 6, now_ms=0)
    assert join.watermark() == ({0: 5}, {0: [6]})
    restarted = FeedbackJoin(window_ms=1000, max_pending=10)
    restarted.resume({0: 5}, {0: [6]})
    restarted.decision(decision("done", answer=None), now_ms=0)
    assert restarted.feedback(fb("done"), 0, 6, now_ms=0) is None  # learned before the restart
    restarted.decision(decision("waits", answer=None), now_ms=0)
    assert restarted.feedback(fb("waits"), 0, 5, now_ms=0) is not None
    assert restarted.watermark()[0] == {0: 7}
