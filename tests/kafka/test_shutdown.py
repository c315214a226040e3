"""Bounded shutdown: a stop that hangs is cancelled after its time, and the warning says where it waited."""

from __future__ import annotations

import asyncio
import logging

import pytest

from flowserve.kafka.shutdown import bounded, stop_client, waiting_at


class _StuckClient:
    """Stands for an aiokafka client whose stop awaits a coordination task that never finishes."""

    def __init__(self) -> None:
        self.cancelled = False
        self._coordination = asyncio.get_running_loop().create_future()

    async def stop(self) -> None:
        try:
            await self._wait_for_coordination()
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def _wait_for_coordination(self) -> None:
        await asyncio.shield(asyncio.ensure_future(self._forever(), loop=asyncio.get_running_loop()))

    async def _forever(self) -> None:
        await self._coordination


async def test_a_stuck_stop_is_cancelled_and_says_where_it_waited(caplog: pytest.LogCaptureFixture) -> None:
    client = _StuckClient()
    with caplog.at_level(logging.WARNING, logger="flowserve.kafka.shutdown"):
        assert not await stop_client(client, "node a: consumer stop", timeout_s=0.05)
    assert client.cancelled
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("node a: consumer stop did not finish within 0 s")
    # the chain of awaits, into the task it awaits
    assert "stop (test_shutdown.py" in message and "_wait_for_coordination" in message, message


async def test_bounded_returns_true_when_done_and_logs_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    async def fine() -> int:
        return 1

    async def broken() -> None:
        raise RuntimeError("boom")

    assert await bounded(fine(), "fine", timeout_s=1)
    with caplog.at_level(logging.WARNING, logger="flowserve.kafka.shutdown"):
        assert not await bounded(broken(), "broken", timeout_s=1)
    assert "broken failed: RuntimeError('boom')" in caplog.text


async def test_waiting_at_follows_awaited_tasks() -> None:
    gate = asyncio.Event()

    async def inner() -> None:
        await gate.wait()

    async def outer(task: asyncio.Task[None]) -> None:
        await task

    inner_task = asyncio.create_task(inner(), name="inner")
    outer_task = asyncio.create_task(outer(inner_task), name="outer")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    where = waiting_at(outer_task)
    assert where.startswith("outer (test_shutdown.py"), where
    assert "[task inner] > inner (test_shutdown.py" in where and "wait (locks.py" in where, where
    gate.set()
    await outer_task
    assert waiting_at(outer_task) == "nothing (finished)"
