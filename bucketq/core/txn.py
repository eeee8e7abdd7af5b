"""Job commits (transactions): a job's segments become visible all at once, or never.

Protocol (docs/protocol.md, "Job commits (transactions)"):

1. The committer writes the transaction record ``R/{topic}/txn/{id}.json`` put-if-absent as
   ``pending``, *before* appending anything. Its manifest names, per partition, ``start`` (the
   partition's tail when the record was written: every segment of the transaction lands at or
   above it) and the segments to append, in order (historically "chunks"). In format 5 each is a
   reference segment and names the columnar chunks it references (``refs``), which the job's
   tasks wrote at their final keys before the record existed (core/refsegment.py).
2. It appends each segment at the partition's tail (put-if-absent), whose header carries ``txn``
   (the id) and ``chunk`` (the segment's index in the manifest).
3. It overwrites the record ``committed`` with If-Match on the pending record's ETag, filling in
   the seq (and base offset) where each segment landed. Anyone may instead overwrite a pending
   record ``aborted`` with If-Match once it is older than its ``timeout_s``: exactly one wins.

Readers decide per segment (:meth:`TxnRecord.visibility`):

* no ``txn`` in the header: visible (every ordinary segment);
* ``committed``: visible iff the record says this chunk landed at this very seq. A chunk
  appended twice (a recovering run, or a committer that was thought dead) is visible once;
* ``aborted``, or no record at all: skipped. A record is written before its first segment and
  never deleted, so a missing record never hides a committed segment (a segment without its
  record is the leftover of a committer whose record write failed: nothing of it was visible);
* ``pending``: ``wait``: a consumer stops in that partition at that segment until the
  transaction resolves (its cursor is a sequence). Readers that plan from a listing (Spark)
  judge every segment against a :class:`TxnSnapshot` of the records taken *before* listing: a
  transactional segment is shown iff its record was committed in the snapshot and names that
  seq; an unresolved transaction's segments are hidden, nothing else (:func:`stream_ends` keeps
  a stream's offsets off unresolved transactions and out of the middle of committed ones).

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

from bucketq.core.chunks import ChunkRef
from bucketq.core.fences import read_fence
from bucketq.core.foreign import skip_foreign
from bucketq.core.keys import Keys, chunk_name_of, txn_of, validate_name
from bucketq.core.segment import SegmentHeader
from bucketq.core.store_clock import READING_REUSE_S, StoreClock
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
    """One segment to append, in a transaction's manifest (the name predates reference segments).

    Format 5: a reference segment naming ``refs`` (columnar chunks already written); ``bytes``
    is then the chunks' total. Records of older versions name a staged object in ``src`` instead.
    """

    count: int
    bytes: int = 0
    src: str = ""  # (records before format 5) the staged object the committer copied
    seq: int | None = None  # where it landed: set in the committed record
    refs: list[ChunkRef] = field(default_factory=list)
    base: int | None = None  # the partition offset of its first message (with seq)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"count": self.count, "bytes": self.bytes}
        if self.src:
            out["src"] = self.src
        if self.refs:
            out["refs"] = [r.to_json() for r in self.refs]
        if self.seq is not None:
            out["seq"] = self.seq
        if self.base is not None:
            out["base"] = self.base
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Chunk:
        seq, base = obj.get("seq"), obj.get("base")
        return cls(
            int(obj["count"]),
            int(obj.get("bytes", 0)),
            str(obj.get("src", "")),
            None if seq is None else int(seq),
            [ChunkRef.from_json(r) for r in obj.get("refs") or []],
            None if base is None else int(base),
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
    # the store's Last-Modified of the record as read (:func:`read_txn`; not part of the record):
    # its age on the store's clock decides when anyone may abort it (I15)
    modified: float | None = None

    @property
    def messages(self) -> int:
        return sum(p.messages for p in self.partitions.values())

    @property
    def references(self) -> bool:
        """Whether its segments are reference segments (format 5), not staged copies."""
        return any(c.refs for p in self.partitions.values() for c in p.chunks)

    def landed(self) -> dict[int, list[int]]:
        """Per partition, the seqs its committed record names (what readers show)."""
        return {p: [c.seq for c in part.chunks if c.seq is not None] for p, part in self.partitions.items()}

    @property
    def final(self) -> bool:
        return self.state != "pending"

    def expired(self, store_now: float) -> bool:
        """A pending record nobody has written for longer than its timeout: anyone may abort it.

        The age is measured on the store's clock (I15): ``store_now`` (the store's time,
        :func:`store_time`) minus the record's Last-Modified as read. Before, it was the reader's
        host clock against the committer's ``updated_at``: a reader whose clock ran ahead by more
        than the timeout aborted a live commit. A record not read from the store has no age: it is
        never taken for expired.
        """
        return (
            self.state == "pending"
            and self.modified is not None
            and store_now - self.modified > self.timeout_s
        )

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
            "v": 2 if self.references else 1,
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
    record = TxnRecord.decode(blob.data)
    record.modified = blob.last_modified
    return record, blob.etag


_CLOCKS: weakref.WeakKeyDictionary[Storage, dict[str, StoreClock]] = weakref.WeakKeyDictionary()


async def store_time(storage: Storage, keys: Keys) -> float:
    """The store's time now, for judging a pending record's age (I15): one reading per process and
    store, reused for a while advanced by the monotonic clock (an underestimate: a record is
    aborted late, never early). Only read when a pending record is judged."""
    clocks = _CLOCKS.setdefault(storage, {})
    clock = clocks.get(keys.root)
    if clock is None:
        clock = clocks[keys.root] = StoreClock(storage, keys=keys, who="transaction expiry")
    return await clock.now(max_age_s=READING_REUSE_S)


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
    record.modified = None  # its Last-Modified is the store's now, unknown here: not expired
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

    ``now``: the store's time (I15; default: read from the store when an age is judged).
    Returns the record as it stands afterwards (it may have been committed first), or None.
    """
    found = await read_txn(storage, keys, topic, txn)
    if found is None:
        return None
    record, current = found
    if record.state != "pending" or (etag is not None and etag != current):
        return record
    if only_expired and not record.expired(await store_time(storage, keys) if now is None else now):
        return record
    record.state, record.reason = "aborted", reason
    stored, _, won = await rewrite_txn(storage, keys, record, current)
    if won:
        log.warning("aborted transaction %s of topic %s: %s", txn, topic, reason)
    return stored


async def list_txns(
    storage: Storage,
    keys: Keys,
    topic: str,
    job: str | None = None,
    *,
    foreign: Callable[[str, str], None] = skip_foreign,
) -> list[str]:
    """Ids of the topic's transaction records (only ``job``'s when given), in order; any other
    name there goes to ``foreign`` (key, what the listing was for) and is skipped."""
    prefix = keys.txn_prefix(topic) + (f"{job}." if job is not None else "")
    base = keys.txn_prefix(topic)
    out = []
    async for info in storage.list(prefix):
        # only names bucketq writes (I8): a foreign ``x.json`` there is no record, and reading it
        # as one would fail every reader's snapshot and GC's pass over the topic
        txn = txn_of(info.key, base)
        if txn is None:
            foreign(info.key, f"{topic}: listing job commit records")
        else:
            out.append(txn)
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


@dataclass(slots=True)
class TxnSnapshot:
    """Every transaction record of a topic at one moment, for planning a read against (I17).

    A reader that lists segments *after* taking the snapshot shows a transactional segment only
    if its record was committed in the snapshot and names that seq (:meth:`shown`): a record
    committed later has every segment hidden, one committed earlier every segment shown (its
    segments all landed before its commit, so the listing has them all). An unresolved
    transaction hides its own segments and nothing else.
    """

    records: dict[str, TxnRecord] = field(default_factory=dict)

    def shown(self) -> dict[tuple[int, int], tuple[TxnRecord, int]]:
        """``(partition, seq) -> (record, index in its manifest)`` of every segment a committed
        record of the snapshot names (each is shown; every other transactional segment is not)."""
        out: dict[tuple[int, int], tuple[TxnRecord, int]] = {}
        for record in self.records.values():
            if record.state != "committed":
                continue
            for p, part in record.partitions.items():
                for i, chunk in enumerate(part.chunks):
                    if chunk.seq is not None:
                        out[(p, chunk.seq)] = (record, i)
        return out

    def unresolved(self) -> list[TxnRecord]:
        return [r for r in self.records.values() if r.state == "pending"]


async def take_snapshot(
    storage: Storage, keys: Keys, topic: str, *, abort_expired: bool = True, now: float | None = None
) -> TxnSnapshot:
    """The topic's transaction records now (resolved ones come from the process's cache).

    Expired pending transactions are aborted on the way (``abort_expired``; a reader without
    write permission just leaves them pending, and hidden); ``now`` is the store's time (I15;
    default: read from the store when a pending record is met).
    """
    resolver = resolver_for(storage, keys, topic)
    ids = await list_txns(storage, keys, topic)
    known = {t: resolver.final_record(t) for t in ids}
    fresh = await read_all(storage, keys, topic, [t for t, r in known.items() if r is None])
    snapshot = TxnSnapshot()
    for txn in ids:
        record = known[txn]
        if record is None:
            found = fresh.get(txn)
            if found is None:
                continue  # listed, then gone: records are never deleted, so a topic re-created
            record, etag = found
            if record.state == "pending" and abort_expired and now is None:
                now = await store_time(storage, keys)
            if record.state == "pending" and abort_expired and now is not None and record.expired(now):
                try:
                    stored = await abort_txn(
                        storage, keys, topic, txn, "timed out (found by a reader)", etag=etag, now=now
                    )
                    record = stored or record
                except StorageError as exc:
                    log.info("could not abort expired transaction %s: %s", txn, exc)
            resolver.remember(record)
        snapshot.records[txn] = record
    return snapshot


async def stable_limits(
    storage: Storage, keys: Keys, topic: str, *, abort_expired: bool = True, now: float | None = None
) -> dict[int, int]:
    """Per partition, the seq below which every transaction is resolved (absent: no limit).

    It is the smallest ``start`` of the pending transactions. Call it *after* finding tails: a
    transaction created later starts at or above any tail seen before it. (A consumer's
    ``latest`` start uses it; planned reads use :class:`TxnSnapshot` and :func:`stream_ends`.)
    """
    limits: dict[int, int] = {}
    snapshot = await take_snapshot(storage, keys, topic, abort_expired=abort_expired, now=now)
    for record in snapshot.unresolved():
        for p, part in record.partitions.items():
            limits[p] = min(limits.get(p, part.start), part.start)
    return limits


def stream_ends(snapshot: TxnSnapshot, tails: dict[int, int]) -> dict[int, int]:
    """Per partition, how far (exclusive seq) a stream may read: the tail, lowered so that no
    unresolved transaction's segment lies below it and no committed transaction is cut in two (I17).

    ``snapshot`` must be taken *after* the tails were found: a transaction begun later starts at
    or above every tail seen before it. An unresolved transaction's segments all land at or above
    its ``start``, so each partition ends at or below the smallest ``start`` there. A committed
    transaction with segments on both sides of the ends (the ends of other partitions, or an end
    set by a pending ``start`` that fell between its segments) moves every end below its first
    segment, and the rule is applied again until nothing moves (ends only fall, so it stops).
    Replays of ``[start, end)`` then read the same: everything in it is resolved for good.
    """
    ends = dict(tails)
    for record in snapshot.unresolved():
        for p, part in record.partitions.items():
            if p in ends:
                ends[p] = min(ends[p], part.start)
    return _settle(snapshot, ends, lambda p, seqs: min(seqs), lower=True)


def whole_transactions(snapshot: TxnSnapshot, ends: dict[int, int], limit: dict[int, int]) -> dict[int, int]:
    """``ends`` raised (never past ``limit``, itself from :func:`stream_ends`) until no committed
    transaction has segments on both sides: a stream batch capped to a few segments takes a job
    whole rather than part of it (nor can a cap stop it from ever taking the job)."""
    return _settle(
        snapshot, dict(ends), lambda p, seqs: min(max(seqs) + 1, limit.get(p, max(seqs) + 1)), lower=False
    )


def _settle(
    snapshot: TxnSnapshot, ends: dict[int, int], move: Callable[[int, list[int]], int], *, lower: bool
) -> dict[int, int]:
    """Move ``ends`` until no committed transaction of the snapshot has segments on both sides of
    them: a partition's end goes to ``move(partition, the transaction's seqs there)`` when that is
    lower (``lower``) or higher than where it is; ends only move one way, so it stops."""
    committed = [r.landed() for r in snapshot.records.values() if r.state == "committed"]
    moved = True
    while moved:
        moved = False
        for landed in committed:
            seqs = {p: s for p, s in landed.items() if p in ends and s}
            below = any(x < ends[p] for p, s in seqs.items() for x in s)
            above = any(x >= ends[p] for p, s in seqs.items() for x in s)
            if below and above:
                for p, s in seqs.items():
                    target = move(p, s)
                    if (target < ends[p]) if lower else (target > ends[p]):
                        ends[p] = target
                        moved = True
    return ends


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

    def final_record(self, txn: str) -> TxnRecord | None:
        """``txn``'s record if it is known to be resolved, else None."""
        found = self._final.get(txn)
        return found if found is not None and found.final else None

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
        if (
            record.state == "pending"
            and self.abort_expired
            and record.expired(store := await store_time(self.storage, self.keys))
        ):
            try:
                record = (
                    await abort_txn(
                        self.storage,
                        self.keys,
                        self.topic,
                        txn,
                        "timed out (found by a reader)",
                        etag=etag,
                        now=store,
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
    foreign: Callable[[str, str], None] = skip_foreign,
) -> int:
    """Garbage of job commits; returns how many objects were handed to ``delete``. Every age is
    on the store's clock (I15): ``now`` is the store's time (GC's reading; default: read now).
    Names bucketq does not write under ``txn/`` and ``chunk/`` go to ``foreign``, never deleted (I8).

    * pending records past their timeout are aborted (their segments are skipped from then on);
    * resolved records (committed or aborted) are **kept**: a record is its job's memory. Deleting
      a committed one would let a rerun of the same ``jobId`` commit the job a second time, and a
      deleted id could be taken again by a later run while long-lived readers still cache the old
      record's state for that id (found by the simulation). They are small, one per job run;
    * columnar chunks (format 5, :func:`_collect_chunks`): those of a committed reference segment
      once the segment itself is collected, and those no pending or committed record names once
      they are ``staging_ttl_s`` old (tasks that failed, runs that died or were aborted);
    * Spark leftovers of older versions: staging areas, abort markers and intents whose newest
      object is older than ``staging_ttl_s`` and that no pending transaction still names.
    """
    now = await store_time(storage, keys) if now is None else now
    deleted = 0
    referenced: set[str] = set()
    for topic in topics:
        records = await read_all(storage, keys, topic, await list_txns(storage, keys, topic, foreign=foreign))
        resolved: list[TxnRecord] = []
        for txn, (record, etag) in records.items():
            if record.state == "pending" and record.expired(now):
                record = (
                    await abort_txn(
                        storage, keys, topic, txn, "timed out (garbage collection)", etag=etag, now=now
                    )
                    or record
                )
            resolved.append(record)
            if record.state == "pending":
                referenced.update(c.src for part in record.partitions.values() for c in part.chunks if c.src)
                referenced.add(record.owner)
        deleted += await _collect_chunks(storage, keys, topic, resolved, now, staging_ttl_s, delete, foreign)
    if include_staging:  # bucket-wide: only when every topic's pending transactions were seen
        deleted += await _collect_staging(storage, keys, referenced, now, staging_ttl_s, delete)
    return deleted


async def _collect_chunks(
    storage: Storage,
    keys: Keys,
    topic: str,
    records: list[TxnRecord],
    now: float,
    ttl_s: float,
    delete: Callable[[str], Awaitable[None]],
    foreign: Callable[[str, str], None],
) -> int:
    """Columnar chunks of ``topic`` nobody reads any more (I18: a chunk lives as long as the
    reference segment that names it).

    A chunk a pending record names is kept (its commit may still finish). One a committed record
    names is kept while its reference segment is stored: it goes once retention freed the
    segment (its seq is below the partition's floor fence and the object is gone), never earlier.
    Any other chunk (a failed task attempt's, an aborted or dead run's) goes once it is
    ``ttl_s`` old: a job's chunks are written before its record exists, so a young unnamed
    chunk may belong to a job that is about to commit.
    """
    pending: set[str] = set()
    committed: dict[str, tuple[int, int]] = {}
    for record in records:
        for p, part in record.partitions.items():
            for chunk in part.chunks:
                for ref in chunk.refs:
                    if record.state == "pending":
                        pending.add(ref.name)
                    elif record.state == "committed" and chunk.seq is not None:
                        committed[ref.name] = (p, chunk.seq)
    prefix = keys.chunks_prefix(topic)
    floors: dict[int, int] = {}
    gone: dict[tuple[int, int], bool] = {}
    deleted = 0
    async for info in storage.list(prefix):
        name = chunk_name_of(info.key, prefix)
        if name is None:
            foreign(info.key, f"{topic}: collecting columnar chunks")
            continue  # a foreign object is never collected (I8)
        if name in pending:
            continue
        where = committed.get(name)
        if where is not None:
            p, seq = where
            if p not in floors:
                fence, _ = await read_fence(storage, keys.segment_floor(topic, p))
                floors[p] = fence.floor if fence is not None else 0
            if seq >= floors[p]:
                continue
            if where not in gone:
                gone[where] = await storage.head(keys.segment(topic, p, seq)) is None
            if not gone[where]:
                continue
        elif now - info.last_modified <= ttl_s:
            continue
        await delete(info.key)
        deleted += 1
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
