"""A bench's result as a file kept under version control (``flowserve bench X --save``).

``docs/benchmarks.md`` is generated from these files (``python benchmarks/render.py``), so every figure
it shows names the command that printed it, the day it ran and the machine it ran on.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """What a reader needs to weigh a figure: cores, memory, the processor and the Python."""
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            mem_gib = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {"cores": os.cpu_count(), "memory_gib": mem_gib, "processor": platform.machine(),
            "python": platform.python_version(), "system": platform.system()}


def saved(bench: str, result: dict[str, Any], argv: list[str] | None = None) -> dict[str, Any]:
    """The document written for one run: the command as typed, when, where, and the bench's own result."""
    args = list(sys.argv[1:] if argv is None else argv)
    return {"bench": bench, "command": "flowserve " + shlex.join(args),
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(), "result": result}


def save(path: str | Path, bench: str, result: dict[str, Any], argv: list[str] | None = None) -> Path:
    path = Path(path)
    if path.is_dir() or not path.suffix:
        path = path / f"{bench}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(saved(bench, result, argv), indent=1, sort_keys=False) + "\n")
    return path
