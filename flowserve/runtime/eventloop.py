"""Which asyncio event loop a long-running flowserve process runs on: the standard one, or uvloop's.

uvloop (libuv under asyncio's API) makes each turn of the loop and each socket write cheaper; the gateway
spends most of its CPU there (a turn, a task and a socket write per HTTP request). ``auto`` takes uvloop
when it is installed and the standard loop otherwise, so it stays optional.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from flowserve.errors import FlowserveError

T = TypeVar("T")
LoopKind = Literal["auto", "asyncio", "uvloop"]


def loop_factory(kind: LoopKind) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A factory of ``kind``'s loops, or None for asyncio's default."""
    if kind == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if kind == "uvloop":
            raise FlowserveError("event loop 'uvloop' asked for, but uvloop is not installed "
                                 "(pip install uvloop)") from None
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], kind: LoopKind = "auto") -> T:
    """``asyncio.run(main)`` on ``kind``'s event loop."""
    with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
        return runner.run(main)


def install(kind: LoopKind) -> None:
    """Make ``kind``'s loops the ones asyncio creates from now on in this process, for code that makes its
    own loop (a faust/mode worker does)."""
    factory = loop_factory(kind)
    if factory is not None:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
