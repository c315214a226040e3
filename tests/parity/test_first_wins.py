"""First-wins inputs keep a request's first record per topic partition and drop later ones."""

from __future__ import annotations

from dataclasses import dataclass

from flowserve.parity.first_wins import FirstWins, FirstWinsHooks


@dataclass
class Rec:
    topic: str
    partition: int
    key: bytes | None


def test_a_second_record_of_a_request_is_dropped_only_on_first_wins_topics() -> None:
    fw = FirstWins({"t.model.logits"})
    first = [Rec("t.model.logits", 0, b"r1"), Rec("t.other", 0, b"r1"), Rec("t.model.logits", 0, b"r2")]
    assert fw.keep(first) == first
    later = [Rec("t.model.logits", 0, b"r1"), Rec("t.other", 0, b"r1"), Rec("t.model.logits", 0, None)]
    assert fw.keep(later) == later[1:]


def test_memory_is_bounded_and_forgotten_with_the_partition() -> None:
    fw = FirstWins({"t"}, capacity=2)
    fw.keep([Rec("t", 0, b"a"), Rec("t", 0, b"b"), Rec("t", 0, b"c")])
    assert fw.keep([Rec("t", 0, b"a")]) == [Rec("t", 0, b"a")]  # pushed out by b and c
    assert fw.keep([Rec("t", 0, b"c")]) == []
    fw.drop([Rec("t", 0, None)])
    assert fw.keep([Rec("t", 0, b"c")]) == [Rec("t", 0, b"c")]


def test_the_hook_drops_and_counts_duplicates_and_forgets_moved_partitions() -> None:
    hook = FirstWinsHooks({"t"})
    fetched = [Rec("t", 0, b"a"), Rec("u", 0, b"a"), Rec("t", 0, b"a")]
    assert hook.admit(fetched) == fetched[:2]
    assert hook.admit([Rec("t", 0, b"a")]) == []
    assert hook.counters() == {"duplicates": 2}
    hook.forget([Rec("t", 0, None)])  # the partition moved: its records will be read again
    assert hook.admit([Rec("t", 0, b"a")]) == [Rec("t", 0, b"a")]
