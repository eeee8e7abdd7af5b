"""The producer: group commit of concurrent publishes into one segment per partition (docs/design.md 2.2)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import logging
import random
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Unpack

from bucketq.config import ProducerSettings
from bucketq.core.batching import TIMER_RESOLUTION_S, Batcher, Callers
from bucketq.core.ids import token
from bucketq.core.keys import Keys
from bucketq.core.pings import PING_AFTER_QUIET_S, Pings
from bucketq.core.producer_peers import ProducerPeers
from bucketq.core.segment import (
    Record,
    build_record,
    decode_header,
    decode_segment,
    encode_record,
)
from bucketq.core.segment_writer import SegmentWriter
from bucketq.core.store_clock import READING_REUSE_S, StoreClock
from bucketq.core.topics import TopicCatalog, find_tail
from bucketq.core.waiting import wait_event
from bucketq.core.wake import WAKE_REFRESH_S, retouch_wake
from bucketq.errors import (
    AlreadyExists,
    BucketqError,
    Closed,
    Contended,
    PreconditionFailed,
    PublishTimeout,
    StorageError,
)
from bucketq.publish_options import DEFAULT_OPTIONS, PublishFields, PublishOptions, resolve_options
from bucketq.storage import Storage

log = logging.getLogger("bucketq.producer")

# The advisory head hint (where a new writer starts probing for the tail) is rewritten at most
# this often per partition, or after this many segments: one PUT per 30 s of an idle-ish partition
# instead of one per second, and a newcomer probes at most HEAD_HINT_SEGMENTS segments forward.
HEAD_HINT_INTERVAL_S = 30.0
HEAD_HINT_SEGMENTS = 64
# A silence shorter than a timer can wait (batching.TIMER_RESOLUTION_S) is this many turns of the
# event loop: callers woken by a write resume in the turn after it, and publish within that turn
# (or the next, through a short await of their own).
SHORT_SILENCE_YIELDS = 3


# Who is publishing (core/batching.Callers): the asyncio task, unless the code that publishes on
# someone's behalf says who that is (a sidecar: the app's HTTP connection, whose requests come one
# after another, while each request's messages are published by tasks of their own).
_CALLER: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar(
    "bucketq_publish_caller", default=None
)
_NO_TASK = object()


@contextlib.contextmanager
def publishing_as(caller: Hashable) -> Iterator[None]:
    """Publishes in this block (and in tasks it starts) are ``caller``'s: the producer's group
    commit writes a batch at once when every caller it knows waits on one (core/batching.py)."""
    token = _CALLER.set(caller)
    try:
        yield
    finally:
        _CALLER.reset(token)


def _current_caller() -> Hashable:
    return _CALLER.get() or asyncio.current_task() or _NO_TASK


async def _let_woken_callers_run() -> None:
    """``SHORT_SILENCE_YIELDS`` turns of the event loop: callers a write woke publish meanwhile."""
    for _ in range(SHORT_SILENCE_YIELDS):
        await asyncio.sleep(0)


@dataclass(frozen=True, slots=True)
class PublishResult:
    """Where a durable message landed. ``duplicate`` is True when a dedup id matched an earlier one."""

    id: str
    topic: str
    partition: int
    seq: int
    index: int
    offset: int
    duplicate: bool = False


def _pending_marker(
    message_id: str, partition: int, from_seq: int, scan: list[list[int]] | None = None
) -> bytes:
    """A dedup marker's ``pending`` body: where this attempt writes (and, after a takeover, where
    every earlier attempt may have landed)."""
    body: dict[str, Any] = {
        "state": "pending",
        "id": message_id,
        "at": time.time(),
        "partition": partition,
        "from_seq": from_seq,
    }
    if scan is not None:
        body["scan"] = scan
    return json.dumps(body).encode()


_COMMITTED_FIELDS = ("id", "partition", "seq", "index", "offset")


def _decode_marker(data: bytes) -> dict[str, Any]:
    """A dedup marker's body; an unreadable one (a killed writer's empty object, a stray write)
    reads as ``{"state": "unreadable"}``: taken over like an abandoned pending marker once it is
    older than the publish timeout, never a reason for a publish to fail (I8)."""
    try:
        marker = json.loads(data)
    except ValueError:
        return {"state": "unreadable"}
    if not isinstance(marker, dict):
        return {"state": "unreadable"}
    if marker.get("state") == "committed" and not all(f in marker for f in _COMMITTED_FIELDS):
        return {"state": "unreadable"}
    return marker


def _scan_ranges(marker: dict[str, Any]) -> dict[int, int]:
    """partition -> earliest seq where the attempts a pending dedup marker records may have landed
    (format 2 markers name one partition and seq; takeovers add ``scan`` with every attempt's)."""
    out: dict[int, int] = {}
    try:
        for p, seq in marker.get("scan") or ():
            out[int(p)] = min(out.get(int(p), int(seq)), int(seq))
        partition = int(marker.get("partition", -1))
        if partition >= 0 and "from_seq" in marker:
            out[partition] = min(out.get(partition, int(marker["from_seq"])), int(marker["from_seq"]))
    except (ValueError, TypeError):
        pass  # a malformed record of where attempts landed: scan what could be read of it
    return out


def _merge_scan(ranges: dict[int, int], partition: int, from_seq: int) -> list[list[int]]:
    ranges = dict(ranges)
    ranges[partition] = min(ranges.get(partition, from_seq), from_seq)
    return [[p, seq] for p, seq in sorted(ranges.items())]


def _duplicate(topic: str, marker: dict[str, Any]) -> PublishResult:
    return PublishResult(
        marker["id"],
        topic,
        int(marker["partition"]),
        int(marker["seq"]),
        int(marker["index"]),
        int(marker["offset"]),
        duplicate=True,
    )


def partition_for_key(key: str, partitions: int) -> int:
    """``hash(key) % partitions`` with a stable hash: the first 8 bytes of SHA-256, big-endian."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") % partitions


@dataclass(frozen=True, slots=True)
class PreparedRecord:
    """One message built, validated and encoded for ``topic`` (:meth:`Producer.prepare`), not yet
    published: ``line`` is the exact bytes its segment will hold."""

    topic: str
    record: Record
    line: bytes

    @property
    def size(self) -> int:
        """The encoded size in bytes (what the topic's ``max_message_bytes`` limits)."""
        return len(self.line)


@dataclass(slots=True)
class _Pending:
    record: Record
    line: bytes
    future: asyncio.Future[PublishResult]


class PartitionAppender:
    """Appends batches to one partition; one segment write in flight at a time keeps order."""

    def __init__(
        self,
        storage: Storage,
        keys: Keys,
        topic: str,
        partition: int,
        producer_id: str,
        settings: ProducerSettings,
        catalog: TopicCatalog | None = None,
    ) -> None:
        self.storage = storage
        self.keys = keys
        self.topic = topic
        self.partition = partition
        self.producer_id = producer_id
        self.settings = settings
        self.writer = SegmentWriter(
            storage,
            keys,
            topic,
            partition,
            producer_id,
            timeout_s=settings.publish_timeout_s,
            max_attempts=settings.max_attempts,
            catalog=catalog,
        )
        self._buffer: list[_Pending] = []
        self._writing: list[_Pending] = []
        self._buffer_bytes = 0
        self._batcher = Batcher(settings.linger_ms / 1000, settings.linger_fill_messages)
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._head_task: asyncio.Task[None] | None = None
        self.on_written: Callable[[int], None] | None = None  # after each durable segment (its seq)
        # every caller of the producer waits on a batch: nothing more can come (core/batching.py)
        self.closed_loop: Callable[[], bool] = lambda: False
        self._head_dirty = False
        self._head_written_at = 0.0
        self._head_behind = 0  # segments written since the hint
        self._wake_head = asyncio.Event()

    @property
    def conflicts(self) -> int:
        """Segment sequence numbers lost to other producers."""
        return self.writer.conflicts

    @property
    def on_conflict(self) -> Callable[[], None] | None:
        return self.writer.on_conflict

    @on_conflict.setter
    def on_conflict(self, hook: Callable[[], None] | None) -> None:
        self.writer.on_conflict = hook

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def unsettled(self) -> list[asyncio.Future[PublishResult]]:
        """Futures of messages accepted but not yet durable or failed."""
        return [p.future for p in (*self._writing, *self._buffer) if not p.future.done()]

    def add(self, pending: _Pending) -> None:
        if self._closing:
            raise Closed("producer is closing")
        self._buffer.append(pending)
        self._buffer_bytes += len(pending.line) + 1
        self._batcher.arrived()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._wake.set()
        if (
            len(self._buffer) >= self.settings.max_batch_messages
            or self._buffer_bytes >= self.settings.max_batch_bytes
        ):
            self._full.set()

    async def close(self) -> None:
        """Flush what is buffered, then stop."""
        self._closing = True
        self._full.set()
        self._wake.set()
        self._wake_head.set()
        if self._task is not None:
            await self._task
        if self._head_task is not None:
            await self._head_task

    async def _run(self) -> None:
        while True:
            if not self._buffer:
                self._batcher.idle()
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            # group commit: written at once unless arrivals keep coming (core/batching.py), and at
            # once when every caller waits on a batch (a closed loop never waits for company)
            while not self._closing and not self._full.is_set() and not self.closed_loop():
                wait = self._batcher.close_at(size=len(self._buffer)) - time.monotonic()
                if wait <= 0:
                    break
                if wait < TIMER_RESOLUTION_S:
                    size = len(self._buffer)
                    await _let_woken_callers_run()
                    if len(self._buffer) == size:
                        break
                    continue
                self._wake.clear()
                await wait_event(self._wake, wait)
            batch = self._take_batch()
            self._batcher.taken()
            self._writing = batch
            try:
                await self._write(batch)
            except Exception as exc:  # every caller of the batch learns why
                err = exc if isinstance(exc, BucketqError) else StorageError(str(exc))
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(err)
            finally:
                self._writing = []
            if self._buffer:
                # What waited during the write goes next, but first the callers this write woke
                # publish again (the turn after it): a closed loop of callers split into two
                # cohorts, one written while the other waits, merges back into one batch.
                await _let_woken_callers_run()

    def _take_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        size = 0
        while self._buffer and len(batch) < self.settings.max_batch_messages:
            nxt = self._buffer[0]
            if batch and size + len(nxt.line) + 1 > self.settings.max_batch_bytes:
                break
            batch.append(self._buffer.pop(0))
            size += len(nxt.line) + 1
        self._buffer_bytes -= size
        if (
            len(self._buffer) < self.settings.max_batch_messages
            and self._buffer_bytes < self.settings.max_batch_bytes
        ):
            self._full.clear()
        return batch

    async def _write(self, batch: list[_Pending]) -> None:
        landed = await self.writer.append([p.line for p in batch], token())
        for index, p in enumerate(batch):
            if not p.future.done():
                p.future.set_result(
                    PublishResult(
                        p.record.id, self.topic, self.partition, landed.seq, index, landed.base + index
                    )
                )
        self._schedule_head()
        if self.on_written is not None:
            self.on_written(landed.seq)

    def _schedule_head(self) -> None:
        self._head_dirty = True
        self._head_behind += 1
        if self._head_behind >= HEAD_HINT_SEGMENTS:
            self._wake_head.set()
        if self._head_task is None or self._head_task.done():
            self._head_task = asyncio.get_running_loop().create_task(self._write_head())

    async def _write_head(self) -> None:
        """Overwrite the advisory head hint, at most once per HEAD_HINT_INTERVAL_S per partition
        (sooner once HEAD_HINT_SEGMENTS segments were written since, and at close)."""
        while self._head_dirty:
            while (
                not self._closing
                and self._head_behind < HEAD_HINT_SEGMENTS
                and time.monotonic() < self._head_written_at + HEAD_HINT_INTERVAL_S
            ):
                self._wake_head.clear()
                await wait_event(
                    self._wake_head, self._head_written_at + HEAD_HINT_INTERVAL_S - time.monotonic()
                )
            self._head_dirty = False
            self._head_behind = 0
            self._head_written_at = time.monotonic()
            await self.writer.write_head()


class Producer:
    """Publishes to any topic; concurrent calls share segments (group commit)."""

    def __init__(
        self,
        storage: Storage,
        keys: Keys,
        catalog: TopicCatalog,
        settings: ProducerSettings,
        *,
        producer_id: str,
        name: str,
        peers: ProducerPeers | None = None,
        pings: Pings | None = None,
        clock: StoreClock | None = None,
    ) -> None:
        self.storage = storage
        self.keys = keys
        self.catalog = catalog
        self.settings = settings
        # the store's clock: a dedup marker's age is measured on it (I15), never on this host's
        self.clock = clock or StoreClock(storage, keys=keys, who=f"producer {name}")
        self.id = producer_id
        self.name = name
        self._appenders: dict[tuple[str, int], PartitionAppender] = {}
        self._sticky: dict[str, int] = {}
        self._closed = False
        self.peers = peers
        self._woken: dict[str, float] = {}  # topic -> when this producer last touched its wake object
        self._appended: dict[str, float] = {}  # topic -> when this producer's last append was durable
        self._wake_tasks: set[asyncio.Task[None]] = set()
        self._wake_etags: dict[str, str] = {}  # topic -> the ETag of this producer's last touch
        self._partitions: dict[str, int] = {}  # topic -> its partitions, as last read
        self.pings = pings
        # who publishes through this producer: remembered for a linger (core/batching.Callers)
        self.callers = Callers(settings.linger_ms / 1000)

    @property
    def buffered(self) -> int:
        """Messages accepted but not yet durable."""
        return sum(a.buffered for a in self._appenders.values())

    def appender(self, topic: str, partition: int) -> PartitionAppender:
        key = (topic, partition)
        app = self._appenders.get(key)
        if app is None:
            app = PartitionAppender(
                self.storage, self.keys, topic, partition, self.id, self.settings, self.catalog
            )
            app.on_conflict = lambda: self._move_on(topic, partition)
            app.on_written = lambda seq: self._segment_landed(topic, partition, seq)
            app.closed_loop = self.callers.all_waiting
            self._appenders[key] = app
        return app

    def _segment_landed(self, topic: str, partition: int, seq: int) -> None:
        """A segment is durable: ring the members that own its partition (core/pings.py), then see
        whether the wake object needs a touch."""
        if self.pings is not None:
            self.pings.ring(topic, partition, seq, self._partitions.get(topic, 0))
        self._wake_readers(topic)

    def _wake_readers(self, topic: str) -> None:
        """After a durable append: touch the topic's wake object unless this producer did within
        WAKE_REFRESH_S (core/wake.py), then ping its members (core/pings.py); advisory, in the
        background, errors ignored."""
        now = time.monotonic()
        # a ping only after a quiet spell of this producer: while it keeps appending, the readers
        # of its partitions keep finding messages and are not idle (a touch alone keeps the rest)
        last = self._appended.get(topic)
        quiet = last is None or now - last >= PING_AFTER_QUIET_S
        self._appended[topic] = now
        if now - self._woken.get(topic, -WAKE_REFRESH_S) < WAKE_REFRESH_S:
            return
        self._woken[topic] = now
        task = asyncio.get_running_loop().create_task(
            self._touch_and_ping(topic, ping=quiet, appended_at=now)
        )
        self._wake_tasks.add(task)
        task.add_done_callback(self._wake_tasks.discard)

    async def _touch_and_ping(self, topic: str, *, ping: bool, appended_at: float) -> None:
        # the ping follows the touch: a pinged member looks at the wake object and must find it
        # changed (a touch that did not land leaves the readers to their wake poll)
        etag, moved = await retouch_wake(self.storage, self.keys, topic, self.id, self._wake_etags.get(topic))
        if etag is None:
            return
        self._wake_etags[topic] = etag
        if self.pings is None:
            return
        if moved:  # someone else touched it: maybe a member joined or left, re-read them
            self.pings.stale(topic)
        if ping:  # a listing the ring started after this append is recent enough
            await self.pings.ping(topic, listed_since=appended_at)

    def _move_on(self, topic: str, partition: int) -> None:
        """Another producer appended to this partition: look at the live producers again; a
        producer that knows of no peers (unregistered writers) moves to a random partition."""
        if self.peers is not None:
            self.peers.tick(soon=True)
            if len(self.peers.ids) > 1:
                return
        if self._sticky.get(topic) == partition:
            self._sticky[topic] = random.randrange(1 << 30)

    async def _choose_partition(self, topic: str, key: str | None, partitions: int) -> int:
        """Keyed: ``hash(key) % partitions``. Unkeyed: this producer's share of the partitions
        (split between live producers), sticky to one until a full batch waits there, then the
        next (large segments, like Kafka's sticky partitioner)."""
        if key is not None:
            return partition_for_key(key, partitions)
        if self.peers is not None:
            self.peers.tick()
            share = self.peers.partitions_for(partitions)
        else:
            share = list(range(partitions))
        current = self._sticky.get(topic)
        if current is None:
            current = partition_for_key(self.id + "/" + self.name, partitions)
        current %= partitions
        if current not in share:
            current = share[current % len(share)]
        app = self._appenders.get((topic, current))
        if app is not None and app.buffered >= self.settings.max_batch_messages:
            current = share[(share.index(current) + 1) % len(share)]
        self._sticky[topic] = current
        return current

    async def publish(
        self,
        topic: str,
        payload: Any = None,
        *,
        data: bytes | None = None,
        options: PublishOptions | None = None,
        message_id: str | None = None,
        created_at: float | None = None,
        **fields: Unpack[PublishFields],
    ) -> PublishResult:
        """Publish one message; returns once it is durable in the bucket.

        The body is a JSON-serialisable ``payload`` or raw ``data`` bytes (not both). The options
        (``key``, ``headers``, ``dedup_id``, ``priority``, ``delay`` or ``not_before``,
        ``content_type``; see :class:`~bucketq.PublishOptions`) are keyword arguments, or one
        ``options`` value, not both. ``message_id`` and ``created_at`` replace the generated id and
        the publish time (replays, benchmarks).

        Raises :class:`~bucketq.TopicNotFound`, :class:`~bucketq.InvalidMessage` or
        :class:`~bucketq.MessageTooLarge` (nothing was published), :class:`~bucketq.PublishTimeout`
        or :class:`~bucketq.StorageError` (not acknowledged; it may still have landed, so retry
        with a ``dedup_id``), :class:`~bucketq.TopicDeleted`, :class:`~bucketq.Closed`.
        """
        opts = resolve_options(options, **fields)
        prepared = await self.prepare(
            topic, payload, data=data, options=opts, message_id=message_id, created_at=created_at
        )
        return await self.publish_prepared(prepared)

    async def prepare(
        self,
        topic: str,
        payload: Any = None,
        *,
        data: bytes | None = None,
        options: PublishOptions = DEFAULT_OPTIONS,
        message_id: str | None = None,
        created_at: float | None = None,
    ) -> PreparedRecord:
        """Build, validate and encode one message for ``topic`` without publishing it.

        The record is built once: :meth:`publish_prepared` publishes exactly these bytes. A caller
        that must check a whole batch before publishing any of it (the sidecar, the CLI) prepares
        every message first. Raises what :meth:`publish` raises before anything is written.
        """
        if self._closed:
            raise Closed("producer is closed")
        config = await self.catalog.config(topic)
        record = build_record(
            payload,
            data=data,
            content_type=options.content_type,
            key=options.key,
            headers=options.headers,
            producer_id=self.id,
            priority=options.priority,
            not_before=options.not_before,
            delay=options.delay,
            dedup_id=options.dedup_id,
            id=message_id,
            created_at=created_at,
        )
        return PreparedRecord(topic, record, encode_record(record, config.max_message_bytes))

    async def publish_prepared(self, prepared: PreparedRecord) -> PublishResult:
        """Publish a message :meth:`prepare` built; returns once it is durable in the bucket."""
        return await self._publish_line(
            prepared.topic, prepared.record, prepared.line, prepared.record.dedup_id
        )

    async def publish_record(
        self,
        topic: str,
        record: Record,
        *,
        headers: Mapping[str, str] | None = None,
        dedup_id: str | None = None,
    ) -> PublishResult:
        """Publish an existing record as it is (same id, payload, key, timestamps), e.g. into a DLQ.

        ``headers`` replaces the record's headers; ``dedup_id`` guards the publish without
        changing the record.
        """
        if self._closed:
            raise Closed("producer is closed")
        config = await self.catalog.config(topic)
        if headers is not None:
            record = replace(record, headers=dict(headers))
        line = encode_record(record, config.max_message_bytes)
        return await self._publish_line(topic, record, line, dedup_id)

    async def _publish_line(
        self, topic: str, record: Record, line: bytes, dedup_id: str | None
    ) -> PublishResult:
        if self._closed:
            raise Closed("producer is closed")
        self.callers.seen(_current_caller())  # a caller preparing its item may still come
        config = await self.catalog.config(topic)
        self._partitions[topic] = config.partitions
        partition = await self._choose_partition(topic, record.key, config.partitions)
        if dedup_id is not None:
            return await self._publish_dedup(topic, partition, record, line, dedup_id)
        return await self._enqueue(topic, partition, record, line)

    async def _enqueue(self, topic: str, partition: int, record: Record, line: bytes) -> PublishResult:
        future: asyncio.Future[PublishResult] = asyncio.get_running_loop().create_future()
        caller = _current_caller()
        self.appender(topic, partition).add(_Pending(record, line, future))
        self.callers.waiting(caller)
        future.add_done_callback(lambda _: self.callers.settled(caller))
        return await future

    async def _publish_dedup(
        self, topic: str, partition: int, record: Record, line: bytes, dedup_id: str
    ) -> PublishResult:
        """Idempotent publish (invariant I7: a dedup id is stored once within its window).

        A marker ``{topic}/dedup/{sha256}`` guards the id: put-if-absent ``pending`` (with the
        partition and the tail seq before the write) before the segment, overwritten ``committed``
        (If-Match) once durable. A marker is never deleted by a publisher: a write whose outcome
        is unknown may have landed. Whoever takes over a pending marker whose writer gave up
        first scans the partition from the recorded seq for the record, and only publishes if it
        is not there.
        """
        marker_key = self.keys.dedup(topic, dedup_id)
        window = self.settings.dedup_window_s
        deadline = time.monotonic() + self.settings.publish_timeout_s
        appender = self.appender(topic, partition)
        while True:
            from_seq = appender.writer.next_seq
            if from_seq is None:
                from_seq, _ = await find_tail(self.storage, self.keys, topic, partition)
            pending = _pending_marker(record.id, partition, from_seq)
            try:
                etag = await self.storage.create(marker_key, pending)
                break
            except Contended:
                await asyncio.sleep(random.uniform(0.05, 0.3))
                continue
            except AlreadyExists:
                pass
            blob = await self.storage.get(marker_key)
            if blob is None:
                continue
            marker = _decode_marker(blob.data)
            # I15: the marker's age on the store's clock (its "at" is its writer's host clock: a
            # producer whose clock ran ahead took over another's live marker and stored twice)
            age = await self.clock.now(max_age_s=READING_REUSE_S) - blob.last_modified
            if marker.get("state") == "committed" and age <= window:
                return _duplicate(topic, marker)
            stale = (
                age > window if marker.get("state") == "committed" else age > self.settings.publish_timeout_s
            )
            if stale:  # take over an expired or abandoned marker
                if marker.get("state") == "pending":
                    # keep where every abandoned attempt may have landed: a taker that dies after
                    # taking over must not hide an older write from the next taker's scan (the
                    # simulation found a second copy stored when a takeover recorded only the
                    # tail of its own time and then failed)
                    scan = _merge_scan(_scan_ranges(marker), partition, from_seq)
                    pending = _pending_marker(record.id, partition, from_seq, scan)
                try:
                    etag = await self.storage.store.put(marker_key, pending, if_match=blob.etag)
                except PreconditionFailed:
                    continue
                if marker.get("state") == "pending":
                    found = await self._find_landed(topic, marker, dedup_id)
                    if found is not None:
                        await self._commit_marker(marker_key, found, etag, dedup_id)
                        return replace(found, duplicate=True)
                break
            if time.monotonic() >= deadline:
                raise PublishTimeout(f"dedup id {dedup_id!r} is being published by another caller")
            await asyncio.sleep(0.1)
        result = await self._enqueue(topic, partition, record, line)
        await self._commit_marker(marker_key, result, etag, dedup_id)
        return result

    async def _find_landed(self, topic: str, marker: dict[str, Any], dedup_id: str) -> PublishResult | None:
        """Where an abandoned pending publish of ``dedup_id`` landed, if it did (scans forward from
        each seq its marker recorded, for every attempt, to the partition's tail)."""
        for partition, from_seq in sorted(_scan_ranges(marker).items()):
            found = await self._scan_for(topic, partition, from_seq, dedup_id)
            if found is not None:
                return found
        return None

    async def _scan_for(self, topic: str, partition: int, seq: int, dedup_id: str) -> PublishResult | None:
        while True:
            blob = await self.storage.get(self.keys.segment(topic, partition, seq))
            if blob is None:
                return None
            try:
                if decode_header(blob.data).is_reference:
                    seq += 1  # a job commit's: never holds an idempotent publish
                    continue
                segment = decode_segment(blob.data)
            except StorageError:
                seq += 1
                continue
            for index, rec in enumerate(segment.records):
                if rec.dedup_id == dedup_id:
                    h = segment.header
                    return PublishResult(rec.id, topic, partition, h.seq, index, h.base + index)
            seq += 1

    async def _commit_marker(self, marker_key: str, result: PublishResult, etag: str, dedup_id: str) -> None:
        committed = json.dumps(
            {
                "state": "committed",
                "id": result.id,
                "partition": result.partition,
                "seq": result.seq,
                "index": result.index,
                "offset": result.offset,
                "at": time.time(),
            }
        ).encode()
        for attempt in range(5):
            try:
                await self.storage.store.put(marker_key, committed, if_match=etag)
                return
            except PreconditionFailed:
                return  # taken over: the new owner scans and finds this write
            except StorageError as exc:
                if attempt == 4:
                    # stays pending: whoever takes it over finds this write by scanning
                    log.warning("dedup marker for %r not committed: %s", dedup_id, exc)
                    return
                await asyncio.sleep(0.05 * 2**attempt)

    async def flush(self) -> None:
        """Wait until everything published so far is durable (or failed)."""
        waits = [f for a in self._appenders.values() for f in a.unsettled()]
        if waits:
            await asyncio.gather(*waits, return_exceptions=True)

    async def close(self) -> None:
        """Flush and stop accepting publishes."""
        self._closed = True
        await asyncio.gather(*(a.close() for a in self._appenders.values()))
        if self._wake_tasks:
            await asyncio.gather(*self._wake_tasks, return_exceptions=True)
        if self.peers is not None:
            await self.peers.close()
