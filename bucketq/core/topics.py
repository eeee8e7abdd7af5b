"""Topics: markers with their config, partition tails, and purge."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ValidationError

from bucketq.core.fences import FenceValue, raise_fence, read_fence
from bucketq.core.foreign import skip_foreign
from bucketq.core.ids import token
from bucketq.core.keys import Keys, seq_of, validate_name
from bucketq.core.models import TopicConfig, TopicMarker
from bucketq.core.segment import taken_header
from bucketq.errors import (
    AlreadyExists,
    BucketqError,
    Contended,
    InvalidArgument,
    InvalidName,
    TopicDeleted,
    TopicNotFound,
)
from bucketq.storage import Storage

# How long a topic's config is served from the cache (partitions, dead-lettering, limits). Longer
# than the deletion's wait below, so a cached marker is never the evidence that a topic still
# exists: every write that a deletion must stop goes through the topic fence instead.
CONFIG_TTL_S = 10.0
# Topic fence (invariant I6): a write into a topic (a segment, a cursor delta or checkpoint) is
# acknowledged only if the writer read the topic's marker, live and of the same incarnation, less
# than TOPIC_FENCE_S before the write completed; a cursor write is also started only with such a
# copy. Deleting a topic marks it "deleting" and waits longer than that before purging, so every
# acknowledged write landed before the purge started, and no write is acknowledged after it.
TOPIC_FENCE_S = 5.0
TOPIC_DELETE_WAIT_S = TOPIC_FENCE_S + 2.0


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    next_seq: int  # sequence number the next segment will get
    next_offset: int  # offset the next message will get (= messages ever written)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic's description: config, partitions' tails and subscriptions."""

    name: str
    config: TopicConfig
    created_at: float
    partitions: list[PartitionInfo] = field(default_factory=list)
    consumers: list[str] = field(default_factory=list)

    @property
    def messages(self) -> int:
        return sum(p.next_offset for p in self.partitions)


async def find_tail(storage: Storage, keys: Keys, topic: str, partition: int) -> tuple[int, int]:
    """(next seq, next offset) of a partition: the GC fence and the head hint, then GETs forward
    until a 404.

    Numbers below the partition's floor fence may have been freed by GC, so probing never starts
    below it (a stale head hint would otherwise point into freed numbers). A 404 at or above the
    floor is the tail: GC never frees numbers at or above the floor.
    """
    fence, _ = await read_fence(storage, keys.segment_floor(topic, partition))
    seq, offset = (fence.floor, fence.base) if fence is not None else (0, 0)
    hint = await storage.get(keys.head(topic, partition))
    if hint is not None:
        try:
            obj = json.loads(hint.data)
            hinted = int(obj["seq"]) + 1, int(obj["next_offset"])
        except (ValueError, KeyError, TypeError):
            hint = None
        else:
            if hinted[0] > seq:
                seq, offset = hinted
    if hint is None:  # no hint: the last segment key tells where to start probing
        last: tuple[str, int] | None = None
        async for info in storage.list(keys.segments_prefix(topic, partition)):
            n = seq_of(info.key, "jsonl")
            if n is None:  # a foreign name may sort after every segment (README.txt): not the tail
                skip_foreign(info.key, f"{topic}/p{partition}: finding the tail")
                continue
            last = (info.key, n)
        if last is not None and last[1] >= seq:
            blob = await storage.get(last[0])
            if blob is not None:
                header = taken_header(blob.data, topic, partition, last[1], -1)
                if header.base >= 0:  # an undecodable last object says nothing: probe from the hint
                    seq, offset = header.seq + 1, header.base + header.count
    while True:
        blob = await storage.get(keys.segment(topic, partition, seq))
        if blob is None:
            return seq, offset
        header = taken_header(blob.data, topic, partition, seq, offset)
        seq, offset = seq + 1, header.base + header.count


async def first_segment(storage: Storage, keys: Keys, topic: str, partition: int) -> tuple[int, int] | None:
    """(seq, base offset) of the oldest segment still kept, or None for an empty partition.

    Objects below the floor fence are freed or orphans (never part of the partition): skipped.
    """
    fence, _ = await read_fence(storage, keys.segment_floor(topic, partition))
    floor = fence.floor if fence is not None else 0
    start_after = keys.segment(topic, partition, floor - 1) if floor > 0 else None
    async for info in storage.list(keys.segments_prefix(topic, partition), start_after=start_after):
        n = seq_of(info.key, "jsonl")
        if n is None:  # a foreign name may sort before every segment (.keep): not the oldest
            skip_foreign(info.key, f"{topic}/p{partition}: finding the oldest segment")
            continue
        blob = await storage.get(info.key)
        if blob is not None:
            header = taken_header(blob.data, topic, partition, n, -1)
            if header.base >= 0:
                return header.seq, header.base
    if fence is not None and fence.floor > 0:
        return fence.floor, fence.base
    return None


@dataclass(frozen=True, slots=True)
class TopicFence:
    """The topic fence (I6) of one incarnation of a topic, for a writer of its objects.

    ``confirm(at)`` returns only if the topic was live, as ``incarnation``, by a marker read less
    than TOPIC_FENCE_S before ``at`` (monotonic), re-reading the marker when the cached copy is
    older; otherwise it raises :class:`TopicDeleted`. A writer confirms before a write (so it
    does not even start one into a topic being deleted, or into a purged prefix a new incarnation
    now uses) and after it, with the time the write completed (so a write that took too long, a
    paused writer, is not acknowledged: it may have landed after the purge). Readers use
    ``incarnation`` to refuse objects another incarnation wrote.
    """

    catalog: TopicCatalog
    topic: str
    incarnation: str

    async def confirm(self, at: float) -> None:
        await self.catalog.confirm_live(self.topic, self.incarnation, at)


class TopicCatalog:
    """Reads and writes topic markers; caches configs briefly for the hot path."""

    def __init__(self, storage: Storage, keys: Keys) -> None:
        self.storage = storage
        self.keys = keys
        self._cache: dict[str, tuple[float, TopicMarker]] = {}  # monotonic read start, marker
        self._loading: dict[str, asyncio.Future[TopicMarker]] = {}
        self._loading_since: dict[str, float] = {}  # monotonic start of the GET in _loading

    def fence(self, topic: str, incarnation: str) -> TopicFence:
        """The topic fence of ``topic`` as ``incarnation`` (see :class:`TopicFence`)."""
        return TopicFence(self, topic, incarnation)

    async def marker(self, topic: str, *, fresh: bool = False) -> TopicMarker:
        """The topic's marker, cached for a few seconds; concurrent misses share one GET."""
        validate_name(topic)
        cached = self._cache.get(topic)
        if cached is not None and not fresh and time.monotonic() - cached[0] < CONFIG_TTL_S:
            if cached[1].state != "live":
                raise TopicDeleted(topic, "it is being deleted")
            return cached[1]
        return await self._read(topic, None if not fresh else time.monotonic())

    async def _read(self, topic: str, not_before: float | None) -> TopicMarker:
        """GET the marker; callers that arrive while a GET is under way share it, if it started
        after ``not_before`` (monotonic; None: any) — a fresh read needs a fresh start."""
        loading = self._loading.get(topic)
        if loading is not None and (not_before is None or self._loading_since[topic] > not_before):
            return await asyncio.shield(loading)
        future: asyncio.Future[TopicMarker] = asyncio.get_running_loop().create_future()
        self._loading[topic] = future
        self._loading_since[topic] = time.monotonic()
        try:
            marker = await self._load(topic)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters get it re-raised
            raise
        else:
            future.set_result(marker)
            return marker
        finally:
            if self._loading.get(topic) is future:
                del self._loading[topic]
                del self._loading_since[topic]

    async def _load(self, topic: str) -> TopicMarker:
        started = time.monotonic()
        blob = await self.storage.get(self.keys.topic_marker(topic))
        if blob is None:
            self._cache.pop(topic, None)
            raise TopicNotFound(topic)
        try:
            marker = TopicMarker.model_validate_json(blob.data)
        except ValidationError as exc:
            raise BucketqError(f"topic {topic!r} has a corrupt marker: {exc}") from None
        self._cache[topic] = (started, marker)
        if marker.state != "live":
            raise TopicDeleted(topic, "it is being deleted")
        return marker

    async def config(self, topic: str) -> TopicConfig:
        return (await self.marker(topic)).config

    async def confirm_live(self, topic: str, incarnation: str, completed_at: float) -> None:
        """Raise TopicDeleted unless the topic was live, as ``incarnation``, by a marker read less
        than TOPIC_FENCE_S before ``completed_at`` (monotonic): the topic fence of a write.

        Concurrent writers whose copy is too old share one GET (any GET that started after the
        copy went stale is recent enough for all of them)."""
        cached = self._cache.get(topic)
        if cached is None or completed_at - cached[0] >= TOPIC_FENCE_S:
            try:
                await self._read(topic, completed_at - TOPIC_FENCE_S)
            except TopicNotFound:
                raise TopicDeleted(topic, "it was deleted") from None
            cached = self._cache[topic]
        marker = cached[1]
        if marker.state != "live":
            raise TopicDeleted(topic, "it is being deleted")
        if marker.incarnation != incarnation:
            raise TopicDeleted(topic, "it was deleted and created again")

    async def exists(self, topic: str) -> bool:
        try:
            await self.marker(topic, fresh=True)
        except TopicNotFound:
            return False
        return True

    async def create(self, topic: str, config: TopicConfig | None = None) -> tuple[TopicMarker, bool]:
        """Create the topic (put-if-absent). Returns (marker, created); an existing topic is kept as is."""
        validate_name(topic)
        config = config or TopicConfig()
        now = time.time()
        marker = TopicMarker(name=topic, created_at=now, updated_at=now, config=config, incarnation=token())
        started = time.monotonic()
        try:
            await self.storage.create(self.keys.topic_marker(topic), marker.model_dump_json().encode())
        except (AlreadyExists, Contended):
            return await self.marker(topic, fresh=True), False
        self._cache[topic] = (started, marker)
        return marker, True

    async def update(self, topic: str, config: TopicConfig) -> TopicMarker:
        """Overwrite the topic's config. Partitions may only grow."""
        current = await self.marker(topic, fresh=True)
        if config.partitions < current.config.partitions:
            raise InvalidArgument(
                f"topic {topic!r} has {current.config.partitions} partitions; partitions may only grow "
                f"(asked for {config.partitions})"
            )
        marker = current.model_copy(update={"config": config, "updated_at": time.time()})
        started = time.monotonic()
        await self.storage.overwrite(self.keys.topic_marker(topic), marker.model_dump_json().encode())
        self._cache[topic] = (started, marker)
        return marker

    async def names(self) -> list[str]:
        """Every topic with a marker, sorted."""
        names = []
        for prefix in await self.storage.list_prefixes(self.keys.topics_prefix()):
            name = prefix[len(self.keys.topics_prefix()) :].rstrip("/")
            if name.startswith("_"):
                continue
            blob = await self.storage.get(self.keys.topic_marker(name))
            if blob is not None and b'"deleting"' not in blob.data:
                names.append(name)
        return sorted(names)

    async def consumers(self, topic: str, *, foreign: Callable[[str, str], None] = skip_foreign) -> list[str]:
        """Consumers that have a subscription on the topic. A folder under ``subs/`` whose name no
        consumer can have is foreign: passed to ``foreign`` (key, what the listing was for)."""
        prefix = self.keys.subs_prefix(topic)
        out = []
        for found in await self.storage.list_prefixes(prefix):
            name = found[len(prefix) :].rstrip("/")
            try:
                out.append(validate_name(name, "consumer"))
            except InvalidName:
                foreign(found, f"{topic}: listing subscriptions")
        return sorted(out)

    async def describe(self, topic: str) -> TopicInfo:
        marker = await self.marker(topic, fresh=True)
        parts = []
        for p in range(marker.config.partitions):
            seq, offset = await find_tail(self.storage, self.keys, topic, p)
            parts.append(PartitionInfo(p, seq, offset))
        return TopicInfo(topic, marker.config, marker.created_at, parts, await self.consumers(topic))

    async def delete(
        self,
        topic: str,
        *,
        purge: bool = True,
        fence_wait_s: float = TOPIC_DELETE_WAIT_S,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete the topic; with purge, every object under it. Returns the number of objects deleted.

        1. The marker is overwritten ``deleting``: from then on no publish is acknowledged
           (writers confirm the marker after each write, see ``confirm_live``).
        2. Wait ``fence_wait_s`` (longer than the writers' TOPIC_FENCE_S): every write
           acknowledged before step 1 has landed by then.
        3. Each partition's floor fence becomes a tombstone at its tail: a re-created topic
           continues the sequence numbers, so a write paused across the deletion can never take
           a number of the new topic's log (invariant I1 across incarnations).
        4. Purge everything else, then remove the marker.

        A deletion interrupted anywhere is completed by deleting again (the marker stays
        ``deleting`` until the end). Without purge, only the marker goes (data stays for tools).
        ``progress`` is called with the number of objects of each batch deleted.
        """
        validate_name(topic)
        marker_key = self.keys.topic_marker(topic)
        blob = await self.storage.get(marker_key)
        if blob is None:
            raise TopicNotFound(topic)
        try:
            marker = TopicMarker.model_validate_json(blob.data)
        except ValidationError:
            marker = None
        if marker is not None and marker.state != "deleting":
            doomed = marker.model_copy(update={"state": "deleting", "updated_at": time.time()})
            await self.storage.overwrite(marker_key, doomed.model_dump_json().encode())
            await asyncio.sleep(fence_wait_s)
        self._cache.pop(topic, None)
        deleted = 0
        if purge:
            partitions = marker.config.partitions if marker is not None else 0
            for p in range(partitions):
                seq, offset = await find_tail(self.storage, self.keys, topic, p)
                await raise_fence(
                    self.storage,
                    self.keys.segment_floor(topic, p),
                    FenceValue(seq, offset, time.time(), deleted=True),
                )
            keep = {self.keys.segment_floor(topic, p) for p in range(partitions)}
            keep.add(marker_key)
            for prefix in (self.keys.topic_prefix(topic), self.keys.members_topic_prefix(topic)):
                batch: list[str] = []
                async for info in self.storage.list(prefix):
                    if info.key in keep or info.key.endswith("/floor.json"):
                        continue
                    batch.append(info.key)
                    if len(batch) >= 1000:
                        await self.storage.delete(batch)
                        deleted += len(batch)
                        if progress is not None:
                            progress(len(batch))
                        batch = []
                if batch:
                    await self.storage.delete(batch)
                    deleted += len(batch)
                    if progress is not None:
                        progress(len(batch))
        await self.storage.delete([marker_key])
        return deleted + 1
