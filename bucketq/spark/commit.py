"""The job commit: one transaction per commit attempt (docs/protocol.md, "Job commits").

1. **Begin.** The driver settles what earlier runs of the same ``jobId`` left (a committed
   transaction: nothing to do; a pending one: aborted, unless :func:`prepare_job` finished it
   first) and writes the transaction record ``{job}.{n}`` put-if-absent as ``pending``, with the
   manifest: per partition its tail (``start``) and the staged chunks in task order.
2. **Append.** Per partition (8 at a time), each staged chunk becomes one segment at the tail,
   put-if-absent, its header naming the transaction and the chunk. The message lines are copied
   as staged (inflated when the topic gets plain segments): only the header line changes.
3. **Commit.** The record is overwritten ``committed`` (If-Match on the pending ETag) with the
   seq of every chunk. Readers show a transaction's segments from that moment on, all at once.

Any failure before step 3 aborts the record (If-Match): nothing of the job is ever visible, and
the segments already appended are skipped by every reader. A committer that dies leaves the
record pending: readers stop at its ``start`` until the job is run again (which finishes the
commit from the same staged chunks, or aborts it) or the record's timeout passes (anyone may then
abort it). So a ``jobId`` commits at most once: running it again after success is a no-op that
returns the first run's report.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from bucketq.core.keys import Keys
from bucketq.core.segment import decode_header, encode_header, segment_lines
from bucketq.core.segment_writer import SegmentWriter
from bucketq.core.topics import TopicCatalog, find_tail
from bucketq.core.txn import (
    Chunk,
    TxnError,
    TxnPartition,
    TxnRecord,
    abort_txn,
    create_txn,
    list_txns,
    parse_txn_id,
    read_all,
    rewrite_txn,
    txn_id,
)
from bucketq.core.wake import touch_wake
from bucketq.errors import AlreadyExists, StorageError
from bucketq.spark.options import WriteConfig
from bucketq.spark.runtime import keys_of, storage_for
from bucketq.spark.staging import TaskCommit, delete_prefix
from bucketq.storage import Storage

log = logging.getLogger("bucketq.spark")

PARALLEL_PARTITIONS = 8
PREFETCH = 4
MAX_ATTEMPTS = 50
COMMIT_MARGIN_S = 5.0  # an append gives up this long before the transaction could be aborted
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
    txn: str = ""
    tasks: int = 0
    messages: int = 0
    segments: int = 0
    bytes: int = 0
    payload_bytes: int = 0  # message lines before compression
    requests: dict[str, int] = field(default_factory=dict)
    partitions: dict[int, PartitionReport] = field(default_factory=dict)
    committed_at: float = 0.0
    task_seconds: float = 0.0  # the slowest task's staging time
    commit_seconds: float = 0.0
    recovered: bool = False  # finished the commit of an earlier run that died

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "topic": self.topic,
            "txn": self.txn,
            "tasks": self.tasks,
            "messages": self.messages,
            "segments": self.segments,
            "bytes": self.bytes,
            "payload_bytes": self.payload_bytes,
            "requests": self.requests,
            "requests_total": sum(self.requests.values()),
            "committed_at": self.committed_at,
            "task_seconds": round(self.task_seconds, 3),
            "commit_seconds": round(self.commit_seconds, 3),
            "recovered": self.recovered,
            "partitions": {str(p): vars(r) for p, r in sorted(self.partitions.items())},
        }


def _report_of(record: TxnRecord) -> dict[str, Any]:
    """A job report rebuilt from a committed record (its ``info`` holds the committer's report)."""
    if record.info.get("report"):
        return dict(record.info["report"])
    report = JobReport(
        record.job, record.topic, record.id, messages=record.messages, committed_at=record.updated_at
    )
    for p, part in record.partitions.items():
        seqs = [c.seq for c in part.chunks if c.seq is not None]
        report.partitions[p] = PartitionReport(
            part.messages,
            len(part.chunks),
            sum(c.bytes for c in part.chunks),
            min(seqs, default=None),
            max(seqs, default=None),
        )
        report.segments += len(part.chunks)
        report.bytes += sum(c.bytes for c in part.chunks)
    return report.to_json()


# -- appending the chunks --------------------------------------------------------------------------


async def _staged(
    storage: Storage, chunks: list[tuple[int, Chunk]]
) -> AsyncIterator[tuple[int, Chunk, bytes]]:
    """The staged objects of ``chunks`` in order, a few fetched ahead."""

    async def fetch(chunk: Chunk) -> bytes:
        blob = await storage.get(chunk.src)
        if blob is None:
            raise StorageError(
                f"staged chunk {chunk.src} is missing: was the staging area removed during the job?"
            )
        if len(blob.data) != chunk.bytes:
            raise StorageError(
                f"staged chunk {chunk.src} has {len(blob.data)} bytes, the task wrote {chunk.bytes}"
            )
        return blob.data

    queue: list[tuple[int, Chunk, asyncio.Task[bytes]]] = []
    try:
        for index, chunk in chunks:
            queue.append((index, chunk, asyncio.ensure_future(fetch(chunk))))
            if len(queue) >= PREFETCH:
                i, c, task = queue.pop(0)
                yield i, c, await task
        while queue:
            i, c, task = queue.pop(0)
            yield i, c, await task
    finally:
        for _, _, task in queue:
            task.cancel()


async def _append_partition(
    storage: Storage, keys: Keys, cfg: WriteConfig, record: TxnRecord, partition: int, deadline: float
) -> PartitionReport:
    """Append the partition's chunks that have no seq yet, in manifest order; fills in their seqs."""
    part = record.partitions[partition]
    report = PartitionReport()
    todo = [(i, c) for i, c in enumerate(part.chunks) if c.seq is None]
    if not todo:
        return report
    writer = SegmentWriter(
        storage,
        keys,
        cfg.topic,
        partition,
        cfg.producer_id,
        timeout_s=max(1.0, deadline - time.monotonic()),
        max_attempts=MAX_ATTEMPTS,
        catalog=TopicCatalog(storage, keys),
    )
    async for index, chunk, data in _staged(storage, todo):
        staged = decode_header(data)
        if staged.count != chunk.count:
            raise StorageError(
                f"staged chunk {chunk.src} holds {staged.count} messages, the task wrote {chunk.count}"
            )
        rest = data.split(b"\n", 1)[1]
        codec = staged.codec
        if codec is not None and codec != cfg.compression:  # the topic gets plain JSON Lines
            # inflating releases the GIL: other partitions' requests go on meanwhile
            lines = await asyncio.to_thread(segment_lines, data, staged)
            rest = b"\n".join(lines) + b"\n"
            codec = None

        def encode(
            header: Any,
            staged: Any = staged,
            index: int = index,
            rest: bytes = rest,
            codec: str | None = codec,
        ) -> bytes:
            final = dataclasses.replace(
                header, txn=record.id, chunk=index, codec=codec, producer_id=staged.producer_id
            )
            return encode_header(final) + b"\n" + rest

        writer.timeout_s = max(1.0, deadline - time.monotonic())
        # the batch id names the chunk: a retried PUT whose first answer was lost finds itself
        landed = await writer.append([b""] * chunk.count, f"{record.id}-{partition}-{index}", encode=encode)
        chunk.seq = landed.seq
        report.messages += landed.count
        report.segments += 1
        report.bytes += landed.size
        report.first_seq = landed.seq if report.first_seq is None else report.first_seq
        report.last_seq = landed.seq
    await writer.write_head()
    return report


async def _append_all(
    storage: Storage, keys: Keys, cfg: WriteConfig, record: TxnRecord, report: JobReport
) -> None:
    """Every partition's missing chunks; the first failure cancels the others and is raised."""
    deadline = time.monotonic() + max(1.0, record.timeout_s - COMMIT_MARGIN_S)
    limit = asyncio.Semaphore(PARALLEL_PARTITIONS)

    async def one(p: int) -> None:
        async with limit:
            part = await _append_partition(storage, keys, cfg, record, p, deadline)
        report.partitions[p] = part
        report.messages += part.messages
        report.segments += part.segments
        report.bytes += part.bytes

    try:
        async with asyncio.TaskGroup() as group:
            for p in sorted(record.partitions):
                group.create_task(one(p))
    except BaseExceptionGroup as eg:
        raise eg.exceptions[0] from None


# -- the job's transactions ------------------------------------------------------------------------


async def _job_records(storage: Storage, keys: Keys, cfg: WriteConfig) -> list[tuple[TxnRecord, str]]:
    ids = await list_txns(storage, keys, cfg.topic, cfg.job)
    found = await read_all(storage, keys, cfg.topic, ids)
    return [found[t] for t in sorted(found)]


async def _scan_landed(storage: Storage, keys: Keys, record: TxnRecord, partition: int) -> dict[int, int]:
    """Chunks of ``record`` already appended to ``partition``: chunk -> first seq (GETs from ``start``)."""
    landed: dict[int, int] = {}
    seq = record.partitions[partition].start
    while True:
        blob = await storage.get(keys.segment(record.topic, partition, seq))
        if blob is None:
            return landed
        header = decode_header(blob.data)
        if header.txn == record.id and header.chunk is not None:
            landed.setdefault(header.chunk, seq)
        seq += 1


async def _finish(
    storage: Storage, keys: Keys, cfg: WriteConfig, record: TxnRecord, etag: str, started: float
) -> dict[str, Any] | None:
    """Complete a dead run's commit from its staged chunks; returns the report, or None if it was
    aborted instead (its chunks are gone, or another run got to it first)."""
    # the chunks stay where the run that staged them put them, which is not the owner's area once
    # a recovering run took the record over (and died too): look in every run's area of the job
    base = keys.spark_staging_prefix() + cfg.job + "/"
    present = {info.key async for info in storage.list(base)}
    chunks = [c for part in record.partitions.values() for c in part.chunks]
    if not all(c.src in present for c in chunks):
        await abort_txn(
            storage,
            keys,
            cfg.topic,
            record.id,
            "its run died and its staged chunks are gone",
            etag=etag,
            only_expired=False,
        )
        return None
    # take over: from now on the dead run's If-Match fails, should it still be alive
    previous = record.owner
    record.owner = cfg.run
    stored, etag, won = await rewrite_txn(storage, keys, record, etag)
    if not won:
        return _report_of(stored) if stored.state == "committed" else None
    report = JobReport(cfg.job, cfg.topic, record.id, recovered=True)
    try:
        for p in sorted(record.partitions):
            for chunk_index, seq in (await _scan_landed(storage, keys, record, p)).items():
                if chunk_index < len(record.partitions[p].chunks):
                    record.partitions[p].chunks[chunk_index].seq = seq
        await _append_all(storage, keys, cfg, record, report)
    except BaseException as exc:
        await _abort_quietly(storage, keys, cfg, record.id, etag, f"recovery failed: {exc}")
        raise TxnError(
            f"write job {cfg.job}: finishing the commit of an earlier run failed ({exc}); "
            "nothing of the job is visible, run it again"
        ) from exc
    # every chunk landed: report the whole job, not only what this run appended
    report = JobReport(cfg.job, cfg.topic, record.id, recovered=True)
    for p, part in record.partitions.items():
        seqs = [c.seq for c in part.chunks if c.seq is not None]
        report.partitions[p] = PartitionReport(
            part.messages, len(part.chunks), sum(c.bytes for c in part.chunks), min(seqs), max(seqs)
        )
        report.messages += part.messages
        report.segments += len(part.chunks)
        report.bytes += sum(c.bytes for c in part.chunks)
    report.commit_seconds = time.monotonic() - started
    out = await _commit_record(storage, keys, cfg, record, etag, report)
    await _cleanup(storage, keys, cfg)
    log.warning("write job %s: finished the commit of run %s that had died", cfg.job, previous)
    return out


async def prepare_job(storage: Storage, keys: Keys, cfg: WriteConfig) -> dict[str, Any] | None:
    """On the driver, before any task: what earlier runs of ``cfg.job`` left.

    Returns the job's report when it is already committed (by an earlier run, or now, by
    finishing the commit of a run that died): this run then writes nothing. A pending commit of
    a dead run is finished from its staged chunks when they are all there, else aborted.
    """
    started = time.monotonic()
    records = await _job_records(storage, keys, cfg)
    committed = _committed_report(records)
    if committed is not None:
        return committed
    for record, etag in records:
        if record.state == "pending":
            report = await _finish(storage, keys, cfg, record, etag, started)
            if report is not None:
                return report
    return None


def _committed_report(records: list[tuple[TxnRecord, str]]) -> dict[str, Any] | None:
    """The report of the job's committed transaction, if one of ``records`` is (at most one is)."""
    for record, _ in records:
        if record.state == "committed":
            return _report_of(record)
    return None


async def _begin(
    storage: Storage, keys: Keys, cfg: WriteConfig, parts: dict[int, list[Chunk]]
) -> tuple[TxnRecord, str] | dict[str, Any]:
    """Create this run's pending transaction; or the job's report if another run committed it.

    Every earlier transaction of the job is final before ours is created (pending ones are
    aborted): with sequential put-if-absent ids, at most one transaction of a job ever commits.
    """
    while True:
        records = await _job_records(storage, keys, cfg)
        committed = _committed_report(records)
        if committed is not None:
            return committed
        for record, etag in records:
            if record.state == "pending":
                stored = await abort_txn(
                    storage,
                    keys,
                    cfg.topic,
                    record.id,
                    f"superseded by run {cfg.run} of the same job",
                    etag=etag,
                    only_expired=False,
                )
                if stored is not None and stored.state == "committed":
                    return _report_of(stored)
                if stored is not None and stored.state == "pending":
                    break  # it changed under us: look again
        else:
            numbers = [parsed[1] for r, _ in records if (parsed := parse_txn_id(r.id)) is not None]
            partitions = {}
            for p, chunks in sorted(parts.items()):
                start, _ = await find_tail(storage, keys, cfg.topic, p)
                partitions[p] = TxnPartition(start, chunks)
            record = TxnRecord(
                id=txn_id(cfg.job, max(numbers, default=0) + 1),
                topic=cfg.topic,
                job=cfg.job,
                owner=cfg.run,
                timeout_s=cfg.txn_timeout_s,
                partitions=partitions,
            )
            try:
                return record, await create_txn(storage, keys, record)
            except AlreadyExists:
                continue  # another run of the job took that id: look again


async def _commit_record(
    storage: Storage, keys: Keys, cfg: WriteConfig, record: TxnRecord, etag: str, report: JobReport
) -> dict[str, Any]:
    """Flip the record to committed (the job becomes visible), then store the report."""
    report.committed_at = time.time()
    record.state = "committed"
    record.info = {"report": report.to_json()}
    stored, _, won = await rewrite_txn(storage, keys, record, etag)
    if not won:
        if stored.state == "committed":
            return _report_of(stored)  # a run that took over committed the same transaction
        raise TxnError(
            f"write job {cfg.job}: its transaction {record.id} was aborted before it could commit "
            f"({stored.reason or 'unknown reason'}); nothing of the job is visible, run it again"
        )
    body = report.to_json()
    await touch_wake(storage, keys, cfg.topic, f"job/{cfg.job}")  # idle readers look now (advisory)
    try:
        await storage.overwrite(keys.spark_job(cfg.job), json.dumps(body).encode())
    except StorageError as exc:  # the record is the truth; the report is a convenience
        log.warning("write job %s committed, but its report could not be stored: %s", cfg.job, exc)
    return body


async def _abort_quietly(
    storage: Storage, keys: Keys, cfg: WriteConfig, txn: str, etag: str, reason: str
) -> None:
    try:
        await abort_txn(storage, keys, cfg.topic, txn, reason, etag=etag, only_expired=False)
    except Exception as exc:
        log.warning(
            "write job %s: transaction %s could not be aborted (%s); it stays pending, which blocks readers of "
            "its partitions until it times out or the job runs again",
            cfg.job,
            txn,
            exc,
        )


async def _cleanup(storage: Storage, keys: Keys, cfg: WriteConfig) -> None:
    """The job is committed: every run's staging area and abort marker can go."""
    try:
        await delete_prefix(storage, keys.spark_staging_prefix() + cfg.job + "/")
        await delete_prefix(storage, keys.spark_aborted_prefix() + cfg.job + "/")
    except StorageError as exc:  # left for garbage collection
        log.warning("write job %s: staging area not removed (%s)", cfg.job, exc)


async def commit_job(
    cfg: WriteConfig, messages: list[TaskCommit | None], *, storage: Storage | None = None
) -> dict[str, Any]:
    """Commit the staged chunks of every successful task as one transaction; returns the report.

    ``storage``: an already opened storage to commit through (left open); None opens one from
    ``cfg.settings`` for the commit and closes it after.
    """
    started = time.monotonic()
    done = sorted((m for m in messages if m is not None), key=lambda m: m.task)
    if storage is not None:
        return await _commit_job(storage, cfg, done, started)
    async with storage_for(cfg.settings) as opened:
        return await _commit_job(opened, cfg, done, started)


async def _commit_job(
    storage: Storage, cfg: WriteConfig, done: list[TaskCommit], started: float
) -> dict[str, Any]:
    keys = keys_of(cfg.settings)
    if cfg.done is not None:
        return cfg.done
    parts: dict[int, list[Chunk]] = {}
    for m in done:
        for p, chunks in sorted(m.chunks.items()):
            parts.setdefault(p, []).extend(Chunk(c.count, c.bytes, c.key) for c in chunks)
    began = await _begin(storage, keys, cfg, parts)
    if isinstance(began, dict):
        await _cleanup(storage, keys, cfg)
        return began
    record, etag = began
    report = JobReport(
        cfg.job,
        cfg.topic,
        record.id,
        tasks=len(done),
        task_seconds=max((m.seconds for m in done), default=0.0),
        payload_bytes=sum(m.payload_bytes for m in done),
    )
    try:
        await _append_all(storage, keys, cfg, record, report)
    except BaseException as exc:
        await _abort_quietly(storage, keys, cfg, record.id, etag, f"commit failed: {exc}")
        raise TxnError(
            f"write job {cfg.job} failed during its commit ({exc}); nothing of it is visible "
            f"(transaction {record.id} aborted)"
        ) from exc
    for m in done:
        for op, n in m.requests.items():
            report.requests[op] = report.requests.get(op, 0) + n
    for op, n in storage.stats.snapshot().items():
        report.requests[op] = report.requests.get(op, 0) + n
    report.commit_seconds = time.monotonic() - started
    body = await _commit_record(storage, keys, cfg, record, etag, report)
    await _cleanup(storage, keys, cfg)
    return body


async def abort_job(cfg: WriteConfig, *, storage: Storage | None = None) -> None:
    """Remove what this run staged; nothing of it was ever visible in the topic.

    Tasks of the run still running either finish and see the run's abort marker (then remove
    their own staging), or are killed within Spark's task kill timeout: a second sweep after
    :data:`ABORT_SWEEP_DELAY_S` removes what they wrote before dying. Other runs of the same job
    are untouched (the marker names this run only), so the job can simply be run again.

    ``storage``: an already opened storage to work through (left open); None opens one from
    ``cfg.settings`` and closes it after.
    """
    if cfg.done is not None:
        return
    if storage is not None:
        await _abort_job(storage, cfg)
        return
    async with storage_for(cfg.settings) as opened:
        await _abort_job(opened, cfg)


async def _abort_job(storage: Storage, cfg: WriteConfig) -> None:
    keys = keys_of(cfg.settings)
    prefix = keys.spark_staging(cfg.job, cfg.run) + "/"
    await storage.overwrite(keys.spark_aborted(cfg.job, cfg.run), json.dumps({"at": time.time()}).encode())
    for record, etag in await _job_records(storage, keys, cfg):
        if record.state == "pending" and record.owner == cfg.run:
            await _abort_quietly(storage, keys, cfg, record.id, etag, "the job was aborted")
    await delete_prefix(storage, prefix)
    await asyncio.sleep(ABORT_SWEEP_DELAY_S)
    await delete_prefix(storage, prefix)


async def read_report(settings: dict[str, Any], job: str) -> dict[str, Any] | None:
    """The stored report of a committed write job, or None."""
    async with storage_for(settings) as storage:
        blob = await storage.get(keys_of(settings).spark_job(job))
    return json.loads(blob.data) if blob is not None else None


async def committed_report(settings: dict[str, Any], topic: str, job: str) -> dict[str, Any] | None:
    """The report of ``job`` if a transaction of it committed into ``topic``, else None."""
    keys = keys_of(settings)
    async with storage_for(settings, strategy="conditional_write") as storage:
        found = await read_all(storage, keys, topic, await list_txns(storage, keys, topic, job))
    for record, _ in found.values():
        if record.state == "committed":
            return _report_of(record)
    return None
