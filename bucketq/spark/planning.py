"""Planning a read: list segments, group them into Spark input partitions by size."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pyspark.sql.datasource import InputPartition

from bucketq.core.keys import Keys, parse_seq
from bucketq.core.segment import decode_segment
from bucketq.core.topics import TopicCatalog
from bucketq.core.txn import TxnResolver, stable_limits
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


class SegmentSplit(InputPartition):
    """One Spark input partition: consecutive segments, and the dead-lettered positions among them."""

    def __init__(self, index: int, segments: list[tuple[int, int]], dead: dict[int, list[Pos]] | None = None):
        super().__init__(index)
        self.index = index
        self.segments = segments  # (partition, seq)
        self.dead = dead or {}  # partition -> dead-lettered (seq, index)

    def __repr__(self) -> str:
        return f"SegmentSplit({self.index}, {len(self.segments)} segments)"


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
        if not info.key.endswith(".jsonl"):
            continue
        seq = parse_seq(info.key)
        if end is not None and seq >= end:
            break
        out.append(SegmentRef(partition, seq, info.size))
    return out


def group(segments: list[SegmentRef], target_bytes: int) -> list[list[SegmentRef]]:
    """Consecutive segments packed into groups of about ``target_bytes``."""
    groups: list[list[SegmentRef]] = []
    current: list[SegmentRef] = []
    size = 0
    for seg in segments:
        if current and size + seg.size > target_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(seg)
        size += seg.size
    if current:
        groups.append(current)
    return groups


def target_size(total: int, cfg: ReadConfig) -> int:
    return max(1, min(cfg.split_bytes, math.ceil(total / cfg.min_partitions)))


def selected_partitions(count: int, cfg: ReadConfig) -> list[int]:
    return [p for p in range(count) if cfg.partitions is None or p in cfg.partitions]


async def plan_read(
    storage: Storage, keys: Keys, cfg: ReadConfig, ranges: dict[int, tuple[int, int | None]] | None = None
) -> Plan:
    """Splits for a batch read (``ranges`` None: the config's filters) or a stream micro-batch."""
    batch = ranges is None
    if ranges is None:
        count = await topic_partitions(storage, keys, cfg.topic)
        ranges = {p: (cfg.start_seq, cfg.end_seq) for p in selected_partitions(count, cfg)}
    segments: list[SegmentRef] = []
    for p, (start, end) in sorted(ranges.items()):
        if end is None or start < end:
            segments.extend(await list_segments(storage, keys, cfg.topic, p, start, end))
    if batch and segments:
        # Job commits: stop each partition below its first unresolved transaction (the limits are
        # read after the listing, so a transaction begun later starts above every listed segment).
        # A stream's offsets are already below these limits (stream.py).
        limits = await stable_limits(storage, keys, cfg.topic)
        segments = [s for s in segments if s.seq < limits.get(s.partition, s.seq + 1)]
    total = sum(s.size for s in segments)
    dead = await dead_positions(storage, keys, cfg) if cfg.consumer and cfg.dead_letters else {}
    plan = Plan(segments=len(segments), bytes=total)
    for i, grp in enumerate(group(segments, target_size(total, cfg))):
        refs = [(s.partition, s.seq) for s in grp]
        wanted = {(s.partition, s.seq) for s in grp}
        split_dead: dict[int, list[Pos]] = {}
        for p, positions in dead.items():
            hits = [pos for pos in positions if (p, pos[0]) in wanted]
            if hits:
                split_dead[p] = hits
        plan.splits.append(SegmentSplit(i, refs, split_dead))
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
    resolver = TxnResolver(storage, keys, dlq, abort_expired=False)
    for p in range(partitions):
        for ref in await list_segments(storage, keys, dlq, p, 0, None):
            blob = await storage.get(keys.segment(dlq, p, ref.seq))
            if blob is None:
                continue
            segment = decode_segment(blob.data)
            if await resolver.visibility(segment.header) != "visible":
                continue  # a redriven copy nobody committed is no dead letter
            for r in segment.records:
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
