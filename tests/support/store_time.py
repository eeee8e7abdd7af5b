"""A store whose clock can be moved forward: hours pass on the store's clock without waiting.

GC measures every age that decides a deletion on the store's clock (docs/protocol.md, I15), so a
test that needs "an hour later" moves the store's clock, not a host's. :class:`TimeTravelStore`
wraps any :class:`~bucketq.storage.port.ObjectStore` (the in-memory store, a moto or SeaweedFS
server) and behaves as that store would if its clock had jumped ahead by :attr:`offset`: objects
keep the Last-Modified they were written with, objects written after a jump get the moved clock,
and ``now()`` reads the moved clock.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from bucketq.storage.port import Blob, ObjectInfo, ObjectStore, RequestStats


class TimeTravelStore:
    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.stats: RequestStats = inner.stats
        self.offset = 0.0
        self._written: dict[str, float] = {}  # key -> the offset its last write was made at

    def advance(self, seconds: float) -> None:
        """The store's clock moves ``seconds`` ahead (objects written so far age by as much)."""
        self.offset += seconds

    def __getattr__(self, name: str) -> Any:  # check() and adapter extras
        return getattr(self.inner, name)

    def _at(self, key: str, last_modified: float) -> float:
        return last_modified + self._written.get(key, 0.0)

    async def get(self, key: str) -> Blob | None:
        blob = await self.inner.get(key)
        return None if blob is None else replace(blob, last_modified=self._at(key, blob.last_modified))

    async def head(self, key: str) -> ObjectInfo | None:
        info = await self.inner.head(key)
        return None if info is None else replace(info, last_modified=self._at(key, info.last_modified))

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        etag = await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)
        self._written[key] = self.offset
        return etag

    async def delete(self, keys: builtins.list[str]) -> None:
        await self.inner.delete(keys)
        for key in keys:
            self._written.pop(key, None)

    async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        async for info in self.inner.list(prefix, start_after=start_after):
            yield replace(info, last_modified=self._at(info.key, info.last_modified))

    async def list_prefixes(self, prefix: str, delimiter: str = "/") -> builtins.list[str]:
        return await self.inner.list_prefixes(prefix, delimiter)

    async def now(self) -> float:
        return await self.inner.now() + self.offset

    async def close(self) -> None:
        await self.inner.close()
