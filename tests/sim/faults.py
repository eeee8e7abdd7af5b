"""The fault layer: the engine's in-memory store behind the ObjectStore port, with seeded faults.

Every call is attributed to the simulated process that makes it (``process.CURRENT``), and each
call is an await point where that process can be hit by a fault drawn from the schedule's rates:

* ``error``        a 5xx after retries, *before* the request is applied (``StorageError``);
* ``timeout``      a timeout before the request is applied (``StorageTimeout``, after a delay);
* ``lost``         the request is applied, then its response is lost (``StorageError``/``StorageTimeout``);
* ``latency``      a latency spike (seconds) on top of the ordinary per-call latency;
* ``outage``       the process cannot reach the store for a while: all its calls fail before applying;
* ``pause_before`` / ``pause_after``  the process is stopped (SIGSTOP) with this call not yet sent,
  or applied with its response not yet received, for a duration that can exceed every lease and
  GC's delta grace;
* ``crash_before`` / ``crash_after``  the process dies with this call not sent, or applied.

412 storms are not faked here: they come from real concurrent writers (scenario shapes).
Only the store's semantics are the engine's own (``MemoryStore``: put-if-absent, If-Match).

Invariants: a fault never changes what the store holds beyond what the request itself does
(applied exactly once, or not at all); object timestamps are the store's clock (unskewed);
calls of the simulator itself (no current process, or an unfaultable one) are never faulted.
"""

from __future__ import annotations

import asyncio
import builtins
import fnmatch
import random
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bucketq.errors import StorageError, StorageTimeout
from bucketq.storage import MemoryStore
from bucketq.storage.port import Blob, ObjectInfo, RequestStats, prefixes_from_list

from .history import History
from .process import CURRENT, Processes, SimProcess

T = TypeVar("T")


@dataclass
class FaultRates:
    """Per-call probabilities of each fault kind, and the durations they use."""

    error: float = 0.0
    timeout: float = 0.0
    lost: float = 0.0
    latency: float = 0.0
    outage: float = 0.0
    pause: float = 0.0
    crash: float = 0.0
    base_latency: tuple[float, float] = (0.001, 0.02)
    spike_latency: tuple[float, float] = (0.5, 5.0)
    outage_s: tuple[float, float] = (2.0, 60.0)
    pause_s: list[tuple[float, float]] = field(default_factory=lambda: [(1.0, 60.0)])  # ranges, one chosen
    max_pauses: int = 2  # per process incarnation
    max_crashes: int = 1  # per process incarnation
    only: list[str] = field(default_factory=list)  # key globs where faults apply (empty: everywhere)
    only_procs: list[str] = field(default_factory=list)  # process-name globs hit (empty: every process)

    def to_json(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


class CallingStore:
    """The ``ObjectStore`` port over ``inner``, every request passed through ``_call`` (which a
    subclass defines: faults, crashes). One LIST request: the fault applies before the first page;
    the pages are a snapshot."""

    inner: Any

    async def _call(self, op: str, key: str, request: Callable[[], Awaitable[T]]) -> T:
        raise NotImplementedError

    async def get(self, key: str) -> Blob | None:
        return await self._call("GET", key, lambda: self.inner.get(key))

    async def head(self, key: str) -> ObjectInfo | None:
        return await self._call("HEAD", key, lambda: self.inner.head(key))

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        return await self._call(
            "PUT", key, lambda: self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)
        )

    async def delete(self, keys: builtins.list[str]) -> None:
        await self._call("DELETE", keys[0] if keys else "", lambda: self.inner.delete(keys))

    async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        infos = await self._call(
            "LIST", prefix, lambda: _collect(self.inner.list(prefix, start_after=start_after))
        )
        for info in infos:
            yield info

    async def list_prefixes(self, prefix: str, delimiter: str = "/") -> builtins.list[str]:
        # derived from one LIST through ``_call``, so faults hit it like any other LIST
        return await prefixes_from_list(self, prefix, delimiter)

    async def now(self) -> float:
        # the store's clock (unskewed: the request runs as no process), one faultable HEAD
        return await self._call("HEAD", "", lambda: self.inner.now())

    async def close(self) -> None:
        return None


class SimStore(CallingStore):
    """``ObjectStore`` over a ``MemoryStore`` with per-process seeded faults."""

    def __init__(
        self, inner: MemoryStore, procs: Processes, history: History, rates: FaultRates, seed: int
    ) -> None:
        self.inner = inner
        self.procs = procs
        self.history = history
        self.rates = rates
        self.stats: RequestStats = inner.stats
        self.enabled = True  # off in the quiesce phase: no new faults (running pauses end on time)
        self.injected: Counter[str] = Counter()
        self._rng = random.Random(f"faults/{seed}")
        self._outage_until: dict[SimProcess, float] = {}
        self._only = re.compile("|".join(fnmatch.translate(g) for g in rates.only)) if rates.only else None
        self._only_procs = (
            re.compile("|".join(fnmatch.translate(g) for g in rates.only_procs)) if rates.only_procs else None
        )

    # -- decisions -------------------------------------------------------------------------------

    def _matches(self, key: str) -> bool:
        return self._only is None or self._only.match(key) is not None

    def _decide(self, proc: SimProcess, op: str, key: str) -> str | None:
        r = self.rates
        rng = self._rng
        if not self._matches(key):
            return None
        if self._only_procs is not None and self._only_procs.match(proc.name) is None:
            return None
        roll = rng.random()
        for kind, p in (
            ("error", r.error),
            ("timeout", r.timeout),
            ("lost", r.lost if op in ("PUT", "DELETE") else 0.0),
            ("latency", r.latency),
            ("outage", r.outage),
            ("pause", r.pause if proc.pauses < r.max_pauses else 0.0),
            ("crash", r.crash if proc.crashes < r.max_crashes else 0.0),
        ):
            if roll < p:
                if kind in ("pause", "crash"):
                    kind += "_after" if rng.random() < 0.5 else "_before"
                return kind
            roll -= p
        return None

    # -- the call path ---------------------------------------------------------------------------

    async def _call(self, op: str, key: str, request: Callable[[], Awaitable[T]]) -> T:
        proc = CURRENT.get()
        if proc is None or not proc.faultable:
            return await self._server(request)
        clock = self.procs.clock
        if proc.paused_until > clock.now or not proc.alive:
            await self.procs.gate(proc)
        rng = self._rng
        await _sleep(rng.uniform(*self.rates.base_latency))
        if proc.paused_until > clock.now or not proc.alive:
            await self.procs.gate(proc)  # a pause that began while the request travelled
        kind = self._decide(proc, op, key) if self.enabled else None
        outage = self._outage_until.get(proc, 0.0)
        if outage > clock.now:
            self.injected["outage_error"] += 1
            raise StorageError(f"simulated outage: {op} {key} unreachable")
        if kind is not None:
            self.injected[kind] += 1
            if kind != "latency":
                self.history.record("fault", proc=proc.name, kind=kind, op=op, key=key)
        if kind == "latency":
            await _sleep(rng.uniform(*self.rates.spike_latency))
        elif kind == "error":
            raise StorageError(f"simulated 503: {op} {key}")
        elif kind == "timeout":
            await _sleep(rng.uniform(1.0, 10.0))
            raise StorageTimeout(f"simulated timeout: {op} {key}")
        elif kind == "outage":
            until = clock.now + rng.uniform(*self.rates.outage_s)
            self._outage_until[proc] = until
            self.history.record("outage", proc=proc.name, until=round(until, 6))
            raise StorageError(f"simulated outage: {op} {key} unreachable")
        elif kind == "crash_before":
            self._crash(proc)
        elif kind == "pause_before":
            self._pause(proc)
            await self.procs.gate(proc)
        result = await self._server(request)
        if kind == "lost":
            if rng.random() < 0.5:
                raise StorageTimeout(f"simulated lost response (applied): {op} {key}")
            raise StorageError(f"simulated lost response (applied): {op} {key}")
        if kind == "crash_after":
            self._crash(proc)
        elif kind == "pause_after":
            self._pause(proc)
        if proc.paused_until > clock.now or not proc.alive:
            await self.procs.gate(proc)
        return result

    def _pause(self, proc: SimProcess) -> None:
        lo, hi = self._rng.choice(self.rates.pause_s)
        seconds = self._rng.uniform(lo, hi)
        self.procs.pause(proc, seconds)
        self.history.record("pause", proc=proc.name, until=round(proc.paused_until, 6))

    def _crash(self, proc: SimProcess) -> None:
        self.procs.crash(proc)  # cancels the current task too: the next await raises CancelledError

    async def _server(self, request: Callable[[], Awaitable[T]]) -> T:
        # The store stamps objects with its own clock: run the request as "no process" (no skew).
        token = CURRENT.set(None)
        try:
            return await request()
        finally:
            CURRENT.reset(token)


async def _collect(it: AsyncIterator[ObjectInfo]) -> builtins.list[ObjectInfo]:
    return [info async for info in it]


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)
