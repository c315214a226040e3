"""InlineHost reports a worker task that dies instead of leaving it to be noticed as missing replies."""

from __future__ import annotations

import asyncio
import logging

import pytest

from flowserve.runtime.host import _report_crash


async def test_a_dead_worker_task_is_logged_at_once(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(broken(), name="worker-x")
    task.add_done_callback(_report_crash)
    with caplog.at_level(logging.ERROR, logger="flowserve.host"):
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)  # done callbacks run on the next loop turn
    assert "worker-x died: RuntimeError('boom')" in caplog.text


async def test_a_cancelled_or_finished_task_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    async def fine() -> None:
        await asyncio.sleep(3600)

    task = asyncio.create_task(fine())
    task.add_done_callback(_report_crash)
    task.cancel()
    with caplog.at_level(logging.ERROR, logger="flowserve.host"):
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
    assert "died" not in caplog.text
