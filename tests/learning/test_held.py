"""HeldOffsets: the commit bound of a component whose state still needs earlier requests (no broker)."""

from __future__ import annotations

from typing import ClassVar

import pytest

from flowserve.component import Component
from flowserve.errors import ComponentError, ErrorKind
from flowserve.learning.held import HeldHooks, HeldOffsets, held_hooks
from flowserve.runtime.emit import Item
from flowserve.runtime.hooks import BatchOutcome
from flowserve.runtime.join import Ready


class Window(Component):
    keeps_state: ClassVar[bool] = True
    oldest: str | None = None

    def oldest_held(self) -> str | None:
        return self.oldest


def test_the_bound_is_the_oldest_needed_request_per_partition() -> None:
    component = Window()
    held = HeldOffsets(component)
    held.processed([("r0", "t:0:10"), ("r1", "t:1:5"), ("r2", "t:0:11"), ("r3", "t:1:6")])
    component.oldest = "r1"  # r0's rows are in a window already reported: it may be committed
    assert held.oldest() == {("t", 1): 5, ("t", 0): 11}
    assert len(held) == 3
    component.oldest = "r3"
    assert held.oldest() == {("t", 1): 6}
    component.oldest = None  # nothing needed: everything may be committed, nothing is kept
    assert held.oldest() == {}
    assert len(held) == 0


def test_a_request_this_worker_never_read_holds_nothing_back() -> None:
    component = Window()
    held = HeldOffsets(component)
    held.processed([("r0", "a.b:0:1")])
    component.oldest = "elsewhere"
    assert held.oldest() == {}


class Forgetful(Component):
    keeps_state: ClassVar[bool] = True  # declares state but cannot say what it holds


def test_the_hook_is_attached_to_stateful_components_only_and_checks_their_capability() -> None:
    assert held_hooks(None, None, Component()) == []  # type: ignore[arg-type]
    with pytest.raises(ComponentError, match="node 'd': Forgetful cannot keep state .* it lacks oldest_held") as info:
        held_hooks(None, None, Forgetful(node="d"))  # type: ignore[arg-type]
    assert info.value.kind == ErrorKind.INVALID_TOPOLOGY
    component = Window()
    (hook,) = held_hooks(None, None, component)  # type: ignore[arg-type]
    assert isinstance(hook, HeldHooks) and hook.holds_offsets
    items = [Item(Ready("r0", {}, {}, 0), source="t:0:7"), Item(Ready("r1", {}, {}, 0), source="t:0:8")]
    hook.end(hook.begin(items), BatchOutcome([1, 1], {}, {}, {}))
    component.oldest = "r1"
    assert hook.held_offsets() == {("t", 0): 8}
