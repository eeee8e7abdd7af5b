"""Engine code on the simulation's virtual clock, for tests whose behaviour is timing logic.

``run_virtual(main)`` runs ``main()`` on :class:`tests.sim.clock.SimLoop` with the ``time`` module
reading the virtual clock: a wait of minutes takes no real time, and a bound on how long something
took is exact (no load on the machine moves it). No sockets: pass the engine a ``ping_network``
of its own (or turn pings off) and an in-memory store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tests.sim.clock import SimLoop, VirtualClock, virtual_time

T = TypeVar("T")


def run_virtual(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    clock = VirtualClock()
    loop = SimLoop(clock)
    try:
        with virtual_time(clock, lambda: 0.0):
            return loop.run_until_complete(main())
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.close()
