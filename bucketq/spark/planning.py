"""Planning a read: a snapshot of the topic's transactions, then the listing, grouped into splits.

Visibility (docs/protocol.md, I17 and "Job commits"): the planner reads every transaction record of the
topic *before* it lists segments (:func:`~bucketq.core.txn.take_snapshot`). A segment that a
record committed in the snapshot names is shown; any other segment whose header names a
transaction is hidden (its record was pending, aborted or absent when the snapshot was taken,
or it is a duplicate copy); every other segment is shown. A transaction that commits while the
read is planned is therefore shown whole or hidden whole, and a pending one hides only its own
segments (finding: a pending transaction's ``start`` used to cut the partition, hiding part of
a committed one).

A committed reference segment (format 5) is planned as its chunks, straight from the record's
manifest (names, ETags, counts, time ranges): the executors GET only the chunks, a time-filtered
read skips chunks whose time range misses the window, and a big segment's chunks spread over
several splits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pyspark.sql.datasource import InputPartition

from bucketq.core.chunks import ChunkRef
from bucketq.core.foreign import skip_foreign
from bucketq.core.keys import Keys, seq_of
from bucketq.core.refsegment import load_segment
from bucketq.core.segment import decode_header
from bucketq.core.topics import TopicCatalog
from bucketq.core.txn import TxnSnapshot, take_snapshot
from bucketq.errors import TopicNotFound
from bucketq.spark.options import ReadConfig
from bucketq.storage import Storage

DLQ_PREFIX = "bucketq-dlq-"
Pos = tuple[int, int]  # (seq, index)


@dataclass(frozen=True, slots=True)
class SegmentRef:
    partition: int
    seq: int
    size: int


@dataclass(frozen=True, slots=True)
class SegmentItem:
    """A segment read whole (message lines). ``shown``: a job commit's segment that a committed
    record names (shown although its header names a transaction)."""

    partition: int
    seq: int
    size: int
    shown: bool = False


@dataclass(frozen=True, slots=True)
class ChunkItem:
    """One chunk of a committed reference segment: messages ``first .. first + count - 1`` of the
    segment at ``seq``, whose first message has offset ``base``."""

    partition: int
    seq: int
    base: int
    first: int
    ref: ChunkRef

    @property
    def size(self) -> int:
        return self.ref.bytes


Item = SegmentItem | ChunkItem


class SegmentSplit(InputPartition):
    """One Spark input partition: consecutive items, and the dead-lettered positions among them."""

    def __init__(self, index: int, items: list[Item], dead: dict[int, list[Pos]] | None = None):
        super().__init__(index)
        self.index = index
        self.items = items
        self.dead = dead or {}  # partition -> dead-lettered (seq, index)

    @property
    def partitions(self) -> set[int]:
        return {item.partition for item in self.items}

    def __repr__(self) -> str:
        return f"SegmentSplit({self.index}, {len(self.items)} items)"


@dataclass
class Plan:
    splits: list[SegmentSplit] = field(default_factory=list)
    segments: int = 0
    bytes: int = 0


async def topic_partitions(storage: Storage, keys: Keys, topic: str) -> int:
    """The topic's partition count (raises TopicNotFound)."""
    return (await TopicCatalog(storage, keys).config(topic)).partitions


async def list_segments(
    storage: Storage, keys: Keys, topic: str, partition: int, start: int, end: int | None
) -> list[SegmentRef]:
    """Segments of one partition with ``start <= seq < end``, in order (one LIST per 1000)."""
    after = keys.segment(topic, partition, start - 1) if start > 0 else None
    out = []
    async for info in storage.list(keys.segments_prefix(topic, partition), start_after=after):
        seq = seq_of(info.key, "jsonl")
        if seq is None:
            # not a name bucketq writes (I8): ``7.jsonl`` is no segment 7 (it would be read twice),
            # and ``README.txt`` sorts after the last segment, so it must not end the listing
            skip_foreign(info.key, f"{topic}/p{partition}: planning a Spark read")
            continue
        if end is not None and seq >= end:
            break
        out.append(SegmentRef(partition, seq, info.size))
    return out


def group(items: list[Item], target_bytes: int) -> list[list[Item]]:
    """Consecutive items packed into groups of about ``target_bytes``."""
    groups: list[list[Item]] = []
    current: list[Item] = []
    size = 0
    for item in items:
        if current and size + item.size > target_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(item)
        size += item.size
    if current:
        groups.append(current)
    return groups


def target_size(total: int, cfg: ReadConfig) -> int:
    return max(1, min(cfg.split_bytes, math.ceil(total / cfg.min_partitions)))


def selected_partitions(count: int, cfg: ReadConfig) -> list[int]:
    return [p for p in range(count) if cfg.partitions is None or p in cfg.partitions]


def overlaps(ref: ChunkRef, cfg: ReadConfig) -> bool:
    """Whether a chunk may hold messages of the read's time window (its min/max created_at)."""
    if cfg.since is not None:
        lo = round(cfg.since * 1_000_000)
        if ref.max_us < lo or (cfg.since_exclusive and ref.max_us == lo):
            return False
    if cfg.until is not None:
        hi = round(cfg.until * 1_000_000)
        if ref.min_us > hi or (not cfg.until_inclusive and ref.min_us == hi):
            return False
    return True


def plan_items(segments: list[SegmentRef], snapshot: TxnSnapshot, cfg: ReadConfig) -> list[Item]:
    """What to read of the listed segments, judged against ``snapshot`` (taken before listing)."""
    shown = snapshot.shown()
    items: list[Item] = []
    for s in segments:
        hit = shown.get((s.partition, s.seq))
        if hit is None:
            items.append(SegmentItem(s.partition, s.seq, s.size))  # hidden if its header names a txn
            continue
        record, index = hit
        entry = record.partitions[s.partition].chunks[index]
        if not entry.refs:
            items.append(SegmentItem(s.partition, s.seq, s.size, shown=True))
            continue
        first = 0
        for ref in entry.refs:
            if overlaps(ref, cfg):
                items.append(ChunkItem(s.partition, s.seq, entry.base or 0, first, ref))
            first += ref.count
    return items


async def plan_read(
    storage: Storage, keys: Keys, cfg: ReadConfig, ranges: dict[int, tuple[int, int | None]] | None = None
) -> Plan:
    """Splits for a batch read (``ranges`` None: the config's filters) or a stream micro-batch."""
    if ranges is None:
        count = await topic_partitions(storage, keys, cfg.topic)
        ranges = {p: (cfg.start_seq, cfg.end_seq) for p in selected_partitions(count, cfg)}
    snapshot = await take_snapshot(storage, keys, cfg.topic)  # before listing: see the module docstring
    segments: list[SegmentRef] = []
    for p, (start, end) in sorted(ranges.items()):
        if end is None or start < end:
            segments.extend(await list_segments(storage, keys, cfg.topic, p, start, end))
    items = plan_items(segments, snapshot, cfg)
    total = sum(i.size for i in items)
    dead = await dead_positions(storage, keys, cfg) if cfg.consumer and cfg.dead_letters else {}
    plan = Plan(segments=len(segments), bytes=total)
    for i, grp in enumerate(group(items, target_size(total, cfg))):
        wanted = {(item.partition, item.seq) for item in grp}
        split_dead: dict[int, list[Pos]] = {}
        for p, positions in dead.items():
            hits = [pos for pos in positions if (p, pos[0]) in wanted]
            if hits:
                split_dead[p] = hits
        plan.splits.append(SegmentSplit(i, grp, split_dead))
    return plan


async def dead_positions(storage: Storage, keys: Keys, cfg: ReadConfig) -> dict[int, set[Pos]]:
    """Positions of ``cfg.topic`` that ``cfg.consumer`` dead-lettered, from the dead-letter topic.

    The cursor state only counts dead letters; the copies in the dead-letter topic name their
    origin (``bucketq-dlq-source-topic``, ``-consumer``, ``-partition``, ``-position``).
    """
    catalog = TopicCatalog(storage, keys)
    config = await catalog.config(cfg.topic)
    dlq = config.dead_letter.topic or f"{cfg.topic}.dlq"
    try:
        partitions = (await catalog.config(dlq)).partitions
    except TopicNotFound:
        return {}
    out: dict[int, set[Pos]] = {}
    shown = (await take_snapshot(storage, keys, dlq, abort_expired=False)).shown()
    for p in range(partitions):
        for ref in await list_segments(storage, keys, dlq, p, 0, None):
            blob = await storage.get(keys.segment(dlq, p, ref.seq))
            if blob is None:
                continue
            if decode_header(blob.data).txn is not None and (p, ref.seq) not in shown:
                continue  # a redriven copy nobody committed is no dead letter
            for r in (await load_segment(storage, keys, blob.data)).records:
                h = r.headers
                if (
                    h.get(DLQ_PREFIX + "source-topic") != cfg.topic
                    or h.get(DLQ_PREFIX + "consumer") != cfg.consumer
                ):
                    continue
                try:
                    seq, idx = (int(x) for x in h[DLQ_PREFIX + "position"].split(":"))
                    out.setdefault(int(h[DLQ_PREFIX + "partition"]), set()).add((seq, idx))
                except (KeyError, ValueError):
                    continue
    return out
