"""Engine code on the simulation's virtual clock, for tests whose behaviour is timing logic.

``run_virtual(main)`` runs ``main()`` on :class:`tests.sim.clock.SimLoop` with the ``time`` module
reading the virtual clock: a wait of minutes takes no real time, and a bound on how long something
took is exact (no load on the machine moves it). No sockets: pass the engine a ``ping_network``
of its own (or turn pings off) and an in-memory store.

``run_virtual(main, loopback=True)``: the same, but sockets the loop watches (UDP on 127.0.0.1) are
real. A datagram sent on loopback is queued at its receiver before ``sendto`` returns, so the loop
sees every datagram sent so far before it lets the clock move: what a test proves about real
datagrams (parsing, the socket's life) stays real, and only the waits between them are virtual.
Nothing may run in threads (their results would arrive at a random virtual time).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tests.sim.clock import SimLoop, VirtualClock, VirtualSelector, virtual_time

T = TypeVar("T")


class LoopbackSelector(VirtualSelector):
    """A :class:`VirtualSelector` that reports the real sockets ready now, and only when none is
    advances the clock: it never waits for real I/O."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(clock)
        self._real = selectors.DefaultSelector()

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        self._real.register(fileobj, events, data)
        return super().register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        self._real.unregister(fileobj)
        return super().unregister(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        return ready if ready else super().select(timeout)

    def close(self) -> None:
        self._real.close()
        super().close()


def run_virtual(main: Callable[[], Coroutine[Any, Any, T]], *, loopback: bool = False) -> T:
    clock = VirtualClock()
    loop = SimLoop(clock, LoopbackSelector(clock) if loopback else None)
    try:
        with virtual_time(clock, lambda: 0.0):
            return loop.run_until_complete(main())
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.close()
