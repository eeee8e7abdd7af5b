"""Reading messages without consuming them (``bucketq peek``, ``Bucketq.peek``).

Invariant: peeking writes nothing. It takes no lease, counts no delivery and creates no
subscription, so a message can be looked at any number of times without moving towards its
dead-letter limit. It reads exactly what a consumer would be offered: segments at or above the
partition's floor fence, of the topic's current incarnation, and only transactional segments whose
job committed them (a pending job's chunks stop the partition, as they stop consumers).

Where to start, per partition: the oldest message kept (default), a partition ``offset``, the
first message created at or after ``since`` (a Unix time), or a subscription's current window
(its floor). With a subscription, each message carries its state for it (``pending``,
``delayed``, ``in_flight`` or ``done``) and done messages are left out unless asked for.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from bucketq.core.cursor import CursorState
from bucketq.core.cursor_log import CursorLog
from bucketq.core.keys import Keys
from bucketq.core.refsegment import load_segment
from bucketq.core.segment import Record, Segment, decode_header
from bucketq.core.topics import TopicCatalog, find_tail, first_segment
from bucketq.core.txn import TxnResolver
from bucketq.errors import InvalidArgument
from bucketq.storage import Storage

PeekState = Literal["pending", "delayed", "in_flight", "done"]

# Whoever peeks does not own the partition: it never aborts an expired job (readers that do are
# consumers and the planner of a Spark read), it only skips what is not committed.
_MEMBER = "peek"


@dataclass(frozen=True, slots=True)
class PeekedMessage:
    """A stored message and where it sits; ``state`` is for the subscription peeked through."""

    topic: str
    partition: int
    seq: int
    index: int
    offset: int
    record: Record
    state: PeekState | None = None
    deliveries: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "seq": self.seq,
            "index": self.index,
            **self.record.to_json(),
        }
        if self.state is not None:
            out["state"] = self.state
            out["deliveries"] = self.deliveries
        return out


def state_of(state: CursorState, seq: int, index: int, now: float) -> PeekState:
    """A message's state for a subscription, from its cursor alone (no segment needed)."""
    pos = (seq, index)
    if state.is_done(pos):
        return "done"
    if state.live_lease(pos, now) is not None:
        return "in_flight"
    not_before = state.delayed.get(pos)
    if not_before is not None and not_before > now:
        return "delayed"
    return "pending"


async def peek(
    storage: Storage,
    keys: Keys,
    catalog: TopicCatalog,
    topic: str,
    *,
    limit: int = 10,
    partitions: list[int] | None = None,
    offset: int | None = None,
    since: float | None = None,
    consumer: str | None = None,
    include_done: bool = False,
) -> list[PeekedMessage]:
    """Up to ``limit`` messages of ``topic``, oldest first within each partition and merged across
    partitions by creation time. Raises TopicNotFound, BucketqError for a bad position and
    StorageError when the store fails."""
    if limit < 1:
        raise InvalidArgument(f"limit must be at least 1, got {limit}")
    if offset is not None and offset < 0:
        raise InvalidArgument(f"offset must be 0 or more, got {offset}")
    if offset is not None and since is not None:
        raise InvalidArgument("give a start offset or a start time, not both")
    marker = await catalog.marker(topic, fresh=True)
    count = marker.config.partitions
    chosen = sorted(set(partitions)) if partitions else list(range(count))
    for p in chosen:
        if not 0 <= p < count:
            raise InvalidArgument(f"topic {topic!r} has partitions 0..{count - 1}, not {p}")
    resolver = TxnResolver(storage, keys, topic, abort_expired=False)
    per_partition: list[list[PeekedMessage]] = []
    for p in chosen:
        state = None
        if consumer is not None:
            fence = catalog.fence(topic, marker.incarnation)  # another incarnation's objects: not its
            state = await CursorLog(
                storage, keys, topic, consumer, p, member=_MEMBER, topic_fence=fence
            ).load()
            if not state.started:
                raise InvalidArgument(
                    f"subscription {consumer!r} has not started on {topic!r} partition {p}: "
                    "nothing has consumed it yet (peek without --consumer to see the topic)"
                )
        start = await _start_seq(storage, keys, topic, p, offset, since, state)
        if start is None:
            continue
        found: list[PeekedMessage] = []
        now = time.time()
        async for segment in visible_segments(storage, keys, topic, p, start, marker.incarnation, resolver):
            h = segment.header
            for index, record in enumerate(segment.records):
                position = h.base + index
                if offset is not None and position < offset:
                    continue
                if since is not None and record.created_at < since:
                    continue
                label: PeekState | None = None
                deliveries = 0
                if state is not None:
                    label = state_of(state, h.seq, index, now)
                    if label == "done" and not include_done:
                        continue
                    deliveries = state.prior_deliveries((h.seq, index))
                found.append(PeekedMessage(topic, p, h.seq, index, position, record, label, deliveries))
                if len(found) >= limit:
                    break
            if len(found) >= limit:
                break
        per_partition.append(found)
    merged = heapq.merge(*per_partition, key=lambda m: (m.record.created_at, m.partition, m.offset))
    return [m for _, m in zip(range(limit), merged, strict=False)]


async def visible_segments(
    storage: Storage,
    keys: Keys,
    topic: str,
    partition: int,
    start: int,
    incarnation: str,
    resolver: TxnResolver,
) -> AsyncIterator[Segment]:
    """Segments a consumer is offered, from ``start`` up to the tail: other incarnations' and
    uncommitted jobs' segments are left out, and a pending job's chunk ends the walk."""
    seq = start
    while True:
        blob = await storage.get(keys.segment(topic, partition, seq))
        if blob is None:
            return
        h = decode_header(blob.data)
        seq += 1
        if h.incarnation is not None and h.incarnation != incarnation:
            continue  # written by a writer fenced off by the topic's deletion: never part of it
        verdict = await resolver.visibility(h)
        if verdict == "wait":
            return
        if verdict == "visible":
            yield await load_segment(storage, keys, blob.data)  # a reference segment's chunks too


async def _start_seq(
    storage: Storage,
    keys: Keys,
    topic: str,
    partition: int,
    offset: int | None,
    since: float | None,
    state: CursorState | None,
) -> int | None:
    """The first segment to read in ``partition`` (None: nothing to read there)."""
    if state is not None and offset is None and since is None:
        first = await first_segment(storage, keys, topic, partition)
        return None if first is None else max(first[0], state.floor)
    found = await segment_at(storage, keys, topic, partition, offset=offset, since=since)
    return None if found is None else found[0]


async def segment_at(
    storage: Storage,
    keys: Keys,
    topic: str,
    partition: int,
    *,
    offset: int | None = None,
    since: float | None = None,
) -> tuple[int, int] | None:
    """``(seq, base offset)`` of the stored segment holding partition ``offset``, or the first one
    that may hold messages created at or after ``since`` (Unix time); the oldest stored segment
    when neither is given. ``(tail seq, tail offset)`` when the position is past every stored
    message; None for an empty partition. O(log n) GETs (a binary search over sequence numbers).
    """
    first = await first_segment(storage, keys, topic, partition)
    if first is None:
        return None
    if offset is None and since is None:
        return first
    low = first[0]
    high, tail_offset = await find_tail(storage, keys, topic, partition)
    headers: dict[int, tuple[int, int, float]] = {}  # seq -> (base, count, created_at)

    async def header(seq: int) -> tuple[int, int, float] | None:
        if seq not in headers:
            blob = await storage.get(keys.segment(topic, partition, seq))
            if blob is None:  # freed while we looked
                return None
            h = decode_header(blob.data)
            headers[seq] = (h.base, h.count, h.created_at)
        return headers[seq]

    async def before(seq: int) -> bool:
        """Whether the segment at ``seq`` lies wholly before the requested position."""
        found = await header(seq)
        if found is None:
            return True
        base, count, created_at = found
        if offset is not None:
            return base + count <= offset
        assert since is not None
        # creation times rise with seq only roughly (clocks of many producers): the search lands
        # near the start, and readers filter messages by their own time
        return created_at < since

    lo, hi = low, high
    while lo < hi:
        mid = (lo + hi) // 2
        if await before(mid):
            lo = mid + 1
        else:
            hi = mid
    if since is not None and lo > low:
        lo -= 1  # the previous segment may still hold messages created after since
    if lo >= high:
        return high, tail_offset
    found = await header(lo)
    return (lo, found[0]) if found is not None else first
