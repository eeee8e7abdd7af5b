"""A model of a local S3 server, for benchmarks: the in-memory store, served ``servers`` requests
at a time (one by default), each taking a fixed service time.

A local moto server is one Python process, so it answers few requests at once and its speed is
about its service time: 8-11 ms per request on a small machine (where it answered 104 PUTs a
second one at a time and at most ~160 however many clients asked), about 4 ms on a fast one. Runs
on this model show what the engine does against a server of a chosen speed, apart from the speed
of the machine the benchmark happens to run on: ``bucketq bench --backend memory --service-ms 4``.
The answers are the in-memory store's (so conditional writes are exact); only the timing is
modelled. Requests are counted by the in-memory store, as on the other in-process backends.

``servers`` models a server that answers several requests at once (more cores): its capacity is
``servers / service time`` requests a second while each request still takes the service time
(``--service-ms 4 --service-servers 4``: 4 ms a request, 1,000 requests a second at most).
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator
from typing import Any

from bucketq.storage import Blob, ObjectInfo, ObjectStore, RequestStats


class ServedStore:
    """Wraps an :class:`ObjectStore`: every request waits for one of ``servers`` (FIFO), then
    ``service_s``.

    A LIST costs one service time per call, whatever its length (a page, as the engine's LISTs are).
    """

    def __init__(self, inner: ObjectStore, service_s: float, servers: int = 1) -> None:
        if service_s < 0:
            raise ValueError(f"service time must be 0 or more, got {service_s}")
        if servers < 1:
            raise ValueError(f"a server answers at least one request at a time, got {servers}")
        self.inner = inner
        self.service_s = service_s
        self.stats: RequestStats = inner.stats
        # asyncio's semaphore wakes its waiters in arrival order
        self._server = asyncio.Semaphore(servers)

    def __getattr__(self, name: str) -> Any:  # check() and adapter extras
        return getattr(self.inner, name)

    async def _serve(self) -> None:
        async with self._server:
            await asyncio.sleep(self.service_s)

    async def get(self, key: str) -> Blob | None:
        await self._serve()
        return await self.inner.get(key)

    async def head(self, key: str) -> ObjectInfo | None:
        await self._serve()
        return await self.inner.head(key)

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        await self._serve()
        return await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    async def delete(self, keys: builtins.list[str]) -> None:
        await self._serve()
        await self.inner.delete(keys)

    async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        await self._serve()
        async for info in self.inner.list(prefix, start_after=start_after):
            yield info

    async def list_prefixes(self, prefix: str, delimiter: str = "/") -> builtins.list[str]:
        await self._serve()
        return await self.inner.list_prefixes(prefix, delimiter)

    async def now(self) -> float:
        await self._serve()
        return await self.inner.now()
