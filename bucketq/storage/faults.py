"""Fault injection for tests: wrap any store and make chosen requests slow, fail or lie.

    store = FaultyStore(MemoryStore())
    store.add(op="PUT", match="*/log/*", kind="drop_after_write", times=1)

Kinds:

* ``latency``: sleep ``latency_s``, then do the request;
* ``error``: raise :class:`~bucketq.errors.StorageError` without doing it (a 5xx after retries);
* ``timeout``: sleep ``latency_s``, then raise :class:`~bucketq.errors.StorageTimeout` without doing it;
* ``precondition``: a PUT answers 412 without writing (``AlreadyExists``, or
  ``PreconditionFailed`` for an ``if_match`` PUT);
* ``drop_after_write``: a PUT or DELETE is done, then its response is "lost" (``StorageError``);
* ``held_response``: a PUT is done, then its answer waits ``latency_s`` (a writer paused, or a
  response held up, after the write took effect).
"""

from __future__ import annotations

import asyncio
import builtins
import random
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

from bucketq.errors import AlreadyExists, PreconditionFailed, StorageError, StorageTimeout
from bucketq.storage.port import Blob, ObjectInfo, ObjectStore, RequestStats

Op = Literal["GET", "HEAD", "PUT", "DELETE", "LIST", "*"]
Kind = Literal["error", "timeout", "precondition", "drop_after_write", "latency", "held_response"]
_OPS = ("GET", "HEAD", "PUT", "DELETE", "LIST", "*")
_KINDS = ("error", "timeout", "precondition", "drop_after_write", "latency", "held_response")


@dataclass(slots=True)
class Fault:
    """One programmed fault; ``times=None`` means every matching request."""

    op: str
    match: str
    kind: str
    times: int | None
    probability: float
    latency_s: float
    fired: int = 0

    def matches(self, op: str, keys: list[str]) -> bool:
        if self.op not in ("*", op):
            return False
        if self.times is not None and self.fired >= self.times:
            return False
        return any(fnmatchcase(key, self.match) for key in keys)


class FaultyStore:
    """An :class:`~bucketq.storage.port.ObjectStore` that injects programmed faults into ``inner``.

    It shares ``inner.stats``: injected failures that never reach ``inner`` are not counted
    there, but in :attr:`injected` (by kind).
    """

    def __init__(self, inner: ObjectStore, *, seed: int | None = None) -> None:
        self.inner = inner
        self.stats: RequestStats = inner.stats
        self.faults: list[Fault] = []
        self.injected: Counter[str] = Counter()
        self._rng = random.Random(seed)

    def add(
        self,
        op: Op = "*",
        match: str = "*",
        kind: Kind = "error",
        *,
        times: int | None = 1,
        probability: float = 1.0,
        latency_s: float = 0.0,
    ) -> Fault:
        """Program a fault for requests of ``op`` on keys matching the glob ``match``."""
        if op not in _OPS:
            raise ValueError(f"unknown op {op!r}: use one of {', '.join(_OPS)}")
        if kind not in _KINDS:
            raise ValueError(f"unknown fault kind {kind!r}: use one of {', '.join(_KINDS)}")
        if kind == "precondition" and op not in ("PUT", "*"):
            raise ValueError("a 'precondition' fault only applies to PUT")
        if kind == "drop_after_write" and op not in ("PUT", "DELETE", "*"):
            raise ValueError("a 'drop_after_write' fault only applies to PUT or DELETE")
        if kind == "held_response" and op not in ("PUT", "*"):
            raise ValueError("a 'held_response' fault only applies to PUT")
        if not 0.0 <= probability <= 1.0:
            raise ValueError("probability must be within [0, 1]")
        fault = Fault(op, match, kind, times, probability, latency_s)
        self.faults.append(fault)
        return fault

    def clear(self) -> None:
        """Remove every programmed fault (the counters stay)."""
        self.faults.clear()

    @property
    def total_injected(self) -> int:
        return sum(self.injected.values())

    async def _before(self, op: str, keys: list[str]) -> Fault | None:
        """Apply latency and pre-request failures; return a fault to apply after the request."""
        after: Fault | None = None
        for fault in list(self.faults):
            if not fault.matches(op, keys):
                continue
            if fault.kind == "precondition" and op != "PUT":
                continue
            if fault.kind == "drop_after_write" and op not in ("PUT", "DELETE"):
                continue
            if fault.kind == "held_response" and op != "PUT":
                continue
            if fault.probability < 1.0 and self._rng.random() >= fault.probability:
                continue
            fault.fired += 1
            self.injected[fault.kind] += 1
            where = f"{op} {keys[0] if keys else ''}"
            if fault.kind == "latency":
                await asyncio.sleep(fault.latency_s)
            elif fault.kind == "error":
                raise StorageError(f"injected fault: {where} failed (HTTP 503 SlowDown after retries)")
            elif fault.kind == "timeout":
                await asyncio.sleep(fault.latency_s)
                raise StorageTimeout(f"injected fault: {where} timed out")
            elif fault.kind == "precondition":
                return fault
            elif after is None:
                after = fault
        return after

    async def get(self, key: str) -> Blob | None:
        await self._before("GET", [key])
        return await self.inner.get(key)

    async def head(self, key: str) -> ObjectInfo | None:
        await self._before("HEAD", [key])
        return await self.inner.head(key)

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        fault = await self._before("PUT", [key])
        if fault is not None and fault.kind == "precondition":
            if if_match is not None:
                raise PreconditionFailed(f"injected fault: {key} changed (If-Match {if_match} failed)")
            raise AlreadyExists(f"injected fault: {key} already exists (412)")
        etag = await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)
        if fault is not None and fault.kind == "held_response":
            await asyncio.sleep(fault.latency_s)
        elif fault is not None:
            raise StorageError(f"injected fault: PUT {key} was written but its response was lost")
        return etag

    async def delete(self, keys: list[str]) -> None:
        fault = await self._before("DELETE", keys)
        await self.inner.delete(keys)
        if fault is not None:
            raise StorageError(f"injected fault: DELETE of {len(keys)} keys done but its response was lost")

    async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        await self._before("LIST", [prefix])
        async for info in self.inner.list(prefix, start_after=start_after):
            yield info

    async def list_prefixes(self, prefix: str, delimiter: str = "/") -> builtins.list[str]:
        await self._before("LIST", [prefix])
        return await self.inner.list_prefixes(prefix, delimiter)

    async def now(self) -> float:
        """The store's clock: a HEAD without a key (faults programmed for ``HEAD`` apply)."""
        await self._before("HEAD", [""])
        return await self.inner.now()

    async def close(self) -> None:
        await self.inner.close()
