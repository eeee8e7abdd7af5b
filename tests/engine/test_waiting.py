"""``core/waiting.wait_event``: the engine's loops wait for events with it, never losing a cancel."""

from __future__ import annotations

import asyncio

import pytest

from bucketq.core.waiting import wait_event


async def test_a_cancellation_arriving_as_the_event_is_set_propagates() -> None:
    """The race ``asyncio.wait_for`` loses on Python 3.11: the event is set and the waiter is
    cancelled in the same loop iteration. A loop waiting this way would survive its cancellation."""
    event = asyncio.Event()
    waiter = asyncio.create_task(wait_event(event, 10.0))
    await asyncio.sleep(0)  # it waits
    event.set()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_it_reports_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 5.0) is True
    assert await wait_event(event, 0.0) is True  # already set: no wait at all
