"""Reading splits on executors: GET segments through the engine, decode, emit Arrow batches."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.types import StructType

from bucketq.core.cursor import CursorState
from bucketq.core.cursor_log import CursorLog
from bucketq.core.partition_worker import REDRIVE_FOR_HEADER
from bucketq.core.segment import Segment, decode_segment
from bucketq.core.txn import TxnResolver
from bucketq.spark.options import ReadConfig
from bucketq.spark.planning import Pos, SegmentSplit
from bucketq.spark.runtime import READ_STRATEGY, keys_of, paused_gc, settings_of
from bucketq.spark.schema import STATE_COLUMN, BatchBuilder
from bucketq.storage import Storage, open_storage

FETCH_CONCURRENCY = 16
BATCH_ROWS = 10_000


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
    for p in sorted(partitions):
        states[p] = await CursorLog(storage, keys, cfg.topic, cfg.consumer, p, member="spark").load()
    return states


async def _fetch(storage: Storage, cfg: ReadConfig, refs: list[tuple[int, int]]) -> list[Segment | None]:
    keys = keys_of(cfg.settings)

    async def one(p: int, seq: int) -> Segment | None:
        blob = await storage.get(keys.segment(cfg.topic, p, seq))
        return decode_segment(blob.data) if blob is not None else None  # None: removed by retention

    return list(await asyncio.gather(*(one(p, s) for p, s in refs)))


def read_split(cfg: ReadConfig, schema: StructType, split: SegmentSplit) -> Iterator[pa.RecordBatch]:
    """The split's messages as Arrow batches; storage clients live only inside this generator."""
    builder = BatchBuilder(schema, cfg.topic)
    with_state = STATE_COLUMN in schema.fieldNames()
    with asyncio.Runner() as runner, paused_gc():
        storage = runner.run(open_storage(settings_of(cfg.settings, strategy=READ_STRATEGY)))
        try:
            states: dict[int, CursorState] = {}
            if with_state:
                states = runner.run(_load_states(storage, cfg, {p for p, _ in split.segments}))
            dead = {p: set(pos) for p, pos in split.dead.items()}
            now = time.time()
            # job commits: executors only read records (the planner aborts expired transactions)
            txns = TxnResolver(storage, keys_of(cfg.settings), cfg.topic, abort_expired=False)
            stopped: set[int] = set()  # partitions that reached an unresolved transaction
            for start in range(0, len(split.segments), FETCH_CONCURRENCY):
                refs = split.segments[start : start + FETCH_CONCURRENCY]
                for segment in runner.run(_fetch(storage, cfg, refs)):
                    if segment is None or segment.header.partition in stopped:
                        continue
                    h = segment.header
                    if h.txn is not None:
                        verdict = runner.run(txns.visibility(h))
                        if verdict == "wait":  # not planned past one; if it happens, stop there
                            stopped.add(h.partition)
                        if verdict != "visible":
                            continue
                    keep = [i for i, r in enumerate(segment.records) if cfg.wants_time(r.created_at)]
                    if not keep:
                        continue
                    labels = None
                    if with_state:
                        st, dd = states.get(h.partition), dead.get(h.partition, set())
                        labels = [
                            label(st, (h.seq, i), dd, now, _skipped(segment, i, cfg.consumer)) for i in keep
                        ]
                    builder.add(segment, None if len(keep) == len(segment.records) else keep, labels)
                    if builder.rows >= BATCH_ROWS:
                        batch = builder.flush()
                        if batch is not None:
                            yield batch
            batch = builder.flush()
            if batch is not None:
                yield batch
        finally:
            runner.run(storage.close())
