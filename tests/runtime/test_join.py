"""Per-request joins with a fake clock: inner, outer and any semantics, offsets a commit must respect."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flowserve.errors import ErrorKind, Failure
from flowserve.runtime.join import JoinBuffer, Ready
from flowserve.topology import Node, load_topology_text
from flowserve.wire.envelope import H_DEADLINE, H_ERROR, H_ERROR_KIND, H_ID, Envelope

COMPONENTS_DIR = Path(__file__).resolve().parents[1] / "topology"  # fs_test_components.py
LEFT, RIGHT, MID = "fs.j.left.y", "fs.j.right.y", "fs.j.mid.y"


@pytest.fixture(autouse=True)
def _test_components_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(COMPONENTS_DIR))


def build(target: str, *, window_ms: int = 100, join: str = "inner") -> Node:
    """Node ``target`` of a topology where ``left``, ``mid`` and ``right`` all read the input."""
    scale = "fs_test_components:Scale"
    text = f"""
name: j
nodes:
  left: {{component: "{scale}", inputs: {{x: input.x}}}}
  mid: {{component: "{scale}", inputs: {{x: input.x}}}}
  right: {{component: "{scale}", inputs: {{x: input.x}}}}
  merge:
    component: fs_test_components:Pair
    inputs: {{a: left.y, b: right.y}}
    join: {{type: {join}, window_ms: {window_ms}}}
  merge3:
    component: fs_test_components:Pair
    inputs: {{a: left.y, b: right.y}}
    triggers: [mid.y]
    join: {{type: {join}, window_ms: {window_ms}}}
  gated:
    component: "{scale}"
    inputs: {{x: left.y}}
    triggers: [right.y]
    join: {{type: {join}, window_ms: {window_ms}}}
outputs: {{m: merge.y, m3: merge3.y, g: gated.y}}
"""
    if join == "any":
        text = text.replace("inputs: {a: left.y, b: right.y}", "inputs: {a: [left.y, right.y], b: [right.y, left.y]}")
    return load_topology_text(text, source="join.yaml").nodes[target]


def env(request_id: str, value: float, *, deadline: int | None = None, error: str | None = None,
        **headers: bytes) -> Envelope:
    hdrs = {H_ID: request_id.encode(), **headers}
    if deadline is not None:
        hdrs[H_DEADLINE] = str(deadline).encode()
    if error is not None:
        hdrs[H_ERROR] = error.encode()
        hdrs[H_ERROR_KIND] = ErrorKind.COMPONENT_FAILURE.value.encode()
    return Envelope(request_id, {} if error else {"y": np.full((1, 4), value, dtype=np.float32)}, hdrs)


def add(buf: JoinBuffer, request_id: str, topic: str, *, partition: int = 0, offset: int = 0, now: int = 0,
        value: float = 1.0, **kwargs: object) -> Ready | None:
    return buf.add(env(request_id, value, **kwargs), topic, (topic, partition), offset, now)  # type: ignore[arg-type]


def test_nodes_under_test_are_joins() -> None:
    assert build("merge").input_topics == (LEFT, RIGHT)
    assert build("merge3").input_topics == (LEFT, MID, RIGHT)
    assert build("gated").input_topics == (LEFT, RIGHT)
    assert all(build(n).needs_join for n in ("merge", "merge3", "gated"))


def test_inner_join_completes_when_every_topic_arrived() -> None:
    buf = JoinBuffer(build("merge"))
    assert add(buf, "r1", LEFT, partition=2, offset=10, now=0, value=1.0) is None
    assert len(buf) == 1
    ready = add(buf, "r1", RIGHT, partition=2, offset=4, now=30, value=2.0)
    assert ready is not None
    assert ready.request_id == "r1" and ready.partition == 2 and ready.error is None
    assert list(ready.tensors) == ["a", "b"]
    assert ready.tensors["a"].tolist() == [[1.0] * 4] and ready.tensors["b"].tolist() == [[2.0] * 4]
    assert ready.headers[H_ID] == b"r1"
    assert len(buf) == 0
    assert buf.expire(10_000) == []


def test_inner_join_waits_for_triggers_too() -> None:
    buf = JoinBuffer(build("merge3"))
    assert add(buf, "r1", LEFT) is None
    assert add(buf, "r1", RIGHT) is None  # every port is bound, the trigger is still missing
    ready = add(buf, "r1", MID)
    assert ready is not None and ready.error is None and set(ready.tensors) == {"a", "b"}


def test_inner_join_window_expiry_names_the_missing_topic() -> None:
    buf = JoinBuffer(build("merge3", window_ms=100))
    add(buf, "r1", LEFT, partition=1, now=1000)
    add(buf, "r1", MID, partition=1, now=1050)
    assert buf.expire(1099) == []
    (ready,) = buf.expire(1100)
    assert ready.request_id == "r1" and ready.partition == 1 and ready.tensors == {}
    assert ready.error == Failure(ErrorKind.JOIN_TIMEOUT,
                                  f"node 'merge3': inner join window of 100 ms closed without input from {RIGHT}")
    assert len(buf) == 0
    assert add(buf, "r1", RIGHT, now=1200) is None  # the late input is dropped
    assert len(buf) == 0


def test_expire_closes_only_the_joins_whose_window_passed() -> None:
    buf = JoinBuffer(build("merge", window_ms=100))
    add(buf, "early", LEFT, now=0)
    add(buf, "late", RIGHT, now=60)
    (first,) = buf.expire(100)
    assert first.request_id == "early"
    assert first.error is not None and first.error.kind == ErrorKind.JOIN_TIMEOUT
    assert first.error.reason.endswith(f"without input from {RIGHT}")
    assert len(buf) == 1
    (second,) = buf.expire(160)
    assert second.request_id == "late"
    assert second.error is not None and second.error.reason.endswith(f"without input from {LEFT}")


def test_outer_join_expiry_with_every_port_bound_goes_without_error() -> None:
    buf = JoinBuffer(build("gated", join="outer", window_ms=50))
    assert add(buf, "r1", LEFT, value=3.0, now=0) is None  # waits the window for the trigger
    assert buf.expire(49) == []
    (ready,) = buf.expire(50)
    assert ready.error is None
    assert ready.tensors["x"].tolist() == [[3.0] * 4]


def test_outer_join_expiry_with_an_unbound_port_is_an_error() -> None:
    buf = JoinBuffer(build("merge", join="outer", window_ms=50))
    add(buf, "r1", RIGHT, now=0)
    (ready,) = buf.expire(50)
    assert ready.error == Failure(ErrorKind.JOIN_TIMEOUT,
                                  f"node 'merge': outer join window of 50 ms closed without input from {LEFT}")


def test_outer_join_completes_early_when_everything_arrived() -> None:
    buf = JoinBuffer(build("gated", join="outer"))
    assert add(buf, "r1", RIGHT) is None
    ready = add(buf, "r1", LEFT, value=5.0)
    assert ready is not None and ready.error is None and ready.tensors["x"].tolist() == [[5.0] * 4]


def test_any_join_first_arrival_wins_and_later_ones_are_dropped() -> None:
    buf = JoinBuffer(build("merge", join="any"))
    ready = add(buf, "r1", RIGHT, value=7.0, offset=3)
    assert ready is not None and ready.error is None
    assert ready.tensors["a"].tolist() == [[7.0] * 4] and ready.tensors["b"].tolist() == [[7.0] * 4]
    assert add(buf, "r1", LEFT, value=8.0, offset=4) is None
    assert len(buf) == 0
    assert buf.oldest_offsets() == {}
    other = add(buf, "r2", LEFT, value=9.0)
    assert other is not None and other.tensors["a"].tolist() == [[9.0] * 4]


def test_any_join_needs_one_of_its_triggers() -> None:
    buf = JoinBuffer(build("gated", join="any"))
    assert add(buf, "r1", LEFT) is None  # data is there, no trigger yet
    ready = add(buf, "r1", RIGHT)
    assert ready is not None and ready.error is None and list(ready.tensors) == ["x"]


def test_error_arrival_short_circuits_the_join() -> None:
    buf = JoinBuffer(build("merge3"))
    add(buf, "r1", LEFT, offset=1)
    ready = add(buf, "r1", MID, offset=2, error="node 'mid': model exploded")
    assert ready is not None
    assert ready.error == Failure(ErrorKind.COMPONENT_FAILURE, "node 'mid': model exploded")
    assert ready.tensors == {}
    assert len(buf) == 0 and buf.oldest_offsets() == {}
    assert add(buf, "r1", RIGHT) is None


def test_error_as_first_arrival_short_circuits() -> None:
    buf = JoinBuffer(build("merge"))
    ready = add(buf, "r1", RIGHT, error="boom")
    assert ready is not None and ready.error == Failure(ErrorKind.COMPONENT_FAILURE, "boom") \
        and ready.headers[H_ERROR] == b"boom"


def test_oldest_offsets_track_pending_joins_and_clear_after_completion() -> None:
    buf = JoinBuffer(build("merge"))
    assert buf.oldest_offsets() == {}
    add(buf, "r1", LEFT, partition=0, offset=5)
    add(buf, "r2", LEFT, partition=0, offset=7)
    assert add(buf, "r2", RIGHT, partition=0, offset=3) is not None
    add(buf, "r3", RIGHT, partition=1, offset=9)
    assert buf.oldest_offsets() == {(LEFT, 0): 5, (RIGHT, 1): 9}
    add(buf, "r4", RIGHT, partition=0, offset=11)
    add(buf, "r4", RIGHT, partition=0, offset=12)  # a duplicate on the same topic still holds its offset
    assert buf.oldest_offsets() == {(LEFT, 0): 5, (RIGHT, 1): 9, (RIGHT, 0): 11}
    assert add(buf, "r1", RIGHT, partition=0, offset=13) is not None
    assert buf.oldest_offsets() == {(RIGHT, 1): 9, (RIGHT, 0): 11}
    assert add(buf, "r4", LEFT, partition=0, offset=14) is not None
    assert add(buf, "r3", LEFT, partition=1, offset=1) is not None
    assert buf.oldest_offsets() == {}


def test_duplicate_arrival_keeps_the_first_envelope() -> None:
    buf = JoinBuffer(build("merge"))
    add(buf, "r1", LEFT, value=1.0)
    add(buf, "r1", LEFT, value=2.0)
    ready = add(buf, "r1", RIGHT, value=3.0)
    assert ready is not None and ready.tensors["a"].tolist() == [[1.0] * 4]


def test_drop_partitions_forgets_their_pending_joins() -> None:
    buf = JoinBuffer(build("merge"))
    add(buf, "p0", LEFT, partition=0, offset=1)
    add(buf, "p1", LEFT, partition=1, offset=2)
    add(buf, "p2", LEFT, partition=2, offset=3)
    buf.drop_partitions({1, 2})
    assert len(buf) == 1
    assert buf.oldest_offsets() == {(LEFT, 0): 1}
    assert buf.expire(10_000)[0].request_id == "p0"
    # after a rebalance back, re-read records rebuild the join: dropped ids are not treated as done
    assert add(buf, "p1", LEFT, partition=1, offset=2) is None
    assert add(buf, "p1", RIGHT, partition=1, offset=5) is not None


def test_tightest_deadline_of_the_inputs_wins() -> None:
    buf = JoinBuffer(build("merge3"))
    add(buf, "r1", LEFT, deadline=300, **{"X-User": b"ann"})
    add(buf, "r1", RIGHT, deadline=100)
    ready = add(buf, "r1", MID, deadline=200)
    assert ready is not None
    assert ready.headers[H_DEADLINE] == b"100"
    assert ready.headers["X-User"] == b"ann"  # other headers come from the first arrival


def test_deadline_from_a_later_input_when_the_first_has_none() -> None:
    buf = JoinBuffer(build("merge3"))
    add(buf, "r1", LEFT)
    add(buf, "r1", RIGHT, deadline=500)
    ready = add(buf, "r1", MID, deadline=400)
    assert ready is not None and ready.headers[H_DEADLINE] == b"400"
    buf2 = JoinBuffer(build("merge"))
    add(buf2, "r2", LEFT)
    ready2 = add(buf2, "r2", RIGHT)
    assert ready2 is not None and H_DEADLINE not in ready2.headers


def test_done_ids_are_remembered_up_to_a_bound() -> None:
    buf = JoinBuffer(build("merge", join="any"), remember=2)
    for rid in ("a", "b", "c"):
        assert add(buf, rid, LEFT) is not None
    assert add(buf, "c", RIGHT) is None  # remembered
    assert add(buf, "b", RIGHT) is None
    assert add(buf, "a", RIGHT) is not None  # forgotten: the bound keeps memory flat
