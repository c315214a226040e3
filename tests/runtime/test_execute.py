"""Where a batch runs: an offloading component in a thread until its batches prove short."""

from __future__ import annotations

import threading
from typing import ClassVar

import numpy as np
from fs_testkit import WhereAmI

from flowserve.component import Batch, Component, Port
from flowserve.runtime.execute import Executor


def _batch() -> Batch:
    return Batch({"x": np.zeros((1, 4), np.float32)}, [1], ["r"])


class Inline(Component):
    inputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 4])}
    outputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 4])}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"x": batch["x"], "thread": np.array([threading.get_ident()])}


async def test_an_offloading_component_runs_in_a_thread_until_its_batches_are_short() -> None:
    WhereAmI.threads.clear()
    executor = Executor(WhereAmI(), inline_below_s=0.001)
    main = threading.get_ident()
    _, seconds = await executor.run(_batch())
    assert WhereAmI.threads[-1] != main and seconds >= 0  # nothing known yet: a thread
    executor.observe(0.0001)
    await executor.run(_batch())
    assert WhereAmI.threads[-1] == main  # short batches: inline, no handoff
    executor.observe(0.5)  # one slow batch sends the next ones back to a thread at once
    await executor.run(_batch())
    assert WhereAmI.threads[-1] != main


async def test_a_component_that_does_not_offload_runs_on_the_loop() -> None:
    result, _ = await Executor(Inline(), inline_below_s=0.0).run(_batch())
    assert result["thread"][0] == threading.get_ident()  # type: ignore[index]
