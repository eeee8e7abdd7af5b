"""Write tasks: publish rows through the engine's producer into a private staging area.

Each task attempt gets its own root ``R/_spark/staging/{job}/{task}-{attempt}`` holding a copy of
the target topic's marker, so the engine's producer (group commit, key hashing, size limits)
writes real segments there, invisible to every consumer of the target topic. Only the job
commit (:mod:`bucketq.spark.commit`) moves them into the topic.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from bucketq.config import ProducerSettings
from bucketq.core.keys import Keys
from bucketq.core.models import DeadLetterConfig, TopicConfig
from bucketq.core.producer import Producer, PublishResult
from bucketq.core.topics import TopicCatalog
from bucketq.errors import BucketqError
from bucketq.spark.options import WriteConfig
from bucketq.spark.rows import RowMapper
from bucketq.spark.runtime import aborted_key, paused_gc, staging_root, storage_for
from bucketq.storage import Storage

WINDOW = 20_000  # publishes in flight per task


@dataclass
class TaskCommit(WriterCommitMessage):
    """What one successful task attempt staged: per partition, segments ``0 .. count-1``."""

    task: int
    root: str  # staging root of the attempt
    segments: dict[int, int] = field(default_factory=dict)  # partition -> staged segments
    messages: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


async def _stage(
    storage: Storage, cfg: WriteConfig, root: str, task: int, batches: Iterator[pa.RecordBatch], mapper: RowMapper
) -> tuple[dict[int, int], int]:
    """Publish every row into the staging root; returns (staged segments per partition, messages)."""
    keys = Keys(root)
    catalog = TopicCatalog(storage, keys)
    config = TopicConfig(
        partitions=cfg.partitions,
        max_message_bytes=cfg.max_message_bytes,
        dead_letter=DeadLetterConfig(enabled=False),
    )
    await catalog.create(cfg.topic, config)
    settings = ProducerSettings(
        linger_ms=50, max_batch_messages=cfg.batch_messages, max_batch_bytes=cfg.batch_bytes
    )
    # the name only seeds where unkeyed rows start: tasks start on different partitions
    producer = Producer(storage, keys, catalog, settings, producer_id=cfg.producer_id, name=f"spark-{task}")
    pending: list[asyncio.Task[PublishResult]] = []
    messages = 0
    try:
        for batch in batches:
            for record in mapper.records(batch):
                pending.append(asyncio.ensure_future(producer.publish_record(cfg.topic, record)))
                messages += 1
                if len(pending) >= WINDOW:
                    await asyncio.gather(*pending)
                    pending = []
        await asyncio.gather(*pending)
    except BaseException:
        for publish in pending:
            publish.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        raise
    finally:
        await producer.close()
    counts = {}
    for p in range(cfg.partitions):
        seq = producer.appender(cfg.topic, p).writer.next_seq
        if seq:
            counts[p] = seq
    return counts, messages


async def delete_prefix(storage: Storage, prefix: str) -> int:
    """Delete every object under ``prefix`` (batches of 1000); returns how many."""
    batch: list[str] = []
    deleted = 0
    async for info in storage.store.list(prefix):
        batch.append(info.key)
        if len(batch) >= 1000:
            await storage.delete(batch)
            deleted += len(batch)
            batch = []
    if batch:
        await storage.delete(batch)
        deleted += len(batch)
    return deleted


async def stage_task(
    cfg: WriteConfig, task: int, attempt: int, batches: Iterator[pa.RecordBatch], mapper: RowMapper
) -> TaskCommit:
    """Stage one task's rows; a failed attempt removes what it staged (best effort)."""
    started = time.monotonic()
    base = str(cfg.settings.get("root") or "")
    root = staging_root(base, cfg.job, f"t{task:05d}-a{attempt}")
    async with storage_for(cfg.settings) as storage:
        try:
            with paused_gc():
                counts, messages = await _stage(storage, cfg, root, task, batches, mapper)
            if await storage.head(aborted_key(base, cfg.job)) is not None:
                raise BucketqError(f"write job {cfg.job} was aborted while this task ran")
        except BaseException:
            try:
                await asyncio.shield(delete_prefix(storage, root + "/"))
            except Exception:
                pass  # the job commit or abort removes the whole job's staging area
            raise
        return TaskCommit(task, root, counts, messages, storage.stats.snapshot(), time.monotonic() - started)
