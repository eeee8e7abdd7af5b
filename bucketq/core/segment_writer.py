"""Appending one segment at a partition's tail (put-if-absent), shared by producers and bulk writers."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from bucketq.core.cadence import RETRY_JITTER, retry_delay
from bucketq.core.fences import SEGMENT_TRUST_S, FenceView, took_before_passed
from bucketq.core.keys import Keys
from bucketq.core.segment import SegmentHeader, encode_segment, taken_header
from bucketq.core.topics import TopicCatalog, find_tail
from bucketq.errors import AlreadyExists, Contended, PublishTimeout, StorageError
from bucketq.storage import Blob, Storage

log = logging.getLogger("bucketq.producer")


@dataclass(frozen=True, slots=True)
class Appended:
    """Where a segment landed."""

    seq: int
    base: int
    count: int
    size: int


def head_hint(seq: int, next_offset: int) -> bytes:
    """The body of the advisory ``head.json``."""
    return json.dumps({"seq": seq, "next_offset": next_offset, "at": time.time()}).encode()


class SegmentWriter:
    """Writes pre-encoded message lines as the next segment of one partition.

    PUT ``seg/{next}`` with If-None-Match: on 412 the writer reads the segment there: its own batch id
    means a retried write had landed (done); another writer's means move past it. Contended claims
    (csprng_verify), 412s and storage errors are all bounded by ``max_attempts`` and ``timeout_s``
    (I8: no 412 storm or outage ends in an endless loop; the publish fails instead).

    A successful put is acknowledged only after two checks (docs/protocol.md):
    * I1, the floor fence: the number is at or above the partition's GC floor (a stale view of
      the tail may point into numbers GC freed; such a write is an orphan nobody reads, and the
      batch is written again at the real tail);
    * I6, the topic fence (with a ``catalog``): the topic was live, as the incarnation written into
      the header, by a marker read less than TOPIC_FENCE_S before the put completed.
    """

    def __init__(
        self,
        storage: Storage,
        keys: Keys,
        topic: str,
        partition: int,
        producer_id: str | None,
        *,
        timeout_s: float = 60.0,
        max_attempts: int = 50,
        on_conflict: Callable[[], None] | None = None,
        catalog: TopicCatalog | None = None,
    ) -> None:
        self.storage = storage
        self.keys = keys
        self.topic = topic
        self.partition = partition
        self.producer_id = producer_id
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.on_conflict = on_conflict
        self.catalog = catalog
        self.fence = FenceView(storage, keys.segment_floor(topic, partition), SEGMENT_TRUST_S)
        self.next_seq: int | None = None
        self.next_offset = 0
        self.incarnation: str | None = None
        self.conflicts = 0
        self.orphans = 0

    async def _bind(self) -> str | None:
        """The topic incarnation to write for; a new one (re-created topic) resets the tail."""
        if self.catalog is None:
            return self.incarnation
        marker = await self.catalog.marker(self.topic)
        if marker.incarnation != self.incarnation:
            self.incarnation = marker.incarnation
            self.next_seq = None
        return self.incarnation

    async def start_at(self, seq: int, offset: int) -> None:
        """Start at a tail found moments ago (saves finding it again; a segment appended since is
        met by a 412 and passed like any rival's)."""
        await self._bind()
        self.next_seq, self.next_offset = seq, offset

    async def _find_tail(self) -> None:
        await self.fence.refresh()
        self.next_seq, self.next_offset = await find_tail(self.storage, self.keys, self.topic, self.partition)

    async def append(
        self, lines: list[bytes], batch_id: str, *, encode: Callable[[SegmentHeader], bytes] | None = None
    ) -> Appended:
        """Write ``lines`` as one segment at the tail; returns where it landed.

        ``encode`` (bulk writers with pre-encoded bodies, e.g. the Spark job commit) builds the
        object from the header this writer chose (seq, base, incarnation, batch id); then only
        ``len(lines)`` is used, as the segment's message count.
        """
        deadline = time.monotonic() + self.timeout_s
        attempt = 0
        while True:
            attempt += 1
            if attempt > self.max_attempts or (attempt > 1 and time.monotonic() >= deadline):
                raise PublishTimeout(
                    f"publish to {self.topic}/p{self.partition} not durable after {attempt - 1} attempts"
                )
            incarnation = await self._bind()
            if self.next_seq is None:
                await self._find_tail()
            assert self.next_seq is not None
            seq, base = self.next_seq, self.next_offset
            header = SegmentHeader(
                self.topic,
                self.partition,
                seq,
                len(lines),
                base,
                self.producer_id,
                time.time(),
                batch_id,
                incarnation=incarnation or None,
            )
            body = encode(header) if encode is not None else encode_segment(header, lines)
            key = self.keys.segment(self.topic, self.partition, seq)
            taken = False  # the number was already taken (412): blob is what is there now
            blob = None
            try:
                try:
                    await self.storage.create(key, body)
                except AlreadyExists:
                    taken = True
                    blob = await self.storage.get(key)
            except Contended:
                await asyncio.sleep(random.uniform(0.05, 0.3))
                continue
            except StorageError as exc:
                if time.monotonic() >= deadline:
                    raise PublishTimeout(
                        f"publish to {self.topic}/p{self.partition} not durable after {self.timeout_s:.0f}s: {exc}"
                    ) from exc
                await asyncio.sleep(retry_delay(attempt, random.uniform(*RETRY_JITTER)))
                continue
            if taken:
                there = (
                    taken_header(blob.data, self.topic, self.partition, seq, base)
                    if blob is not None
                    else None
                )
                if there is not None and there.batch == batch_id:
                    pass  # our own write landed; its response was lost: check it like a success
                else:
                    self.conflicts += 1
                    if self.on_conflict is not None:
                        self.on_conflict()
                    if there is not None:
                        self.next_seq, self.next_offset = seq + 1, there.base + there.count
                    else:  # taken, then freed (below the floor): find the real tail
                        self.next_seq = None
                    continue
            completed = time.monotonic()
            if not await self.fence.admits(
                seq, completed_at=completed
            ) and not await self._took_before_passed(key, seq, batch_id, blob):
                # I1: a freed number below the floor; the write is an orphan (GC deletes it)
                self.orphans += 1
                log.warning(
                    "%s/p%d: segment %d landed below the GC floor %d (stale tail); writing again at the tail",
                    self.topic,
                    self.partition,
                    seq,
                    self.fence.floor,
                )
                self.next_seq = None
                continue
            if self.catalog is not None and incarnation is not None:
                await self.catalog.confirm_live(self.topic, incarnation, completed)
            break
        self.next_seq, self.next_offset = seq + 1, base + len(lines)
        return Appended(seq, base, len(lines), len(body))

    async def _took_before_passed(self, key: str, seq: int, batch_id: str, blob: Blob | None) -> bool:
        """After a put of ``seq`` that the fence now covers: True when the put took the number
        before the fence passed it (readers saw it: writing it again would store the batch twice),
        False when it is an orphan in a freed number (write it again at the tail).

        A writer paused between its put landing and this look (SIGSTOP, a response held up past
        the trust window) meets a fence raised *because* readers consumed its segment; its own
        clock cannot tell that from a late put into a freed number, the store's can
        (:func:`~bucketq.core.fences.took_before_passed`). When the object is gone (collected) or
        the fence's history no longer tells, the outcome is unknown: the publish fails unacknowledged
        rather than risk storing the batch twice.
        """
        fence, modified = self.fence.value, self.fence.modified
        if fence.deleted or modified is None:
            return False
        if blob is None:
            blob = await self.storage.get(key)
        verdict: bool | None = None  # gone, or another writer's object there: nothing tells
        if blob is not None and taken_header(blob.data, self.topic, self.partition, seq, 0).batch == batch_id:
            verdict = took_before_passed(fence, modified, seq, blob.last_modified)
        if verdict is None:
            raise PublishTimeout(
                f"publish to {self.topic}/p{self.partition}: segment {seq} landed, but this writer saw it "
                f"only after GC's floor {fence.floor} had passed it and it can no longer tell whether "
                "readers had it; not acknowledged (a retry may store it twice unless it has a dedup id)"
            )
        if verdict:
            log.warning(
                "%s/p%d: segment %d was read and fenced while this writer was held up; kept (not written again)",
                self.topic,
                self.partition,
                seq,
            )
        return verdict

    async def write_head(self) -> None:
        """Overwrite the advisory head hint with this writer's view of the tail (errors ignored)."""
        if self.next_seq is None or self.next_seq == 0:
            return
        try:
            await self.storage.overwrite(
                self.keys.head(self.topic, self.partition), head_hint(self.next_seq - 1, self.next_offset)
            )
        except StorageError:
            pass  # advisory only
