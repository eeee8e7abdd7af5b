"""The storage port: the few object-store operations the protocol needs.

Adapters (memory, filesystem, S3) implement :class:`ObjectStore`; wrappers (fault injection,
instrumentation, the simulator's store) implement it over another store. Errors are the
:mod:`bucketq.errors` storage classes, all subclasses of
:class:`~bucketq.errors.StorageError`:

* :class:`~bucketq.errors.AlreadyExists` — a ``put(..., if_none_match=True)`` found the key;
* :class:`~bucketq.errors.PreconditionFailed` — a ``put(..., if_match=...)`` found another
  ETag, or no object;
* :class:`~bucketq.errors.Contended` — S3 answered 409 ``ConditionalRequestConflict``: another
  conditional write of the key is in flight (retry later);
* :class:`~bucketq.errors.NotSupported` — the store rejects conditional writes (501
  ``NotImplemented``); :func:`~bucketq.storage.probe_strategy` then picks ``csprng_verify``;
* :class:`~bucketq.errors.StorageTimeout` — no answer in time: a write's outcome is unknown;
* :class:`~bucketq.errors.StorageError` — anything else that fails after the adapter's retries
  (unreachable endpoint, missing bucket, access denied, a key the backend cannot store).

A missing object is never an error for reads: ``get`` and ``head`` return ``None``.
"""

from __future__ import annotations

import builtins
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
    """An S3-like key/value store with conditional writes.

    Keys are ``/``-separated strings; every read reflects every write that completed before it
    (S3's strong read-after-write consistency). ``stats`` counts the requests sent.
    """

    stats: RequestStats

    async def get(self, key: str) -> Blob | None:
        """The object's bytes, ETag and last-modified time, or ``None`` when it does not exist.

        Raises:
            StorageTimeout: the store did not answer in time.
            StorageError: the store failed or cannot be reached (after retries), the bucket is
                missing or access is denied, or the backend cannot store such a key.
        """
        ...

    async def head(self, key: str) -> ObjectInfo | None:
        """The object's metadata, or ``None`` when it does not exist (on S3, a HEAD cannot tell a
        missing bucket from a missing key: both are ``None``).

        Raises:
            StorageTimeout: the store did not answer in time.
            StorageError: the store failed or cannot be reached (after retries), access is
                denied, or the backend cannot store such a key.
        """
        ...

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        """Write the object and return its new ETag.

        ``if_none_match`` writes only if the key does not exist (``If-None-Match: *``);
        ``if_match`` only if the object's ETag is that one. Without either, the write
        overwrites. A store that ignores the conditions (``MemoryStore(honour_conditions=False)``,
        some S3 servers) writes unconditionally: see the ``csprng_verify`` strategy.

        Raises:
            AlreadyExists: ``if_none_match`` and the key exists (on S3, also a retried PUT whose
                first attempt landed: the engine reads such an object back).
            PreconditionFailed: ``if_match`` and the object's ETag differs or it does not exist.
            Contended: S3 only: another conditional write of the key is in flight (409).
            NotSupported: S3 only: the store rejects conditional writes.
            StorageTimeout: the store did not answer in time; the write may have landed.
            StorageError: the store failed or cannot be reached (after retries; the write may
                have landed), or the backend cannot store such a key.
        """
        ...

    async def delete(self, keys: builtins.list[str]) -> None:
        """Delete the keys; missing keys are not an error. Batched by the adapter (1,000 a request).

        Raises:
            StorageTimeout: the store did not answer in time; some keys may be deleted.
            StorageError: the store failed or cannot be reached, the backend cannot store such
                a key, or (S3) some keys of a batch were not deleted; earlier batches are deleted.
        """
        ...

    def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        """Objects whose key starts with ``prefix`` and sorts after ``start_after``, in
        lexicographic key order (an async iterator, read page by page).

        Raises (while iterating, possibly after earlier pages were yielded):
            StorageTimeout: the store did not answer in time.
            StorageError: the store failed or cannot be reached (after retries), the bucket is
                missing or access is denied.
        """
        ...

    async def list_prefixes(self, prefix: str, delimiter: str = "/") -> builtins.list[str]:
        """The distinct common prefixes one level below ``prefix``, sorted, each ending with
        ``delimiter``, each holding at least one object (S3's ``CommonPrefixes``:
        ``list_prefixes("t/subs/")`` gives ``["t/subs/a/", "t/subs/b/"]``). Objects directly
        under ``prefix`` are not reported. An adapter without a cheaper way derives them from
        :meth:`list` with :func:`prefixes_from_list`.

        Raises:
            StorageTimeout: the store did not answer in time.
            StorageError: the store failed or cannot be reached (after retries), the bucket is
                missing or access is denied.
        """
        ...

    async def now(self) -> float:
        """The store's clock now, in unix seconds: the Last-Modified an object written at this
        moment would get (to the store's resolution, whole seconds on S3), never later than that.

        The reference for every age that decides a deletion, an abandonment or a takeover
        (docs/protocol.md, the clock rule, I15): such an age is ``now() - last_modified``, both read
        from the store, never a host's ``time.time()`` minus a store time. Adapters answer from
        the clock that stamps their objects: the memory store's own, the file store's
        filesystem (the mtime of a file written now), S3's ``Date`` header. A wrapper forwards
        it (as a request, where it counts requests).

        Raises:
            NotSupported: the store gave no time (an S3 answer without a ``Date`` header); the
                engine then writes an object and reads its Last-Modified instead.
            StorageTimeout: the store did not answer in time.
            StorageError: the store failed or cannot be reached (after retries).
        """
        ...

    async def close(self) -> None:
        """Release connections. The store is not used again afterwards; raises nothing the
        engine handles (a failure here is a bug or an already-closed loop)."""
        ...


async def prefixes_from_list(store: ObjectStore, prefix: str, delimiter: str = "/") -> builtins.list[str]:
    """:meth:`ObjectStore.list_prefixes` derived from one full :meth:`ObjectStore.list` of ``prefix``:
    the shared fallback of stores without a native delimiter listing (it reads every key below).
    Raises what ``store.list`` raises."""
    found: set[str] = set()
    async for info in store.list(prefix):
        rest = info.key[len(prefix) :]
        if delimiter in rest:
            found.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
    return sorted(found)
