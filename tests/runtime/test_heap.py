"""After start-up the heap is frozen, so full collections only walk what serving created."""

from __future__ import annotations

import gc

from flowserve.runtime.heap import settle


def test_settle_freezes_what_exists_and_can_be_called_again() -> None:
    settle()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    keep = [[] for _ in range(100)]  # containers: what the collector tracks
    settle()  # a later component in the same process: its objects are frozen too
    assert gc.get_freeze_count() >= frozen + len(keep)
