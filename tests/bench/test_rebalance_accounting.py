"""``flowserve bench tuner --part rebalance``'s accounting: a stall on some partitions around a change is
counted on those partitions alone, a record never read is the worst latency, and records outside the window
do not count."""

from __future__ import annotations

import math

from flowserve_bench.rebalance import Change, around, summarise


def _run(stall: set[int], *, at: float = 10.0, stall_s: float = 2.0) -> tuple[dict, dict]:
    """100 records/s over 4 partitions for 30 s, read 20 ms after sending; those of ``stall``'s partitions
    sent in the 2 s after ``at`` are read at ``at + stall_s``."""
    sent, first = {}, {}
    for rid in range(3000):
        ts, partition = rid / 100, rid % 4
        sent[rid] = (ts, partition)
        first[rid] = at + stall_s if partition in stall and at <= ts < at + stall_s else ts + 0.02
    return sent, first


def test_a_clean_change_has_nothing_late() -> None:
    sent, first = _run(set())
    change = around(sent, first, 10.0)
    assert (change.records, change.late, change.stalled_partitions) == (1600, 0, 0)
    assert math.isclose(change.worst_s, 0.02)


def test_a_stall_counts_on_its_partitions_alone() -> None:
    sent, first = _run({1, 3})
    change = around(sent, first, 10.0)
    assert change.records == 1600  # 1 s before to 15 s after, at 100/s
    # records of partitions 1 and 3 sent in [10, 11.75) wait past 250 ms for their read at 12 s
    assert change.stalled_partitions == 2
    assert change.late == sum(1 for ts, p in sent.values() if p in (1, 3) and 10.0 <= ts < 11.75 - 1e-9)
    assert math.isclose(change.worst_s, 1.99)  # partition 1's first record, sent at 10.01 s
    assert around(sent, first, 25.0).late == 0  # another change's window does not see it


def test_a_record_never_read_is_late_and_the_worst() -> None:
    sent, first = _run(set())
    del first[1200]  # sent at 12 s
    change = around(sent, first, 10.0)
    assert change.late == 1 and change.worst_s == math.inf and change.stalled_partitions == 1


def test_the_row_takes_the_median_and_the_worst_of_the_runs() -> None:
    runs = [{"join": Change(100, late, worst, parts), "leave": Change(100, 0, 0.1, 0), "never_read": 0}
            for late, worst, parts in ((10, 0.5, 2), (30, 3.0, 4), (20, 1.0, 3))]
    row = summarise("kip848-uniform-5s", runs)
    assert (row["join_late"], row["join_worst_s"], row["join_stalled_partitions"]) == (20, 3.0, 4)
    assert (row["leave_late"], row["runs"], row["heartbeat_ms"]) == (0, 3, 5000)
