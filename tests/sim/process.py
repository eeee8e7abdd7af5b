"""Simulated processes: which process is running, its clock skew, its pauses and its crashes.

A :class:`SimProcess` stands for one OS process of a deployment (a producer, a consumer-group
member, the operator). Its tasks are every task created while it is the current process (the
context variable :data:`CURRENT` is inherited by tasks created from its code), so the engine's
background loops belong to the process that started them.

Invariants:

* A crashed process never runs engine code again: its tasks are cancelled, and any call it still
  makes on the store blocks forever (a dead process sends nothing). Its successor is a new
  :class:`SimProcess` (a new incarnation, a new ``Bucketq`` and new member ids) that restarts
  from storage alone.
* A paused process (SIGSTOP) runs nothing until ``paused_until``: every callback of its tasks
  (steps, timers, future callbacks) is held by the loop until then, and a store call it was
  making is neither sent nor answered meanwhile.
* A process's skew stays within ``±clock_skew_s / 2``, so any two clocks differ by at most the
  engine's configured margin.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from .clock import SimLoop, VirtualClock

CURRENT: contextvars.ContextVar[SimProcess | None] = contextvars.ContextVar(
    "bucketq_sim_process", default=None
)


def _frozen_until() -> float:
    proc = CURRENT.get()
    return proc.paused_until if proc is not None else 0.0


def current_skew() -> float:
    """The clock skew of the calling process (0 for the simulator itself and the store)."""
    proc = CURRENT.get()
    return proc.skew if proc is not None else 0.0


@dataclass(eq=False)
class SimProcess:
    """One simulated OS process."""

    name: str  # role name and incarnation, e.g. "member.g1.0#2"
    role: str
    skew: float = 0.0
    faultable: bool = True
    alive: bool = True
    paused_until: float = 0.0
    stopping: bool = False  # asked to stop by the simulator (graceful, not a crash)
    crashes: int = 0
    pauses: int = 0
    tasks: dict[asyncio.Task[Any], None] = field(default_factory=dict)
    on_crash: Callable[[SimProcess], None] | None = None

    def forget(self, task: asyncio.Task[Any]) -> None:
        self.tasks.pop(task, None)


class Processes:
    """Creates processes, runs coroutines as them, pauses and crashes them."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: VirtualClock, *, pauses: bool = True) -> None:
        self.loop = loop
        self.clock = clock
        self.all: list[SimProcess] = []
        loop.set_task_factory(self._task_factory)  # type: ignore[arg-type]
        if pauses and isinstance(loop, SimLoop):  # holding callbacks costs time: only when someone can stop
            loop.frozen_until = _frozen_until
        self._never: asyncio.Future[None] = loop.create_future()

    def _task_factory(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Task[Any]:
        context = kwargs.get("context")
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        proc = context.get(CURRENT) if context is not None else CURRENT.get()
        if proc is not None:
            proc.tasks[task] = None
            task.add_done_callback(proc.forget)
        return task

    def new(self, name: str, role: str, *, skew: float = 0.0, faultable: bool = True) -> SimProcess:
        proc = SimProcess(name, role, skew=skew, faultable=faultable)
        self.all.append(proc)
        return proc

    def spawn(
        self, proc: SimProcess, coro: Coroutine[Any, Any, Any], name: str | None = None
    ) -> asyncio.Task[Any]:
        """Run ``coro`` as a task of ``proc`` (and every task it creates, transitively)."""
        ctx = contextvars.copy_context()
        ctx.run(CURRENT.set, proc)
        return self.loop.create_task(coro, name=name, context=ctx)

    async def gate(self, proc: SimProcess | None) -> bool:
        """Wait while ``proc`` is paused (True if it did); never return for a crashed process."""
        if proc is None:
            return False
        if not proc.alive:
            await self.hang()
        waited = False
        while proc.paused_until > self.clock.now:
            waited = True
            await asyncio.sleep(proc.paused_until - self.clock.now)
            if not proc.alive:
                await self.hang()
        return waited

    async def hang(self) -> None:
        """Block forever (cancellation still ends the wait): what a dead process's call does."""
        await asyncio.shield(self._never)

    def pause(self, proc: SimProcess, seconds: float) -> None:
        proc.paused_until = max(proc.paused_until, self.clock.now + seconds)
        proc.pauses += 1

    def crash(self, proc: SimProcess) -> None:
        """Kill ``proc``: cancel every task it owns; its successor is started by its role."""
        if not proc.alive:
            return
        proc.alive = False
        proc.crashes += 1
        for task in list(proc.tasks):
            task.cancel()
        if proc.on_crash is not None:
            proc.on_crash(proc)

    def stop(self, proc: SimProcess) -> None:
        """Cancel ``proc``'s tasks at the end of a run (not a crash: nothing restarts it)."""
        proc.paused_until = 0.0  # the cancellations must run now, not when a pause would end
        proc.alive = False
        proc.stopping = True
        for task in list(proc.tasks):
            task.cancel()
