"""Helpers shared by the bench workloads."""

from __future__ import annotations

import uuid
from typing import ClassVar

from rich.console import Console

from flowserve.component import Batch, Component, Port

console = Console(stderr=True)


class Identity(Component):
    """Passes its input through unchanged: the cheapest possible node, to measure the framework itself."""

    inputs: ClassVar[dict[str, Port]] = {"x": Port("UINT8", [-1, -1])}
    outputs: ClassVar[dict[str, Port]] = {"x": Port("UINT8", [-1, -1])}
    max_batch: ClassVar[int] = 4096

    def process(self, batch: Batch) -> dict:
        return {"x": batch["x"]}


def run_id() -> str:
    return uuid.uuid4().hex[:8]
