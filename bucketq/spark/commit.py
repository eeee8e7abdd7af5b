"""The job commit: append every staged segment to the topic, in task order, as whole segments.

Per target partition, the staged message lines of all successful tasks are concatenated (task
order, then staging order) and cut into segments of ``batchMessages``/``batchBytes``, each
written put-if-absent at the partition's tail exactly like the engine's producer does (412:
another producer took the seq, move on; our own batch id found there: a retried write landed).
Batch ids are derived from the job, so a commit retried after a lost response never duplicates.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from bucketq.core.keys import Keys
from bucketq.core.segment import decode_header
from bucketq.core.segment_writer import SegmentWriter
from bucketq.errors import StorageError
from bucketq.spark.options import WriteConfig
from bucketq.spark.runtime import aborted_key, job_report_key, keys_of, staging_root, storage_for
from bucketq.spark.staging import TaskCommit, delete_prefix
from bucketq.storage import Storage

PARALLEL_PARTITIONS = 8
PREFETCH = 4
MAX_ATTEMPTS = 50
DEADLINE_S = 120.0
ABORT_SWEEP_DELAY_S = 3.0  # longer than spark.python.task.killTimeout (2 s by default)


@dataclass
class PartitionReport:
    messages: int = 0
    segments: int = 0
    bytes: int = 0
    first_seq: int | None = None
    last_seq: int | None = None


@dataclass
class JobReport:
    """What a write job appended (also stored as ``R/_spark/jobs/{job}.json``)."""

    job: str
    topic: str
    tasks: int = 0
    messages: int = 0
    segments: int = 0
    bytes: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    partitions: dict[int, PartitionReport] = field(default_factory=dict)
    committed_at: float = 0.0
    task_seconds: float = 0.0  # the slowest task's staging time
    commit_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job, "topic": self.topic, "tasks": self.tasks, "messages": self.messages,
            "segments": self.segments, "bytes": self.bytes, "requests": self.requests,
            "requests_total": sum(self.requests.values()), "committed_at": self.committed_at,
            "task_seconds": round(self.task_seconds, 3), "commit_seconds": round(self.commit_seconds, 3),
            "partitions": {str(p): vars(r) for p, r in sorted(self.partitions.items())},
        }


class SegmentAppender:
    """Appends pre-encoded message lines to one partition as segments (one write in flight)."""

    def __init__(self, storage: Storage, keys: Keys, topic: str, partition: int, producer_id: str, batch: str):
        self.writer = SegmentWriter(
            storage, keys, topic, partition, producer_id, timeout_s=DEADLINE_S, max_attempts=MAX_ATTEMPTS
        )
        self.batch = batch
        self.report = PartitionReport()

    async def append(self, lines: list[bytes]) -> None:
        # batch ids derived from the job: a commit retried after a lost response finds its own segment
        landed = await self.writer.append(lines, f"{self.batch}-{self.report.segments}")
        r = self.report
        r.messages += landed.count
        r.segments += 1
        r.bytes += landed.size
        r.first_seq = landed.seq if r.first_seq is None else r.first_seq
        r.last_seq = landed.seq

    async def write_head(self) -> None:
        """The advisory head hint."""
        if self.report.last_seq is not None:
            await self.writer.write_head()


async def _staged_lines(
    storage: Storage, cfg: WriteConfig, partition: int, sources: list[tuple[str, int]]
) -> AsyncIterator[list[bytes]]:
    """Yield the message lines of each staged segment, prefetching a few segments ahead."""
    async def fetch(root: str, seq: int) -> list[bytes]:
        key = Keys(root).segment(cfg.topic, partition, seq)
        blob = await storage.get(key)
        if blob is None:
            raise StorageError(f"staged segment {key} is missing: was the staging area cleaned during the job?")
        header = decode_header(blob.data)
        lines = [line for line in blob.data.split(b"\n")[1:] if line]
        if len(lines) != header.count:
            raise StorageError(f"staged segment {key} is corrupt: {len(lines)} lines, header says {header.count}")
        return lines

    queue: list[asyncio.Task[list[bytes]]] = []
    try:
        for root, seq in sources:
            queue.append(asyncio.ensure_future(fetch(root, seq)))
            if len(queue) >= PREFETCH:
                yield await queue.pop(0)
        while queue:
            yield await queue.pop(0)
    finally:
        for task in queue:
            task.cancel()


async def _commit_partition(
    storage: Storage, cfg: WriteConfig, partition: int, sources: list[tuple[str, int]]
) -> PartitionReport:
    appender = SegmentAppender(
        storage, keys_of(cfg.settings), cfg.topic, partition, cfg.producer_id, f"spark-{cfg.job}-{partition}"
    )
    lines: list[bytes] = []
    size = 0
    async for staged in _staged_lines(storage, cfg, partition, sources):
        for line in staged:
            if lines and (len(lines) >= cfg.batch_messages or size + len(line) + 1 > cfg.batch_bytes):
                await appender.append(lines)
                lines, size = [], 0
            lines.append(line)
            size += len(line) + 1
    if lines:
        await appender.append(lines)
    await appender.write_head()
    return appender.report


async def commit_job(cfg: WriteConfig, messages: list[TaskCommit | None]) -> JobReport:
    """Append the staged segments of every successful task, then remove the staging area."""
    started = time.monotonic()
    done = sorted((m for m in messages if m is not None), key=lambda m: m.task)
    report = JobReport(cfg.job, cfg.topic, tasks=len(done), task_seconds=max((m.seconds for m in done), default=0.0))
    for m in done:
        for op, n in m.requests.items():
            report.requests[op] = report.requests.get(op, 0) + n
    root = str(cfg.settings.get("root") or "")
    async with storage_for(cfg.settings) as storage:
        limit = asyncio.Semaphore(PARALLEL_PARTITIONS)

        async def one(p: int) -> tuple[int, PartitionReport]:
            sources = [(m.root, seq) for m in done for seq in range(m.segments.get(p, 0))]
            async with limit:
                return p, await _commit_partition(storage, cfg, p, sources)

        wanted = sorted({p for m in done for p in m.segments})
        for p, part in await asyncio.gather(*(one(p) for p in wanted)):
            report.partitions[p] = part
            report.messages += part.messages
            report.segments += part.segments
            report.bytes += part.bytes
        await delete_prefix(storage, staging_root(root, cfg.job) + "/")
        report.committed_at = time.time()
        report.commit_seconds = time.monotonic() - started
        for op, n in storage.stats.snapshot().items():
            report.requests[op] = report.requests.get(op, 0) + n
        body = json.dumps(report.to_json()).encode()
        await storage.overwrite(job_report_key(root, cfg.job), body)
    return report


async def abort_job(cfg: WriteConfig) -> None:
    """Remove everything the job staged: nothing of it was ever visible in the topic.

    Tasks still running when Spark aborts either finish and see the abort marker (then remove
    their own staging), or are killed within Spark's task kill timeout: a second sweep after
    :data:`ABORT_SWEEP_DELAY_S` removes what they wrote before dying.
    """
    root = str(cfg.settings.get("root") or "")
    prefix = staging_root(root, cfg.job) + "/"
    async with storage_for(cfg.settings) as storage:
        await storage.overwrite(aborted_key(root, cfg.job), json.dumps({"at": time.time()}).encode())
        await delete_prefix(storage, prefix)
        await asyncio.sleep(ABORT_SWEEP_DELAY_S)
        await delete_prefix(storage, prefix)


async def read_report(settings: dict[str, Any], job: str) -> dict[str, Any] | None:
    """The stored report of a committed write job, or None."""
    async with storage_for(settings) as storage:
        blob = await storage.get(job_report_key(str(settings.get("root") or ""), job))
    return json.loads(blob.data) if blob is not None else None
