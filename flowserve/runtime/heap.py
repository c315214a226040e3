"""Keep Python's full garbage collections off the serving path.

A worker that imported torch holds ~200k long-lived objects; a full (generation 2) collection walks all
of them, ~95 ms on this machine, and CPython starts one whenever enough new objects have survived, in
the middle of serving. Each is a stall of every request in flight: the spikes of the p99. Freezing the
heap once start-up is done moves what exists then (modules, models, settings) out of the collector's
sight, so later full collections only walk what serving created.

Serving allocates a few containers per record (its tuple, headers, the request), nearly all freed at once
by reference counting; at CPython's default the youngest generation is collected every 700 surviving
allocations anyway, each pass walking whatever is in flight. The serving threshold lets it fill up to
:data:`YOUNG_THRESHOLD` first: cyclic garbage waits a little longer, and the passes that find none are
fewer.
"""

from __future__ import annotations

import atexit
import gc

_settled = False
#: collect the youngest generation after this many net allocations (CPython's default is 700)
YOUNG_THRESHOLD = 20_000


def settle() -> None:
    """Collect start-up garbage once, then freeze what is left. Idempotent; call after loading models."""
    global _settled
    if _settled:
        gc.freeze()  # a second component in the same process (tests, InlineHost): its objects too
        return
    gc.collect()
    gc.freeze()
    young, older, oldest = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, young), older, oldest)
    # Frozen objects are never freed, not even at exit, where extension modules (torch's triton) then
    # report them as leaks: hand them back to the collector before the interpreter shuts down.
    atexit.register(gc.unfreeze)
    _settled = True
