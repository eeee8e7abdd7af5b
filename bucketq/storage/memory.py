"""In-memory object store: fast and exact, for tests and library experiments."""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from bucketq.errors import AlreadyExists, PreconditionFailed
from bucketq.storage.port import Blob, ObjectInfo, RequestStats, prefixes_from_list


@dataclass(slots=True)
class _Entry:
    data: bytes
    etag: str
    last_modified: float


def etag_of(data: bytes) -> str:
    """The ETag S3 gives a single-part object: the quoted MD5 of its bytes."""
    return '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'


class MemoryStore:
    """A dict behind the :class:`~bucketq.storage.port.ObjectStore` port."""

    def __init__(self, *, honour_conditions: bool = True, clock: Callable[[], float] | None = None) -> None:
        self._objects: dict[str, _Entry] = {}
        self._honour_conditions = honour_conditions
        # the store's clock: it stamps Last-Modified and answers now() (resolved per call, so a
        # patched time.time is seen)
        self._clock: Callable[[], float] = clock or (lambda: time.time())
        self.stats = RequestStats()

    async def get(self, key: str) -> Blob | None:
        await asyncio.sleep(0)
        entry = self._objects.get(key)
        self.stats.count("GET", received=len(entry.data) if entry else 0)
        if entry is None:
            return None
        return Blob(entry.data, entry.etag, entry.last_modified)

    async def head(self, key: str) -> ObjectInfo | None:
        await asyncio.sleep(0)
        self.stats.count("HEAD")
        entry = self._objects.get(key)
        if entry is None:
            return None
        return ObjectInfo(key, len(entry.data), entry.etag, entry.last_modified)

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        await asyncio.sleep(0)
        self.stats.count("PUT", sent=len(data))
        current = self._objects.get(key)
        if self._honour_conditions:
            if if_none_match and current is not None:
                raise AlreadyExists(f"{key} already exists")
            if if_match is not None and (current is None or current.etag != if_match):
                raise PreconditionFailed(f"{key} changed (If-Match {if_match} failed)")
        etag = etag_of(data)
        self._objects[key] = _Entry(bytes(data), etag, self._clock())
        return etag

    async def delete(self, keys: list[str]) -> None:
        await asyncio.sleep(0)
        for start in range(0, len(keys), 1000):
            self.stats.count("DELETE")
            for key in keys[start : start + 1000]:
                self._objects.pop(key, None)

    async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        keys = sorted(
            k for k in self._objects if k.startswith(prefix) and (start_after is None or k > start_after)
        )
        for page in range(0, max(len(keys), 1), 1000):
            self.stats.count("LIST")
            await asyncio.sleep(0)
            for key in keys[page : page + 1000]:
                entry = self._objects.get(key)
                if entry is not None:
                    yield ObjectInfo(key, len(entry.data), entry.etag, entry.last_modified)

    async def list_prefixes(self, prefix: str, delimiter: str = "/") -> builtins.list[str]:
        """The common prefixes one level below ``prefix``, derived from :meth:`list`."""
        return await prefixes_from_list(self, prefix, delimiter)

    async def now(self) -> float:
        """The clock that stamps this store's objects (see the port)."""
        await asyncio.sleep(0)
        self.stats.count("HEAD")
        return self._clock()

    async def close(self) -> None:
        return None

    def keys(self) -> builtins.list[str]:
        """Every key, sorted (a test helper)."""
        return sorted(self._objects)
