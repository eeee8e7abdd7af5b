"""Waiting for an event with a timeout, without losing a cancellation.

On Python 3.11, ``asyncio.wait_for`` swallows a cancellation that arrives in the same loop
iteration as the awaited result (fixed in 3.12, which rebuilt it on ``asyncio.timeout``). A
background loop that waits that way (``while not closed: wait_for(event.wait(), t)``) can then
survive its cancellation and run forever: ``asyncio.run`` hangs at exit, cancelling it once.
``asyncio.timeout`` tells its own timeout apart from a cancellation from outside, on every version.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds passed; True if it was set.

    A cancellation of the caller always propagates (``CancelledError``), even when the event is
    set at the same moment.
    """
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(max(0.0, timeout)):
            await event.wait()
    except TimeoutError:
        return False
    return True
