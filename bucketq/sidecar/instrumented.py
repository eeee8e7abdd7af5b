"""An :class:`~bucketq.storage.ObjectStore` wrapper that times every request and judges S3 health."""

from __future__ import annotations

import builtins
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from bucketq.core.keys import key_kind
from bucketq.errors import PreconditionFailed, StorageError, StorageTimeout
from bucketq.storage import Blob, ObjectInfo, ObjectStore, RequestStats

T = TypeVar("T")

# observe(op, status, seconds, kind): status is "200", "404", "412", "timeout" or "error"; kind is the
# protocol object the request was about (bucketq.core.keys.key_kind: segment, delta, head...), so that
# requests can be counted per message by kind, as `bucketq bench` counts them
Observer = Callable[[str, str, float, str], None]
BUCKET = "bucket"  # the kind of the bucket-level check (no key)

UNHEALTHY_AFTER = 3  # consecutive failed requests


def _ok(_: object) -> str:
    return "200"


def _found(result: object) -> str:
    return "404" if result is None else "200"


class InstrumentedStore:
    """Delegates to ``inner``; reports each request's outcome and latency to ``observe``.

    The store is unhealthy after :data:`UNHEALTHY_AFTER` consecutive failures, or while a request
    has waited longer than ``stall_s`` for its answer (a black-holed endpoint fails slowly).
    """

    def __init__(self, inner: ObjectStore, observe: Observer, *, stall_s: float = 10.0) -> None:
        self.inner = inner
        self.observe = observe
        self.stall_s = stall_s
        self.stats: RequestStats = inner.stats
        self.failures = 0  # consecutive requests that failed
        self.last_error: str | None = None
        self._outstanding: dict[int, float] = {}  # request number -> start (perf_counter)
        self._counter = 0

    # -- health ----------------------------------------------------------------------------------

    def stalled_for(self) -> float:
        """Seconds the oldest outstanding request has been waiting."""
        if not self._outstanding:
            return 0.0
        return time.perf_counter() - min(self._outstanding.values())

    @property
    def problem(self) -> str | None:
        """Why the bucket looks unreachable, in words; None when healthy."""
        stalled = self.stalled_for()
        if stalled >= self.stall_s:
            return f"a request has had no answer for {stalled:.0f}s"
        if self.failures >= UNHEALTHY_AFTER:
            return f"{self.failures} requests failed in a row, last: {self.last_error}"
        return None

    @property
    def healthy(self) -> bool:
        return self.problem is None

    # -- timing ----------------------------------------------------------------------------------

    def _begin(self) -> tuple[int, float]:
        self._counter += 1
        started = time.perf_counter()
        self._outstanding[self._counter] = started
        return self._counter, started

    def _end(
        self, n: int, op: str, kind: str, started: float, status: str, error: BaseException | None = None
    ) -> None:
        self._outstanding.pop(n, None)
        self.observe(op, status, time.perf_counter() - started, kind)
        if status in ("timeout", "error"):
            self.failures += 1
            self.last_error = str(error)
        else:
            self.failures = 0
            self.last_error = None

    def _failed(self, n: int, op: str, kind: str, started: float, exc: BaseException) -> None:
        if isinstance(exc, PreconditionFailed):
            self._end(n, op, kind, started, "412")
        elif isinstance(exc, StorageTimeout | TimeoutError):
            self._end(n, op, kind, started, "timeout", exc)
        elif isinstance(exc, StorageError):
            self._end(n, op, kind, started, "error", exc)
        else:  # cancelled or a bug: not an answer from the store
            self._outstanding.pop(n, None)

    async def _call(
        self, op: str, key: str, fn: Callable[[], Awaitable[T]], status: Callable[[T], str] = _ok
    ) -> T:
        kind = key_kind(key) if key else BUCKET
        n, started = self._begin()
        try:
            result = await fn()
        except BaseException as exc:
            self._failed(n, op, kind, started, exc)
            raise
        self._end(n, op, kind, started, status(result))
        return result

    # -- the ObjectStore port --------------------------------------------------------------------

    async def check(self) -> None:
        check: Any = getattr(self.inner, "check", None)
        if check is not None:
            await self._call("HEAD", "", check)

    async def get(self, key: str) -> Blob | None:
        return await self._call("GET", key, lambda: self.inner.get(key), _found)

    async def head(self, key: str) -> ObjectInfo | None:
        return await self._call("HEAD", key, lambda: self.inner.head(key), _found)

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        return await self._call(
            "PUT", key, lambda: self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)
        )

    async def delete(self, keys: builtins.list[str]) -> None:
        await self._call("DELETE", keys[0] if keys else "", lambda: self.inner.delete(keys))

    async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        kind = key_kind(prefix)
        n, started = self._begin()
        try:
            async for info in self.inner.list(prefix, start_after=start_after):
                yield info
        except BaseException as exc:
            self._failed(n, "LIST", kind, started, exc)
            raise
        self._end(n, "LIST", kind, started, "200")

    async def list_prefixes(self, prefix: str, delimiter: str = "/") -> builtins.list[str]:
        return await self._call("LIST", prefix, lambda: self.inner.list_prefixes(prefix, delimiter))

    async def now(self) -> float:
        """The store's clock (the port's ``now``): one HEAD, counted like the others."""
        return await self._call("HEAD", "", self.inner.now)

    async def close(self) -> None:
        await self.inner.close()
