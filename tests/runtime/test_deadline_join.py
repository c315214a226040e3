"""The deadline join (an ensemble's) with a fake clock: fires when all members are in or at a fraction of
the request's remaining deadline, with the members that arrived; late members are dropped, counted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flowserve.errors import ErrorKind, TopologyError
from flowserve.runtime.join import JoinBuffer, Ready
from flowserve.topology import Node, load_topology_text
from flowserve.wire.envelope import H_DEADLINE, H_ERROR, H_ERROR_KIND, H_ID, Envelope

COMPONENTS_DIR = Path(__file__).resolve().parents[1] / "topology"  # fs_test_components.py
A, B, C = "fs.e.ma.y", "fs.e.mb.y", "fs.e.mc.y"


@pytest.fixture(autouse=True)
def _test_components_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(COMPONENTS_DIR))


def topology_text(join: str = "{type: deadline, fraction: 0.5, timeout_ms: 300, window_ms: 1000}",
                  component: str = "fs_test_components:Mean") -> str:
    scale = "fs_test_components:Scale"
    return f"""
name: e
nodes:
  ma: {{component: "{scale}", inputs: {{x: input.x}}}}
  mb: {{component: "{scale}", inputs: {{x: input.x}}}}
  mc: {{component: "{scale}", inputs: {{x: input.x}}}}
  avg:
    component: {component}
    inputs: {{a: ma.y, b: mb.y, c: mc.y}}
    join: {join}
outputs: {{y: avg.y}}
"""


def build(**kwargs: str) -> Node:
    return load_topology_text(topology_text(**kwargs), source="e.yaml").nodes["avg"]


def env(request_id: str, value: float, *, deadline: int | None = None, error: bool = False) -> Envelope:
    hdrs = {H_ID: request_id.encode()}
    if deadline is not None:
        hdrs[H_DEADLINE] = str(deadline).encode()
    if error:
        hdrs[H_ERROR] = b"member failed"
        hdrs[H_ERROR_KIND] = ErrorKind.COMPONENT_FAILURE.value.encode()
    return Envelope(request_id, {} if error else {"y": np.full((2, 4), value, dtype=np.float32)}, hdrs)


def add(buf: JoinBuffer, rid: str, topic: str, now: int, value: float = 1.0, offset: int = 0,
        **kwargs: object) -> Ready | None:
    return buf.add(env(rid, value, **kwargs), topic, (topic, 0), offset, now)  # type: ignore[arg-type]


def test_all_members_in_fires_at_once_with_nothing_absent() -> None:
    buf = JoinBuffer(build())
    assert add(buf, "r", A, 0, 1.0, deadline=1000) is None
    assert add(buf, "r", B, 10, 2.0, deadline=1000) is None
    ready = add(buf, "r", C, 20, 3.0, deadline=1000)
    assert ready is not None and ready.error is None and ready.absent == ()
    assert [float(ready.tensors[p][0, 0]) for p in "abc"] == [1.0, 2.0, 3.0]
    assert len(buf) == 0 and buf.expire(10_000) == []  # its timer is stale: no second answer


def test_fires_at_the_fraction_of_the_remaining_deadline() -> None:
    buf = JoinBuffer(build())
    add(buf, "r", A, 200, deadline=1200)  # 1000 ms left at first arrival; fraction 0.5 -> fires at 700
    add(buf, "r", B, 300, deadline=1200)
    assert buf.next_fire() == 700
    assert buf.expire(699) == []
    [ready] = buf.expire(700)
    assert ready.error is None and ready.absent == ("c",)
    assert ready.tensors["c"].shape == (2, 4) and not ready.tensors["c"].any()  # zero-filled, same rows
    assert buf.partial == 1 and buf.next_fire() is None


def test_without_a_deadline_the_node_timeout_applies_and_window_caps_it() -> None:
    buf = JoinBuffer(build())
    add(buf, "r", A, 100)
    assert buf.next_fire() == 400  # timeout_ms 300
    add(buf, "far", A, 100, deadline=1_000_000)
    assert buf.fire_at(env("far", 1.0, deadline=1_000_000), 100) == 1100  # window_ms 1000 caps 0.5 * ~1e6
    fired = buf.expire(1100)
    assert [r.request_id for r in fired] == ["r", "far"]
    assert all(r.absent == ("b", "c") for r in fired)


def test_requests_fire_in_their_own_deadline_order() -> None:
    buf = JoinBuffer(build())
    add(buf, "slow", A, 0, deadline=1000)  # fires at 500
    add(buf, "tight", A, 0, deadline=200)  # fires at 100, although it came second
    assert [r.request_id for r in buf.expire(100)] == ["tight"]
    assert [r.request_id for r in buf.expire(500)] == ["slow"]


def test_members_after_the_fire_are_dropped_and_counted() -> None:
    buf = JoinBuffer(build())
    add(buf, "r", A, 0, deadline=1000)
    [ready] = buf.expire(500)
    assert ready.absent == ("b", "c")
    assert add(buf, "r", B, 600, deadline=1000) is None  # late: answered already
    assert add(buf, "r", C, 1500, deadline=1000) is None  # late and past due
    assert buf.late == 2 and len(buf) == 0 and buf.expire(10_000) == []


def test_an_arrival_past_its_deadline_starts_nothing() -> None:
    buf = JoinBuffer(build(), remember=1)
    add(buf, "r", A, 0, deadline=100)
    add(buf, "r2", A, 0, deadline=100)
    buf.expire(50)  # both answered; "r" already forgotten (remember=1)
    assert add(buf, "r", B, 200, deadline=100) is None
    assert len(buf) == 0 and buf.late == 1


def test_a_member_error_counts_as_absent() -> None:
    buf = JoinBuffer(build())
    add(buf, "r", A, 0, deadline=1000)
    add(buf, "r", B, 1, deadline=1000, error=True)
    ready = add(buf, "r", C, 2, deadline=1000)
    assert ready is not None and ready.error is None and ready.absent == ("b",)


def test_every_member_an_error_fails_the_request() -> None:
    buf = JoinBuffer(build())
    for topic in (A, B):
        add(buf, "r", topic, 0, deadline=1000, error=True)
    ready = add(buf, "r", C, 0, deadline=1000, error=True)
    assert ready is not None and ready.error is not None and ready.error.kind is ErrorKind.COMPONENT_FAILURE
    assert ready.headers[H_ID] == b"r"  # the error result keeps the request's headers (reply routing)


def test_pending_members_hold_back_commits_until_the_fire() -> None:
    buf = JoinBuffer(build())
    add(buf, "r", A, 0, offset=7, deadline=1000)
    assert buf.oldest_offsets() == {(A, 0): 7}
    buf.expire(500)
    assert buf.oldest_offsets() == {}


def test_options_of_the_deadline_join_are_checked_at_load_time() -> None:
    with pytest.raises(TopologyError, match="node 'avg'.*fraction apply to 'type: deadline' only"):
        build(join="{type: inner, fraction: 0.5}")
    with pytest.raises(TopologyError, match="fraction"):
        build(join="{type: deadline, fraction: 1.5}")
    with pytest.raises(TopologyError, match="does not declare 'accepts_absent'") as err:
        build(join="{type: deadline}", component="fs_test_components:Sum3")
    assert err.value.node == "avg"


def test_a_fused_chain_cannot_start_behind_a_deadline_join() -> None:
    text = topology_text() + "fuse: {both: [avg, after]}\n"
    text = text.replace("outputs: {y: avg.y}", """  after: {component: "fs_test_components:Scale", inputs: {x: avg.y}}
outputs: {y: after.y}""")
    with pytest.raises(TopologyError, match="behind a deadline join"):
        load_topology_text(text, source="e.yaml")
