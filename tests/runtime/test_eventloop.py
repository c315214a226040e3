"""Which event loop a worker process runs on: uvloop when installed (``auto``), else asyncio's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from flowserve.runtime.eventloop import install


@pytest.fixture
def policy() -> Iterator[None]:
    saved = asyncio.get_event_loop_policy()
    yield
    asyncio.set_event_loop_policy(saved)


def test_install_makes_the_loops_code_creates_itself_uvloops(policy: None) -> None:
    uvloop = pytest.importorskip("uvloop")
    install("auto")
    loop = asyncio.new_event_loop()  # what a faust/mode worker does
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_asyncio_keeps_the_standard_loop(policy: None) -> None:
    install("asyncio")
    loop = asyncio.new_event_loop()
    try:
        assert type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()
