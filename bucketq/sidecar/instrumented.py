"""An :class:`~bucketq.storage.ObjectStore` wrapper that times every request and remembers S3 health."""

from __future__ import annotations

import builtins
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from bucketq.errors import PreconditionFailed, StorageError, StorageTimeout
from bucketq.storage import Blob, ObjectInfo, ObjectStore, RequestStats

# observe(op, status, seconds): status is "200", "404", "412", "timeout" or "error"
Observer = Callable[[str, str, float], None]

UNHEALTHY_AFTER = 3  # consecutive failed requests


class InstrumentedStore:
    """Delegates to ``inner``; reports each request's outcome and latency to ``observe``."""

    def __init__(self, inner: ObjectStore, observe: Observer) -> None:
        self.inner = inner
        self.observe = observe
        self.stats: RequestStats = inner.stats
        self.failures = 0  # consecutive requests that got no answer
        self.last_error: str | None = None
        self.last_ok = 0.0

    @property
    def healthy(self) -> bool:
        """False after several consecutive requests failed (the bucket is unreachable)."""
        return self.failures < UNHEALTHY_AFTER

    def _done(self, op: str, status: str, started: float) -> None:
        self.observe(op, status, time.perf_counter() - started)
        if status in ("timeout", "error"):
            self.failures += 1
        else:
            self.failures = 0
            self.last_error = None
            self.last_ok = time.time()

    def _failed(self, op: str, exc: BaseException, started: float) -> None:
        if isinstance(exc, PreconditionFailed):
            self._done(op, "412", started)
            return
        self.last_error = str(exc)
        self._done(op, "timeout" if isinstance(exc, StorageTimeout | TimeoutError) else "error", started)

    async def check(self) -> None:
        check = getattr(self.inner, "check", None)
        if check is None:
            return
        started = time.perf_counter()
        try:
            await check()
        except StorageError as exc:
            self._failed("HEAD", exc, started)
            raise
        self._done("HEAD", "200", started)

    async def get(self, key: str) -> Blob | None:
        started = time.perf_counter()
        try:
            blob = await self.inner.get(key)
        except StorageError as exc:
            self._failed("GET", exc, started)
            raise
        self._done("GET", "404" if blob is None else "200", started)
        return blob

    async def head(self, key: str) -> ObjectInfo | None:
        started = time.perf_counter()
        try:
            info = await self.inner.head(key)
        except StorageError as exc:
            self._failed("HEAD", exc, started)
            raise
        self._done("HEAD", "404" if info is None else "200", started)
        return info

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        started = time.perf_counter()
        try:
            etag = await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)
        except StorageError as exc:
            self._failed("PUT", exc, started)
            raise
        self._done("PUT", "200", started)
        return etag

    async def delete(self, keys: builtins.list[str]) -> None:
        started = time.perf_counter()
        try:
            await self.inner.delete(keys)
        except StorageError as exc:
            self._failed("DELETE", exc, started)
            raise
        self._done("DELETE", "200", started)

    async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        started = time.perf_counter()
        try:
            async for info in self.inner.list(prefix, start_after=start_after):
                yield info
        except StorageError as exc:
            self._failed("LIST", exc, started)
            raise
        self._done("LIST", "200", started)

    async def list_prefixes(self, prefix: str, delimiter: str = "/") -> builtins.list[str]:
        native: Any = getattr(self.inner, "list_prefixes", None)
        if native is None:
            found: set[str] = set()
            async for info in self.list(prefix):
                rest = info.key[len(prefix) :]
                if delimiter in rest:
                    found.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
            return sorted(found)
        started = time.perf_counter()
        try:
            result: builtins.list[str] = await native(prefix, delimiter)
        except StorageError as exc:
            self._failed("LIST", exc, started)
            raise
        self._done("LIST", "200", started)
        return result

    async def close(self) -> None:
        await self.inner.close()
