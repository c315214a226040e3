"""Helpers shared by the bench workloads."""

from __future__ import annotations

import os
import resource
import uuid
from pathlib import Path
from typing import ClassVar

from flowserve.component import Batch, Component, Port
from flowserve.console import make_console

console = make_console(stderr=True)


class Identity(Component):
    """Passes its input through unchanged: the cheapest possible node, to measure the framework itself."""

    inputs: ClassVar[dict[str, Port]] = {"x": Port("UINT8", [-1, -1])}
    outputs: ClassVar[dict[str, Port]] = {"x": Port("UINT8", [-1, -1])}
    max_batch: ClassVar[int] = 4096

    def process(self, batch: Batch) -> dict:
        return {"x": batch["x"]}


def run_id() -> str:
    return uuid.uuid4().hex[:8]


def cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system, all threads) of this process, or of another by pid (Linux; 0.0 once it
    has exited)."""
    if pid is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def stat_cpu_seconds(stat: Path) -> float:
    """CPU seconds (user + system) a ``/proc`` stat file reports: a process's (``/proc/<pid>/stat``) or one
    thread's (``/proc/<pid>/task/<tid>/stat``); 0.0 when it cannot be read (gone)."""
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
