"""HeldOffsets: the commit bound of a component whose state still needs earlier requests (no broker)."""

from __future__ import annotations

from typing import ClassVar

from flowserve.component import Component
from flowserve.runtime.held import HeldOffsets


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
