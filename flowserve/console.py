"""The command line's consoles: rich output on a terminal, unwrapped lines in pipes and logs.

Rich wraps text at 80 columns when its stream is not a terminal, which splits a figure from its label in
``flowserve run ... | tee run.log``. Here a line printed is one line wherever it goes; tables take the
width they need (up to ``COLUMNS`` when set, else 200 columns) instead of squeezing into 80.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

_PIPE_WIDTH = 200


def make_console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and int(columns) > 0 else _PIPE_WIDTH
    return Console(stderr=stderr, soft_wrap=True, width=width)
