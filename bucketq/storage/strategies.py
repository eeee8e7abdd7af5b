"""Put-if-absent strategies (docs/design.md 2.4) and the :class:`Storage` facade the engine uses.

* ``conditional_write``: the store honours ``If-None-Match: *`` (AWS S3, R2, MinIO, recent
  Ceph, SeaweedFS, moto); put-if-absent is one conditional PUT, exact.
* ``csprng_verify``: for stores that ignore the header. A writer claims the key with a random
  nonce, waits, and checks that its claim survived before writing; see :meth:`Storage.create`.
  This is **probabilistic**: two writers can both win if one stalls between checking for a
  claim and writing its own for longer than the whole verification window of the other.
* ``auto``: :func:`probe_strategy` writes a probe object twice with the header at startup; a 412
  on the second write means ``conditional_write``; a second success, or a store rejecting the
  header as unsupported, means ``csprng_verify``. Other errors fail the probe: a transient
  error must not downgrade the strategy for good.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import random
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

from bucketq.config import CsprngSettings, Settings
from bucketq.errors import AlreadyExists, Contended, NotSupported, PreconditionFailed, StorageError
from bucketq.storage.port import Blob, ObjectInfo, ObjectStore, RequestStats

log = logging.getLogger("bucketq.storage")

StrategyName = Literal["conditional_write", "csprng_verify"]
CLAIM_SUFFIX = ".claim"
PROBE_PREFIX = "_probe/"


class Storage:
    """The engine's view of the bucket: an :class:`ObjectStore` plus a put-if-absent strategy."""

    def __init__(
        self,
        store: ObjectStore,
        strategy: StrategyName = "conditional_write",
        *,
        csprng: CsprngSettings | None = None,
    ) -> None:
        if strategy not in ("conditional_write", "csprng_verify"):
            raise ValueError(f"unknown strategy {strategy!r}: use conditional_write or csprng_verify")
        self.store = store
        self.strategy: StrategyName = strategy
        self.csprng = csprng or CsprngSettings()
        self.cleared_claims = 0
        self._rng = random.Random()

    def __repr__(self) -> str:
        return f"Storage({self.store!r}, strategy={self.strategy!r})"

    @property
    def stats(self) -> RequestStats:
        """The store's request counters."""
        return self.store.stats

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- writes -------------------------------------------------------------------------------

    async def create(self, key: str, data: bytes) -> str:
        """Write ``key`` only if it does not exist; return its ETag.

        Raises :class:`AlreadyExists` if the key exists, and (csprng_verify only)
        :class:`Contended` if another writer holds a live claim on it: retry later.
        """
        if self.strategy == "conditional_write":
            return await self.store.put(key, data, if_none_match=True)
        return await self._create_csprng(key, data)

    async def overwrite(self, key: str, data: bytes) -> str:
        """Write ``key`` unconditionally; return its ETag."""
        return await self.store.put(key, data)

    async def _create_csprng(self, key: str, data: bytes) -> str:
        """csprng_verify put-if-absent (probabilistic, see the module docstring).

        HEAD the key; HEAD ``{key}.claim`` (a live claim means :class:`Contended`, one older than
        ``claim_timeout_s`` is cleared); PUT the claim with a 256-bit random nonce; after a random
        jitter, HEAD-verify its ETag ``verify_retries + 1`` times with jitter between, then once
        more after ``jitter_min_ms``; then PUT the key and delete the claim. If the final PUT
        fails, the claim is left to expire so no other writer races a write still in flight.
        """
        store = self.store
        if await store.head(key) is not None:
            raise AlreadyExists(f"{key} already exists")
        claim_key = key + CLAIM_SUFFIX
        claim = await store.head(claim_key)
        if claim is not None:
            # the claim's age on the store's clock (I15: it decides deleting another writer's claim)
            try:
                store_now = await store.now()
            except NotSupported:
                store_now = time.time()  # a store that tells no time: this host's clock
            age = store_now - claim.last_modified
            if age < self.csprng.claim_timeout_s:
                raise Contended(f"{key} is being created by another writer (claim is {age:.1f}s old)")
            await store.delete([claim_key])
            self.cleared_claims += 1
            log.info("cleared abandoned claim %s (%.1fs old)", claim_key, age)
        etag = await store.put(claim_key, secrets.token_bytes(32))
        for _ in range(self.csprng.verify_retries + 1):
            await self._sleep_jitter()
            await self._verify_claim(key, claim_key, etag)
        await asyncio.sleep(self.csprng.jitter_min_ms / 1000)
        await self._verify_claim(key, claim_key, etag)
        if await store.head(key) is not None:
            await store.delete([claim_key])
            raise AlreadyExists(f"{key} already exists")
        written = await store.put(key, data)
        await store.delete([claim_key])
        return written

    async def _verify_claim(self, key: str, claim_key: str, etag: str) -> None:
        info = await self.store.head(claim_key)
        if info is None or info.etag != etag:
            raise Contended(f"{key} is being created by another writer (our claim was replaced)")

    async def _sleep_jitter(self) -> None:
        low, high = self.csprng.jitter_min_ms, max(self.csprng.jitter_min_ms, self.csprng.jitter_max_ms)
        await asyncio.sleep(self._rng.uniform(low, high) / 1000)

    # -- reads and the rest -------------------------------------------------------------------

    async def get(self, key: str) -> Blob | None:
        return await self.store.get(key)

    async def head(self, key: str) -> ObjectInfo | None:
        return await self.store.head(key)

    async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        """Objects under ``prefix`` in the store's key order, after ``start_after``.

        csprng_verify claim objects (``{key}.claim``) are internal and never listed.
        """
        async for info in self.store.list(prefix, start_after=start_after):
            if not info.key.endswith(CLAIM_SUFFIX):
                yield info

    async def list_prefixes(self, prefix: str, delimiter: str = "/") -> builtins.list[str]:
        """The sorted common prefixes one level below ``prefix``, each ending with ``delimiter``
        (S3's ``CommonPrefixes``: ``list_prefixes("t/subs/")`` gives ``["t/subs/a/", "t/subs/b/"]``);
        see :meth:`ObjectStore.list_prefixes`."""
        return await self.store.list_prefixes(prefix, delimiter)

    async def delete(self, keys: builtins.list[str]) -> None:
        if keys:
            await self.store.delete(list(keys))

    async def now(self) -> float:
        """The store's clock (:meth:`ObjectStore.now`); the engine reads it through
        ``core/store_clock.py``, which also compares it with this host's."""
        return await self.store.now()

    async def close(self) -> None:
        await self.store.close()


def build_store(settings: Settings) -> ObjectStore:
    """The adapter named by ``settings.backend`` (``s3``, ``file`` or ``memory``)."""
    if settings.backend == "s3":
        from bucketq.storage.s3 import S3Store

        return S3Store.from_settings(settings)
    if settings.backend == "file":
        from bucketq.storage.filesystem import FileStore

        if settings.file_path is None:
            raise StorageError("backend 'file' needs file_path (env BUCKETQ_FILE_PATH)")
        return FileStore(Path(settings.file_path))
    if settings.backend == "memory":
        from bucketq.storage.memory import MemoryStore

        return MemoryStore()
    raise StorageError(f"unknown storage backend {settings.backend!r}: use s3, file or memory")


def _probe_key(root: str) -> str:
    name = f"{PROBE_PREFIX}{uuid.uuid4().hex}.probe"
    return f"{root}/{name}" if root else name


async def probe_strategy(store: ObjectStore, root: str = "") -> StrategyName:
    """Find out whether ``store`` honours ``If-None-Match: *`` by writing a probe object twice."""
    key = _probe_key(root.strip("/"))
    strategy: StrategyName
    try:
        try:
            await store.put(key, b"bucketq probe", if_none_match=True)
        except PreconditionFailed:
            # The first response was lost and botocore's retry met our own write: conditions work.
            strategy, reason = "conditional_write", "probe got 412"
        except NotSupported as exc:
            strategy, reason = "csprng_verify", f"conditional PUT rejected: {exc}"
        else:
            try:
                await store.put(key, b"bucketq probe", if_none_match=True)
            except PreconditionFailed:
                strategy, reason = "conditional_write", "probe got 412"
            else:
                strategy, reason = "csprng_verify", "store ignored If-None-Match"
    finally:
        try:
            await store.delete([key])
        except StorageError as exc:
            log.warning("could not delete probe object %s: %s", key, exc)
    log.info("storage strategy: %s (%s)", strategy, reason)
    return strategy


async def open_storage(
    settings: Settings, *, store: ObjectStore | None = None, root: str | None = None
) -> Storage:
    """Open the store (``store`` or :func:`build_store`), check it answers, resolve the strategy.

    Raises :class:`StorageError` with a clear message when the store is unreachable, the bucket
    is missing or access is denied. A store built here is closed again on failure.
    """
    own = store is None
    the_store = build_store(settings) if store is None else store
    prefix = settings.root if root is None else root.strip("/")
    try:
        check = getattr(the_store, "check", None)
        if check is not None:
            await check()
        strategy: StrategyName
        if settings.strategy == "auto":
            strategy = await probe_strategy(the_store, prefix)
        else:
            strategy = settings.strategy
            log.info("storage strategy: %s (configured)", strategy)
        return Storage(the_store, strategy, csprng=settings.csprng)
    except BaseException:
        if own:
            try:
                await the_store.close()
            except Exception:  # the original error matters more
                log.debug("closing the store after a failed open failed", exc_info=True)
        raise
