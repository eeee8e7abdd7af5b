"""``@on_virtual_clock``: an ``async def`` test run on the simulation's virtual clock.

For tests whose behaviour is timing logic on the in-memory store (leases, backoffs, heartbeats):
the test's sleeps and the engine's timers take no real time, and every bound on how long something
took is exact, whatever the machine's load. The test keeps its fixtures (the wrapper has its
signature) and its assertions; only the clock it runs on changes. No sockets, no threads (see
:mod:`tests.support.virtual`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec

from tests.support.virtual import run_virtual

P = ParamSpec("P")


def on_virtual_clock(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        run_virtual(lambda: test(*args, **kwargs))

    return run


def on_virtual_clock_over_loopback(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """``@on_virtual_clock`` with real sockets on 127.0.0.1 (``run_virtual(..., loopback=True)``)."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        run_virtual(lambda: test(*args, **kwargs), loopback=True)

    return run
