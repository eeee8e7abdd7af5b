"""The storage port: the few object-store operations the protocol needs.

Adapters (memory, filesystem, S3) implement :class:`ObjectStore`. They raise
:class:`~bucketq.errors.AlreadyExists` when a ``put(..., if_none_match=True)`` finds the key,
:class:`~bucketq.errors.PreconditionFailed` when ``if_match`` does not match, and
:class:`~bucketq.errors.StorageError` for everything else that fails after retries.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a LIST or HEAD tells about one object."""

    key: str
    size: int
    etag: str
    last_modified: float  # unix seconds


@dataclass(frozen=True, slots=True)
class Blob:
    """An object's bytes with its metadata."""

    data: bytes
    etag: str
    last_modified: float


@dataclass(slots=True)
class RequestStats:
    """Counts of store requests by operation, and bytes moved (for benchmarks and metrics)."""

    requests: Counter[str] = field(default_factory=Counter)
    bytes_out: int = 0
    bytes_in: int = 0

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    def count(self, op: str, *, sent: int = 0, received: int = 0) -> None:
        self.requests[op] += 1
        self.bytes_out += sent
        self.bytes_in += received

    def snapshot(self) -> dict[str, int]:
        return dict(self.requests)


@runtime_checkable
class ObjectStore(Protocol):
    """An S3-like key/value store with conditional writes."""

    stats: RequestStats

    async def get(self, key: str) -> Blob | None:
        """The object's bytes, or ``None`` when it does not exist."""
        ...

    async def head(self, key: str) -> ObjectInfo | None:
        """The object's metadata, or ``None`` when it does not exist."""
        ...

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        """Write the object and return its ETag (conditional when asked)."""
        ...

    async def delete(self, keys: list[str]) -> None:
        """Delete the keys (missing keys are not an error); batched by the adapter."""
        ...

    def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        """Objects under ``prefix`` in lexicographic key order, after ``start_after``."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
