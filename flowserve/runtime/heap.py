"""Keep Python's full garbage collections off the serving path.

A worker that imported torch holds ~200k long-lived objects; a full (generation 2) collection walks all
of them, ~95 ms on this machine, and CPython starts one whenever enough new objects have survived, in
the middle of serving. Each is a stall of every request in flight: the spikes of the p99. Freezing the
heap once start-up is done moves what exists then (modules, models, settings) out of the collector's
sight, so later full collections only walk what serving created.
"""

from __future__ import annotations

import atexit
import gc

_settled = False


def settle() -> None:
    """Collect start-up garbage once, then freeze what is left. Idempotent; call after loading models."""
    global _settled
    if _settled:
        gc.freeze()  # a second component in the same process (tests, InlineHost): its objects too
        return
    gc.collect()
    gc.freeze()
    # Frozen objects are never freed, not even at exit, where extension modules (torch's triton) then
    # report them as leaks: hand them back to the collector before the interpreter shuts down.
    atexit.register(gc.unfreeze)
    _settled = True
