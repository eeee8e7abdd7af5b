"""Reading splits on executors: GET the planned chunks and segments, emit Arrow batches.

Chunks of committed reference segments are decoded by Arrow (only the columns the read needs)
and turned into the read's batch by kernels (:mod:`bucketq.spark.columns`). Ordinary segments
(message lines) are decoded message by message. A segment whose header names a transaction is
shown only when the plan says its committed record names it (:mod:`bucketq.spark.planning`).

The storage clients run on a plain event loop made for the split. ``asyncio.Runner`` (and
``asyncio.run``) would wrap every call in its Ctrl-C handling, which on Python 3.11 formats the
finished task's result into a message: the ``repr`` of every decoded segment, 16% of a read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.types import StructType

from bucketq.core.chunks import Chunk, CorruptChunk, decode_chunk
from bucketq.core.cursor import CursorState
from bucketq.core.cursor_log import CursorLog
from bucketq.core.partition_worker import REDRIVE_FOR_HEADER
from bucketq.core.refsegment import fetch_chunk
from bucketq.core.segment import Segment, decode_header, decode_segment
from bucketq.core.topics import TopicCatalog
from bucketq.spark.columns import chunk_batch, chunk_columns
from bucketq.spark.options import ReadConfig
from bucketq.spark.planning import ChunkItem, Pos, SegmentItem, SegmentSplit
from bucketq.spark.runtime import READ_STRATEGY, keys_of, paused_gc, settings_of
from bucketq.spark.schema import STATE_COLUMN, BatchBuilder, arrow_schema
from bucketq.storage import Storage, open_storage

FETCH_CONCURRENCY = 16
BATCH_ROWS = 10_000
T = TypeVar("T")


def label(state: CursorState | None, pos: Pos, dead: set[Pos], now: float, skipped: bool = False) -> str:
    """A message's state for a consumer: pending, in_flight, acked or dead.

    ``acked`` is every other done position: acknowledged, skipped (a redrive meant for another
    consumer: ``skipped`` tells so for segments the cursor has not seen yet) or older than the
    subscription's start.
    """
    if state is None or not state.started:
        return "pending"
    if pos[0] > state.frontier and skipped:
        return "acked"
    if state.is_done(pos):
        return "dead" if pos in dead else "acked"
    if state.live_lease(pos, now) is not None:
        return "in_flight"
    return "pending"


def _skipped(segment: Segment, index: int, consumer: str | None) -> bool:
    """Whether the consumer skips this message: a redrive meant for another consumer."""
    target = segment.records[index].headers.get(REDRIVE_FOR_HEADER)
    return target is not None and target != consumer


async def _load_states(storage: Storage, cfg: ReadConfig, partitions: set[int]) -> dict[int, CursorState]:
    keys = keys_of(cfg.settings)
    assert cfg.consumer is not None
    states = {}
    catalog = TopicCatalog(storage, keys)
    # I6: cursor objects another incarnation of the topic left are passed over, as consumers do
    fence = catalog.fence(cfg.topic, (await catalog.marker(cfg.topic)).incarnation)
    for p in sorted(partitions):
        cursor = CursorLog(storage, keys, cfg.topic, cfg.consumer, p, member="spark", topic_fence=fence)
        states[p] = await cursor.load()
    return states


async def _fetch(storage: Storage, cfg: ReadConfig, items: list[Any], columns: list[str]) -> list[Any]:
    """Each item's content: a decoded segment, a decoded chunk, or None (removed by retention)."""
    keys = keys_of(cfg.settings)

    async def one(item: Any) -> Segment | Chunk | None:
        if isinstance(item, ChunkItem):
            try:
                data = await fetch_chunk(storage, keys, cfg.topic, item.ref)
            except CorruptChunk:
                # removed by retention with its reference segment since the plan: skipped like a
                # collected segment; gone while its segment is still there: refused
                if await storage.head(keys.segment(cfg.topic, item.partition, item.seq)) is None:
                    return None
                raise
            return decode_chunk(data, columns, what=f"chunk {item.ref.name}")
        blob = await storage.get(keys.segment(cfg.topic, item.partition, item.seq))
        if blob is None:
            return None  # removed by retention
        if decode_header(blob.data).txn is not None and not item.shown:
            return None  # a transaction not committed when the read was planned: hidden
        return decode_segment(blob.data)

    return list(await asyncio.gather(*(one(i) for i in items)))


class _Loop:
    """A plain event loop for one split (see the module docstring)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, awaitable: Awaitable[T]) -> T:
        return self.loop.run_until_complete(awaitable)

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()


def read_split(cfg: ReadConfig, schema: StructType, split: SegmentSplit) -> Iterator[pa.RecordBatch]:
    """The split's messages as Arrow batches; storage clients live only inside this generator."""
    builder = BatchBuilder(schema, cfg.topic)
    target = arrow_schema(schema)
    with_state = STATE_COLUMN in schema.fieldNames()
    columns = chunk_columns(schema.fieldNames(), cfg)
    loop = _Loop()
    with paused_gc(any(isinstance(i, SegmentItem) for i in split.items)):
        storage = loop.run(open_storage(settings_of(cfg.settings, strategy=READ_STRATEGY)))
        try:
            states: dict[int, CursorState] = {}
            if with_state:
                states = loop.run(_load_states(storage, cfg, split.partitions))
            dead = {p: set(pos) for p, pos in split.dead.items()}
            now = time.time()
            for start in range(0, len(split.items), FETCH_CONCURRENCY):
                items = split.items[start : start + FETCH_CONCURRENCY]
                for item, content in zip(items, loop.run(_fetch(storage, cfg, items, columns)), strict=True):
                    if content is None:
                        continue
                    st, dd = states.get(item.partition), dead.get(item.partition, set())
                    if isinstance(content, Chunk):
                        assert isinstance(item, ChunkItem)

                        def labels(
                            idx: list[int],
                            skipped: list[bool],
                            seq: int = item.seq,
                            st: CursorState | None = st,
                            dd: set[Pos] = dd,
                        ) -> list[str]:
                            return [
                                label(st, (seq, i), dd, now, s) for i, s in zip(idx, skipped, strict=True)
                            ]

                        batch = chunk_batch(
                            content, item, target, cfg.topic, cfg, labels if with_state else None
                        )
                        if batch is not None and batch.num_rows:
                            pending = builder.flush()
                            if pending is not None:
                                yield pending
                            yield batch
                        continue
                    assert isinstance(item, SegmentItem)
                    segment = content
                    keep = [i for i, r in enumerate(segment.records) if cfg.wants_time(r.created_at)]
                    if not keep:
                        continue
                    states_of = None
                    if with_state:
                        states_of = [
                            label(st, (segment.header.seq, i), dd, now, _skipped(segment, i, cfg.consumer))
                            for i in keep
                        ]
                    builder.add(segment, None if len(keep) == len(segment.records) else keep, states_of)
                    if builder.rows >= BATCH_ROWS:
                        batch = builder.flush()
                        if batch is not None:
                            yield batch
            batch = builder.flush()
            if batch is not None:
                yield batch
        finally:
            try:
                loop.run(storage.close())
            finally:
                loop.close()
