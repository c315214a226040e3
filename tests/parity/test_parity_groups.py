"""Encoder grouping and decoder reconstruction, driven by a fake clock (no broker)."""

from __future__ import annotations

import numpy as np
import pytest

from flowserve.parity import Decoder, Encoder, Member


def _x(value: float) -> dict[str, np.ndarray]:
    return {"x": np.full((1, 4), value, np.float32)}


def test_k_requests_from_different_stripes_make_one_summed_query() -> None:
    enc = Encoder(k=2, wait_ms=20, partitions=4)  # stripes: partitions 0,1 -> 0; 2,3 -> 1
    assert enc.add(0, Member("a", 0), _x(1), now_ms=0) is None
    group = enc.add(2, Member("b", 2), _x(2), now_ms=1)
    assert group is not None
    assert [m.request_id for m in group.members] == ["a", "b"]
    assert group.partition == 0  # the first member's partition
    np.testing.assert_array_equal(group.query["x"], np.full((1, 4), 3, np.float32))
    assert group.query["x"].dtype == np.float32
    assert enc.counters.groups == 1 and len(enc) == 0


def test_requests_read_by_the_same_worker_never_share_a_group() -> None:
    # Partitions 0 and 1 are one stripe (one worker under range assignment): they cannot protect each other.
    enc = Encoder(k=2, wait_ms=20, partitions=4)
    assert enc.add(0, Member("a", 0), _x(1), 0) is None
    assert enc.add(0, Member("b", 0), _x(1), 1) is None
    assert enc.add(1, Member("c", 1), _x(1), 2) is None
    assert len(enc) == 3  # three open groups, one member each
    group = enc.add(3, Member("d", 3), _x(1), 3)
    assert group is not None and [m.request_id for m in group.members] == ["a", "d"]  # the oldest open group
    for g_partition in {m.partition for m in group.members}:
        assert sum(enc.stripe(m.partition) == enc.stripe(g_partition) for m in group.members) == 1


def test_a_lone_request_is_not_held_past_the_wait() -> None:
    enc = Encoder(k=3, wait_ms=20, partitions=6)
    assert enc.add(0, Member("lone", 0), _x(1), now_ms=0) is None
    assert enc.expire(now_ms=20) == 0  # still within its wait
    assert enc.expire(now_ms=21) == 1
    assert len(enc) == 0 and enc.counters.abandoned == 1
    # a request arriving after the wait starts a new group rather than joining the stale one
    assert enc.add(2, Member("b", 2), _x(1), now_ms=30) is None
    assert enc.add(4, Member("c", 4), _x(1), now_ms=60) is None
    assert enc.counters.abandoned == 2


def test_requests_of_different_row_counts_never_share_a_group() -> None:
    enc = Encoder(k=2, wait_ms=20, partitions=2)
    assert enc.add(0, Member("one", 0), _x(1), 0) is None
    assert enc.add(1, Member("two", 1), {"x": np.ones((2, 4), np.float32)}, 1) is None
    assert len(enc) == 2


def test_k_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        Encoder(k=1, wait_ms=10, partitions=4)


def _linear(x: np.ndarray) -> np.ndarray:
    return x @ np.arange(12, dtype=np.float64).reshape(4, 3) - 0.5 * x[:, :3]


def test_decoder_reconstructs_a_linear_models_missing_output_exactly() -> None:
    rng = np.random.default_rng(0)
    inputs = [rng.integers(-8, 8, (1, 4)).astype(np.float64) for _ in range(3)]
    members = [Member(f"r{i}", i, {"fs-deadline": b"123"}) for i in range(3)]
    dec = Decoder(hold_ms=1000)
    assert dec.real("r0", {"y": _linear(inputs[0])}, 0) == []
    assert dec.real("r2", {"y": _linear(inputs[2])}, 1) == []
    # the parity model of a linear model is the model itself: f(x0 + x1 + x2) = f(x0) + f(x1) + f(x2)
    out = dec.parity("g", members, {"y": _linear(sum(inputs))}, 2)
    assert len(out) == 1
    rebuilt = out[0]
    assert rebuilt.member == members[1] and rebuilt.group_id == "g" and rebuilt.members == ("r0", "r1", "r2")
    np.testing.assert_array_equal(rebuilt.outputs["y"], _linear(inputs[1]))
    assert dec.counters.reconstructed == 1


def test_parity_first_then_the_k_minus_1th_real_output_triggers_the_rebuild() -> None:
    dec = Decoder(hold_ms=1000)
    members = [Member("a", 0), Member("b", 2)]
    assert dec.parity("g", members, {"y": np.array([[5.0]])}, 0) == []  # nothing real yet
    out = dec.real("b", {"y": np.array([[2.0]])}, 1)
    assert [r.member.request_id for r in out] == ["a"]
    np.testing.assert_array_equal(out[0].outputs["y"], [[3.0]])


def test_no_rebuild_when_every_real_output_arrived() -> None:
    dec = Decoder(hold_ms=1000)
    dec.real("a", {"y": np.array([[1.0]])}, 0)
    dec.real("b", {"y": np.array([[2.0]])}, 0)
    assert dec.parity("g", [Member("a"), Member("b")], {"y": np.array([[3.0]])}, 1) == []
    assert dec.counters.reconstructed == 0


def test_a_late_real_output_after_its_rebuild_is_a_duplicate() -> None:
    dec = Decoder(hold_ms=1000)
    dec.real("a", {"y": np.array([[1.0]])}, 0)
    assert len(dec.parity("g", [Member("a"), Member("b")], {"y": np.array([[3.0]])}, 1)) == 1
    assert dec.real("b", {"y": np.array([[2.0]])}, 5) == []
    assert dec.counters.late_real == 1 and dec.counters.reconstructed == 1


def test_a_group_whose_parity_output_is_lost_rebuilds_nothing_and_is_forgotten() -> None:
    dec = Decoder(hold_ms=100)
    # the real outputs flow on their own path; without the parity output nothing can (or need) be rebuilt
    assert dec.real("a", {"y": np.array([[1.0]])}, 0) == []
    assert dec.real("b", {"y": np.array([[2.0]])}, 1) == []
    dec.expire(now_ms=500)
    assert dec.counters.reconstructed == 0
    # the parity output of a group whose members are gone from memory waits, then is forgotten too
    assert dec.parity("late", [Member("a"), Member("b")], {"y": np.array([[3.0]])}, 600) == []
    dec.expire(now_ms=800)
    assert dec.counters.lost_groups == 1
