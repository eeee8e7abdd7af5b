"""Job commits (transactions): a job's segments become visible all at once, or never.

Protocol (docs/protocol.md, "Job commits (transactions)"):

1. The committer writes the transaction record ``R/{topic}/txn/{id}.json`` put-if-absent as
   ``pending``, *before* appending anything. Its manifest names, per partition, ``start`` (the
   partition's tail when the record was written: every chunk of the transaction lands at or
   above it) and the chunks to append, in order.
2. It appends each chunk as an ordinary segment at the partition's tail (put-if-absent), whose
   header carries ``txn`` (the id) and ``chunk`` (the chunk's index in the manifest).
3. It overwrites the record ``committed`` with If-Match on the pending record's ETag, filling in
   the seq where each chunk landed. Anyone may instead overwrite a pending record ``aborted``
   with If-Match once it is older than its ``timeout_s``: exactly one of the two wins.

Readers decide per segment (:meth:`TxnRecord.visibility`):

* no ``txn`` in the header: visible (every ordinary segment);
* ``committed``: visible iff the record says this chunk landed at this very seq. A chunk
  appended twice (a recovering run, or a committer that was thought dead) is visible once;
* ``aborted``, or no record at all: skipped. A record is written before its first segment and
  never deleted, so a missing record never hides a committed segment (a segment without its
  record is the leftover of a committer whose record write failed: nothing of it was visible);
* ``pending``: ``wait``: the reader stops in that partition at that segment until the
  transaction resolves (the partition's "last stable offset"). Readers that plan from a
  listing (Spark) stop at the record's ``start`` instead, which is at or below the first chunk.

Final states never change, so resolved records are cached for good; pending ones are read again
after ``recheck_s``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from bucketq.core.keys import Keys, validate_name
from bucketq.core.segment import SegmentHeader
from bucketq.errors import BucketqError, PreconditionFailed, StorageError
from bucketq.storage import Storage

log = logging.getLogger("bucketq.txn")

TxnState = Literal["pending", "committed", "aborted"]
Visibility = Literal["visible", "skip", "wait"]

# A committer has this long (from its last write of the record) to commit before anyone may abort.
DEFAULT_TIMEOUT_S = 900.0
# How long a reader trusts a pending record before reading it again.
PENDING_RECHECK_S = 1.0
# Leftovers of Spark write runs (staging, abort markers) are collected when their newest object is
# this old and no pending transaction names them.
STAGING_TTL_S = 86_400.0
RESOLVED_CACHE = 4096
READ_CONCURRENCY = 16


class TxnError(BucketqError):
    """A transaction could not be committed (the record names what is visible: nothing)."""


@dataclass(slots=True)
class Chunk:
    """One segment's worth of messages in a transaction's manifest."""

    count: int
    bytes: int = 0
    src: str = ""  # where the committer reads it from (opaque to readers)
    seq: int | None = None  # where it landed: set in the committed record

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"count": self.count, "bytes": self.bytes, "src": self.src}
        if self.seq is not None:
            out["seq"] = self.seq
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Chunk:
        seq = obj.get("seq")
        return cls(
            int(obj["count"]),
            int(obj.get("bytes", 0)),
            str(obj.get("src", "")),
            None if seq is None else int(seq),
        )


@dataclass(slots=True)
class TxnPartition:
    """A transaction's chunks for one partition; ``start`` bounds where they land (from below)."""

    start: int
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def messages(self) -> int:
        return sum(c.count for c in self.chunks)

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "chunks": [c.to_json() for c in self.chunks]}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TxnPartition:
        return cls(int(obj["start"]), [Chunk.from_json(c) for c in obj.get("chunks", [])])


@dataclass(slots=True)
class TxnRecord:
    """The record ``R/{topic}/txn/{id}.json``."""

    id: str
    topic: str
    state: TxnState = "pending"
    job: str = ""
    owner: str = ""  # the run entitled to commit (a recovering run takes over by rewriting it)
    created_at: float = 0.0
    updated_at: float = 0.0
    timeout_s: float = DEFAULT_TIMEOUT_S
    partitions: dict[int, TxnPartition] = field(default_factory=dict)
    reason: str | None = None
    info: dict[str, Any] = field(default_factory=dict)  # the committer's own notes (job report)

    @property
    def messages(self) -> int:
        return sum(p.messages for p in self.partitions.values())

    @property
    def final(self) -> bool:
        return self.state != "pending"

    def expired(self, now: float | None = None) -> bool:
        """A pending record nobody has written for longer than its timeout: anyone may abort it."""
        now = time.time() if now is None else now
        return self.state == "pending" and now - self.updated_at > self.timeout_s

    def visibility(self, header: SegmentHeader) -> Visibility:
        """Whether a segment naming this transaction is visible (see the module docstring)."""
        if self.state == "pending":
            return "wait"
        if self.state == "aborted":
            return "skip"
        part = self.partitions.get(header.partition)
        if part is None or header.chunk is None or not 0 <= header.chunk < len(part.chunks):
            return "skip"
        return "visible" if part.chunks[header.chunk].seq == header.seq else "skip"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": 1,
            "id": self.id,
            "topic": self.topic,
            "state": self.state,
            "job": self.job,
            "owner": self.owner,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "timeout_s": self.timeout_s,
            "partitions": {str(p): part.to_json() for p, part in sorted(self.partitions.items())},
        }
        if self.reason is not None:
            out["reason"] = self.reason
        if self.info:
            out["info"] = self.info
        return out

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> TxnRecord:
        try:
            obj = json.loads(data)
            state = obj["state"]
            if state not in ("pending", "committed", "aborted"):
                raise ValueError(f"unknown state {state!r}")
            return cls(
                id=str(obj["id"]),
                topic=str(obj.get("topic", "")),
                state=state,
                job=str(obj.get("job", "")),
                owner=str(obj.get("owner", "")),
                created_at=float(obj.get("created_at", 0.0)),
                updated_at=float(obj.get("updated_at", 0.0)),
                timeout_s=float(obj.get("timeout_s", DEFAULT_TIMEOUT_S)),
                partitions={int(p): TxnPartition.from_json(v) for p, v in obj.get("partitions", {}).items()},
                reason=obj.get("reason"),
                info=dict(obj.get("info") or {}),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"corrupt transaction record: {exc}") from None


def txn_id(job: str, n: int) -> str:
    """The id of a job's ``n``-th commit attempt: ``{job}.{n:06d}`` (jobs never contain a dot)."""
    return f"{job}.{n:06d}"


def parse_txn_id(name: str) -> tuple[str, int] | None:
    job, sep, n = name.rpartition(".")
    return (job, int(n)) if sep and n.isdigit() else None


# -- reading and writing records -------------------------------------------------------------------


async def read_txn(storage: Storage, keys: Keys, topic: str, txn: str) -> tuple[TxnRecord, str] | None:
    """The record and its ETag, or None when there is none."""
    blob = await storage.get(keys.txn(topic, txn))
    if blob is None:
        return None
    return TxnRecord.decode(blob.data), blob.etag


async def create_txn(storage: Storage, keys: Keys, record: TxnRecord) -> str:
    """Write a new pending record put-if-absent (raises AlreadyExists); returns its ETag."""
    assert record.state == "pending"
    validate_name(record.topic)
    record.created_at = record.updated_at = record.created_at or time.time()
    return await storage.create(keys.txn(record.topic, record.id), record.encode())


async def rewrite_txn(
    storage: Storage, keys: Keys, record: TxnRecord, etag: str
) -> tuple[TxnRecord, str, bool]:
    """Overwrite the record with ``record`` only if it still has ``etag`` (If-Match).

    Returns ``(record now stored, its etag, whether ours won)``: when another writer changed it
    first (a commit racing an abort), the stored record is read back and returned.
    """
    record.updated_at = time.time()
    key = keys.txn(record.topic, record.id)
    try:
        new_etag = await storage.store.put(key, record.encode(), if_match=etag)
    except PreconditionFailed:
        found = await read_txn(storage, keys, record.topic, record.id)
        if found is None:
            raise TxnError(f"transaction {record.id} of topic {record.topic!r} disappeared") from None
        return found[0], found[1], False
    return record, new_etag, True


async def abort_txn(
    storage: Storage,
    keys: Keys,
    topic: str,
    txn: str,
    reason: str,
    *,
    etag: str | None = None,
    only_expired: bool = True,
    now: float | None = None,
) -> TxnRecord | None:
    """Abort a pending transaction (only once it expired, unless ``only_expired`` is false).

    Returns the record as it stands afterwards (it may have been committed first), or None.
    """
    found = await read_txn(storage, keys, topic, txn)
    if found is None:
        return None
    record, current = found
    if record.state != "pending" or (etag is not None and etag != current):
        return record
    if only_expired and not record.expired(now):
        return record
    record.state, record.reason = "aborted", reason
    stored, _, won = await rewrite_txn(storage, keys, record, current)
    if won:
        log.warning("aborted transaction %s of topic %s: %s", txn, topic, reason)
    return stored


async def list_txns(storage: Storage, keys: Keys, topic: str, job: str | None = None) -> list[str]:
    """Ids of the topic's transaction records (only ``job``'s when given), in order."""
    prefix = keys.txn_prefix(topic) + (f"{job}." if job is not None else "")
    base = keys.txn_prefix(topic)
    out = []
    async for info in storage.list(prefix):
        name = info.key[len(base) :]
        if name.endswith(".json"):
            out.append(name[: -len(".json")])
    return out


async def read_all(
    storage: Storage, keys: Keys, topic: str, ids: list[str]
) -> dict[str, tuple[TxnRecord, str]]:
    """Records of ``ids`` read concurrently (missing ones left out)."""
    limit = asyncio.Semaphore(READ_CONCURRENCY)

    async def one(txn: str) -> tuple[str, tuple[TxnRecord, str] | None]:
        async with limit:
            return txn, await read_txn(storage, keys, topic, txn)

    return {t: r for t, r in await asyncio.gather(*(one(t) for t in ids)) if r is not None}


async def stable_limits(
    storage: Storage, keys: Keys, topic: str, *, abort_expired: bool = True, now: float | None = None
) -> dict[int, int]:
    """Per partition, the seq below which every transaction is resolved (absent: no limit).

    It is the smallest ``start`` of the pending transactions. Call it *after* listing segments or
    finding tails: a transaction created later starts at or above any tail seen before it.
    Expired pending transactions are aborted on the way (``abort_expired``; a reader without
    write permission just waits for them).
    """
    limits: dict[int, int] = {}
    # resolved records never change and are never deleted: only the others are read again
    resolver = resolver_for(storage, keys, topic)
    unresolved = [t for t in await list_txns(storage, keys, topic) if not resolver.is_final(t)]
    records = await read_all(storage, keys, topic, unresolved)
    for txn, (record, etag) in records.items():
        if record.state == "pending" and abort_expired and record.expired(now):
            try:
                stored = await abort_txn(
                    storage, keys, topic, txn, "timed out (found by a reader)", etag=etag, now=now
                )
                record = stored or record
            except StorageError as exc:
                log.info("could not abort expired transaction %s: %s", txn, exc)
        if record.state != "pending":
            resolver.remember(record)
            continue
        for p, part in record.partitions.items():
            limits[p] = min(limits.get(p, part.start), part.start)
    return limits


# -- the reader's resolver -------------------------------------------------------------------------


class TxnResolver:
    """Decides the visibility of transactional segments of one topic, caching records.

    ``abort_expired``: a reader that meets a pending transaction past its timeout aborts it, so a
    committer that died never stalls the partition for longer than the timeout.
    """

    def __init__(
        self,
        storage: Storage,
        keys: Keys,
        topic: str,
        *,
        recheck_s: float = PENDING_RECHECK_S,
        abort_expired: bool = True,
    ) -> None:
        self.storage = storage
        self.keys = keys
        self.topic = topic
        self.recheck_s = recheck_s
        self.abort_expired = abort_expired
        self._final: OrderedDict[str, TxnRecord | None] = OrderedDict()  # None: no record (skip)
        self._pending: dict[str, tuple[float, TxnRecord, str]] = {}
        self._lock = asyncio.Lock()

    def remember(self, record: TxnRecord) -> None:
        """Seed the cache with a resolved record (a planner that already read it)."""
        if record.final:
            self._final[record.id] = record
            self._trim()

    def is_final(self, txn: str) -> bool:
        """Whether ``txn``'s record is known to be resolved (committed or aborted)."""
        found = self._final.get(txn)
        return found is not None and found.final

    def _trim(self) -> None:
        while len(self._final) > RESOLVED_CACHE:
            self._final.popitem(last=False)

    async def record(self, txn: str) -> TxnRecord | None:
        """The record as a reader should see it now (None: no record)."""
        if txn in self._final:
            self._final.move_to_end(txn)
            return self._final[txn]
        now = time.monotonic()
        cached = self._pending.get(txn)
        if cached is not None and now - cached[0] < self.recheck_s:
            return cached[1]
        async with self._lock:
            found = await read_txn(self.storage, self.keys, self.topic, txn)
        if found is None:
            # written before its first segment and never deleted: this segment was never visible
            self._final[txn] = None
            self._trim()
            return None
        record, etag = found
        if record.state == "pending" and self.abort_expired and record.expired():
            try:
                record = (
                    await abort_txn(
                        self.storage, self.keys, self.topic, txn, "timed out (found by a reader)", etag=etag
                    )
                    or record
                )
            except StorageError as exc:
                log.info("could not abort expired transaction %s: %s", txn, exc)
        if record.final:
            self._pending.pop(txn, None)
            self._final[txn] = record
            self._trim()
        else:
            self._pending[txn] = (now, record, etag)
        return record

    async def visibility(self, header: SegmentHeader) -> Visibility:
        if header.txn is None:
            return "visible"
        record = await self.record(header.txn)
        return "skip" if record is None else record.visibility(header)


_RESOLVERS: weakref.WeakKeyDictionary[Storage, dict[tuple[str, str], TxnResolver]] = (
    weakref.WeakKeyDictionary()
)


def resolver_for(storage: Storage, keys: Keys, topic: str) -> TxnResolver:
    """The shared resolver of ``topic`` for this storage (one cache per process and bucket)."""
    per_storage = _RESOLVERS.setdefault(storage, {})
    resolver = per_storage.get((keys.root, topic))
    if resolver is None:
        resolver = per_storage[(keys.root, topic)] = TxnResolver(storage, keys, topic)
    return resolver


async def txn_visibility(storage: Storage, keys: Keys, topic: str, header: SegmentHeader) -> Visibility:
    """The engine's discovery hook: ``visible``, ``skip`` (every message) or ``wait`` (stop here)."""
    if header.txn is None:
        return "visible"
    return await resolver_for(storage, keys, topic).visibility(header)


# -- garbage collection ----------------------------------------------------------------------------


async def collect_transactions(
    storage: Storage,
    keys: Keys,
    topics: list[str],
    delete: Callable[[str], Awaitable[None]],
    *,
    now: float | None = None,
    staging_ttl_s: float = STAGING_TTL_S,
    include_staging: bool = True,
) -> int:
    """Garbage of job commits; returns how many objects were handed to ``delete``.

    * pending records past their timeout are aborted (their segments are skipped from then on);
    * resolved records (committed or aborted) are **kept**: a record is its job's memory. Deleting
      a committed one would let a rerun of the same ``jobId`` commit the job a second time, and a
      deleted id could be taken again by a later run while long-lived readers still cache the old
      record's state for that id (found by the simulation). They are small, one per job run;
    * Spark leftovers: staging areas, abort markers and intents whose newest object is older than
      ``staging_ttl_s`` and that no pending transaction still names.
    """
    now = time.time() if now is None else now
    deleted = 0
    referenced: set[str] = set()
    for topic in topics:
        records = await read_all(storage, keys, topic, await list_txns(storage, keys, topic))
        for txn, (record, etag) in records.items():
            if record.state == "pending" and record.expired(now):
                record = (
                    await abort_txn(
                        storage, keys, topic, txn, "timed out (garbage collection)", etag=etag, now=now
                    )
                    or record
                )
            if record.state == "pending":
                referenced.update(c.src for part in record.partitions.values() for c in part.chunks)
                referenced.add(record.owner)
    if include_staging:  # bucket-wide: only when every topic's pending transactions were seen
        deleted += await _collect_staging(storage, keys, referenced, now, staging_ttl_s, delete)
    return deleted


async def _collect_staging(
    storage: Storage,
    keys: Keys,
    referenced: set[str],
    now: float,
    ttl_s: float,
    delete: Callable[[str], Awaitable[None]],
) -> int:
    """Spark staging runs (``_spark/staging/{job}/{run}/``) and markers nobody needs any more."""
    groups: dict[str, list[tuple[str, float]]] = {}
    base = keys.spark_staging_prefix()
    async for info in storage.list(base):
        parts = info.key[len(base) :].split("/")
        group = base + "/".join(parts[:2]) if len(parts) > 2 else info.key
        groups.setdefault(group, []).append((info.key, info.last_modified))
    for prefix in (keys.spark_aborted_prefix(),):
        async for info in storage.list(prefix):
            groups.setdefault(info.key, []).append((info.key, info.last_modified))
    deleted = 0
    for group, objects in groups.items():
        if now - max(t for _, t in objects) <= ttl_s:
            continue
        run = group.rsplit("/", 1)[-1]
        if run in referenced or any(k in referenced for k, _ in objects):
            continue
        for key, _ in objects:
            await delete(key)
            deleted += 1
    return deleted
