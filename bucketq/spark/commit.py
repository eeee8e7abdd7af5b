"""The job commit: one transaction per commit attempt, and it copies nothing (docs/protocol.md,
"Job commits").

The tasks wrote their chunks at their final keys (:mod:`bucketq.spark.writing`). The commit:

1. **Begin.** The driver settles what earlier runs of the same ``jobId`` left (a committed
   transaction: nothing to do; a pending one: finished by :func:`prepare_job` when its chunks are
   all there, else aborted) and writes the transaction record ``{job}.{n}`` put-if-absent as
   ``pending``, with the manifest: per partition its tail (``start``) and the reference segments
   to append, each naming its chunks (names, ETags, counts, time ranges) in task order.
2. **Append.** Per partition (8 at a time), each reference segment at the tail, put-if-absent,
   its header naming the transaction and its index in the manifest: a few hundred bytes per
   partition, however many messages the job has.
3. **Commit.** The record is overwritten ``committed`` (If-Match on the pending ETag) with the
   seq and base offset of every reference segment. Readers show the job from that moment on.

Any failure before step 3 aborts the record (If-Match) and deletes the run's chunks: nothing of
the job is ever visible; reference segments already appended are skipped by every reader. A
committer that dies leaves the record pending: the job run again finishes it (the missing
reference segments, then the flip) or, when its chunks are gone, aborts it; left alone, the
record times out and a reader or GC aborts it. A ``jobId`` commits at most once: running it
again after success writes nothing and reports ``skipped`` (and, when its input is not the
committed run's, says so: a warning, or an error with ``changedInput=fail``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from bucketq.core.bucket_format import ensure_format
from bucketq.core.chunks import ChunkRef, same_etag
from bucketq.core.keys import Keys, chunk_name_of
from bucketq.core.refsegment import encode_ref_segment
from bucketq.core.segment import REF_CODEC, SegmentHeader, decode_header
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
    read_txn,
    rewrite_txn,
    txn_id,
)
from bucketq.core.wake import touch_wake
from bucketq.errors import AlreadyExists, StorageError
from bucketq.spark.options import MAX_BATCH_MESSAGES, WriteConfig
from bucketq.spark.runtime import delete_prefix, keys_of, storage_for
from bucketq.spark.writing import TaskCommit
from bucketq.storage import Storage

log = logging.getLogger("bucketq.spark")

PARALLEL_PARTITIONS = 8
MAX_ATTEMPTS = 50
COMMIT_MARGIN_S = 5.0  # an append gives up this long before the transaction could be aborted
ABORT_SWEEP_DELAY_S = 3.0  # longer than spark.python.task.killTimeout (2 s by default)
# Messages a reference segment references at most (a consumer holds one segment's records)
REF_SEGMENT_MESSAGES = MAX_BATCH_MESSAGES


class InputChanged(TxnError):
    """A committed job was run again with other input (``changedInput=fail``)."""


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
    segments: int = 0  # reference segments appended
    chunks: int = 0  # columnar chunks they name
    bytes: int = 0  # bytes of the chunks (what the job stores)
    payload_bytes: int = 0  # the chunks' columns before compression
    requests: dict[str, int] = field(default_factory=dict)
    partitions: dict[int, PartitionReport] = field(default_factory=dict)
    committed_at: float = 0.0
    task_seconds: float = 0.0  # the slowest task
    commit_seconds: float = 0.0
    recovered: bool = False  # finished the commit of an earlier run that died
    input: dict[str, Any] = field(default_factory=dict)  # rows and fingerprint of the input

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "topic": self.topic,
            "txn": self.txn,
            "tasks": self.tasks,
            "messages": self.messages,
            "segments": self.segments,
            "chunks": self.chunks,
            "bytes": self.bytes,
            "payload_bytes": self.payload_bytes,
            "requests": self.requests,
            "requests_total": sum(self.requests.values()),
            "committed_at": self.committed_at,
            "task_seconds": round(self.task_seconds, 3),
            "commit_seconds": round(self.commit_seconds, 3),
            "recovered": self.recovered,
            "input": self.input,
            "partitions": {str(p): vars(r) for p, r in sorted(self.partitions.items())},
        }


def _report_of(record: TxnRecord) -> dict[str, Any]:
    """A job report rebuilt from a committed record (its ``info`` holds the committer's report)."""
    if record.info.get("report"):
        return dict(record.info["report"])
    report = JobReport(
        record.job, record.topic, record.id, messages=record.messages, committed_at=record.updated_at
    )
    _fill_from_record(report, record)
    return report.to_json()


def _fill_from_record(report: JobReport, record: TxnRecord) -> None:
    for p, part in record.partitions.items():
        seqs = [c.seq for c in part.chunks if c.seq is not None]
        stored = sum(c.bytes for c in part.chunks)
        report.partitions[p] = PartitionReport(
            part.messages, len(part.chunks), stored, min(seqs, default=None), max(seqs, default=None)
        )
        report.segments += len(part.chunks)
        report.chunks += sum(len(c.refs) for c in part.chunks)
        report.bytes += stored


def input_fingerprint(messages: list[TaskCommit]) -> dict[str, Any]:
    """The job's input: its rows and a CRC of every task's (in task order)."""
    crc = 0
    for m in sorted(messages, key=lambda m: m.task):
        crc = zlib.crc32(f"{m.task}:{m.rows}:{m.crc};".encode(), crc)
    return {"rows": sum(m.rows for m in messages), "fingerprint": f"{crc:08x}"}


def manifest(refs: list[ChunkRef]) -> list[Chunk]:
    """A partition's chunks (in order) as the reference segments that will name them: consecutive
    chunks, at most :data:`REF_SEGMENT_MESSAGES` messages each (a bigger chunk gets one alone)."""
    out: list[Chunk] = []
    for ref in refs:
        if not out or out[-1].count + ref.count > REF_SEGMENT_MESSAGES:
            out.append(Chunk(0))
        entry = out[-1]
        entry.refs.append(ref)
        entry.count += ref.count
        entry.bytes += ref.bytes
    return out


# -- appending the reference segments --------------------------------------------------------------


async def _append_partition(
    storage: Storage,
    keys: Keys,
    cfg: WriteConfig,
    record: TxnRecord,
    partition: int,
    deadline: float,
    tail: tuple[int, int] | None = None,
) -> PartitionReport:
    """Append the partition's reference segments that have no seq yet, in manifest order.

    ``tail``: (seq, offset) the partition's tail was found at when the record was written; the
    writer starts there instead of looking again (a segment appended since is met by a 412 and
    passed, as any writer passes a rival's segment)."""
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
    if tail is not None:
        await writer.start_at(*tail)
    for index, entry in todo:

        def encode(header: SegmentHeader, index: int = index, entry: Chunk = entry) -> bytes:
            final = dataclasses.replace(header, txn=record.id, chunk=index, codec=REF_CODEC)
            return encode_ref_segment(final, entry.refs)

        writer.timeout_s = max(1.0, deadline - time.monotonic())
        # the batch id names the segment: a retried PUT whose first answer was lost finds itself
        landed = await writer.append([b""] * entry.count, f"{record.id}-{partition}-{index}", encode=encode)
        entry.seq, entry.base = landed.seq, landed.base
        report.messages += landed.count
        report.segments += 1
        report.bytes += entry.bytes
        report.first_seq = landed.seq if report.first_seq is None else report.first_seq
        report.last_seq = landed.seq
    await writer.write_head()
    return report


async def _append_all(
    storage: Storage,
    keys: Keys,
    cfg: WriteConfig,
    record: TxnRecord,
    tails: dict[int, tuple[int, int]] | None = None,
) -> None:
    """Every partition's missing reference segments; the first failure cancels the others."""
    deadline = time.monotonic() + max(1.0, record.timeout_s - COMMIT_MARGIN_S)
    limit = asyncio.Semaphore(PARALLEL_PARTITIONS)

    async def one(p: int) -> None:
        async with limit:
            await _append_partition(storage, keys, cfg, record, p, deadline, (tails or {}).get(p))

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


async def _scan_landed(
    storage: Storage, keys: Keys, record: TxnRecord, partition: int
) -> dict[int, tuple[int, int]]:
    """Reference segments of ``record`` already in ``partition``: index -> (seq, base), the first
    copy of each (GETs from ``start`` to the tail)."""
    landed: dict[int, tuple[int, int]] = {}
    seq = record.partitions[partition].start
    while True:
        blob = await storage.get(keys.segment(record.topic, partition, seq))
        if blob is None:
            return landed
        try:
            header = decode_header(blob.data)
        except StorageError:
            header = None
        if header is not None and header.txn == record.id and header.chunk is not None:
            landed.setdefault(header.chunk, (seq, header.base))
        seq += 1


async def _chunks_present(storage: Storage, keys: Keys, record: TxnRecord) -> bool:
    """Whether every chunk ``record`` names is stored, unchanged (one LIST of the job's chunks)."""
    prefix = keys.chunks_prefix(record.topic)
    stored = {
        info.key[len(prefix) :]: info.etag
        async for info in storage.list(keys.chunk_run_prefix(record.topic, record.job))
    }
    return all(
        ref.name in stored and same_etag(stored[ref.name], ref.etag)
        for part in record.partitions.values()
        for chunk in part.chunks
        for ref in chunk.refs
    )


async def _finish(
    storage: Storage, keys: Keys, cfg: WriteConfig, record: TxnRecord, etag: str, started: float
) -> dict[str, Any] | None:
    """Complete a dead run's commit from its chunks; returns the report, or None if it was aborted
    instead (its chunks are gone, it was staged by an older version, or another run got to it)."""
    if not record.references:
        reason = "its run died, and it was staged by an older bucketq version that copied chunks"
    elif not await _chunks_present(storage, keys, record):
        reason = "its run died and its chunks are gone"
    else:
        reason = ""
    if reason:
        await abort_txn(storage, keys, cfg.topic, record.id, reason, etag=etag, only_expired=False)
        return None
    # take over: from now on the dead run's If-Match fails, should it still be alive
    previous = record.owner
    record.owner = cfg.run
    stored, etag, won = await rewrite_txn(storage, keys, record, etag)
    if not won:
        return _report_of(stored) if stored.state == "committed" else None
    try:
        for p in sorted(record.partitions):
            for index, (seq, base) in (await _scan_landed(storage, keys, record, p)).items():
                if index < len(record.partitions[p].chunks):
                    chunk = record.partitions[p].chunks[index]
                    chunk.seq, chunk.base = seq, base
        await _append_all(storage, keys, cfg, record)
    except BaseException as exc:
        await _abort_quietly(storage, keys, cfg, record.id, etag, f"recovery failed: {exc}")
        raise TxnError(
            f"write job {cfg.job}: finishing the commit of an earlier run failed ({exc}); "
            "nothing of the job is visible, run it again"
        ) from exc
    report = JobReport(cfg.job, cfg.topic, record.id, recovered=True, messages=record.messages)
    report.input = dict(record.info.get("input") or {})
    _fill_from_record(report, record)
    report.commit_seconds = time.monotonic() - started
    out = await _commit_record(storage, keys, cfg, record, etag, report)
    await _cleanup(storage, keys, cfg, record)
    log.warning("write job %s: finished the commit of run %s that had died", cfg.job, previous)
    return out


async def prepare_job(storage: Storage, keys: Keys, cfg: WriteConfig) -> dict[str, Any] | None:
    """On the driver, before any task: what earlier runs of ``cfg.job`` left.

    Returns the job's report when it is already committed (by an earlier run, or now, by
    finishing the commit of a run that died): this run then writes nothing. A pending commit of
    a dead run is finished from its chunks when they are all there, else aborted. The bucket's
    format marker is brought to this version's first (reference segments need format 5).
    """
    started = time.monotonic()
    await ensure_format(storage, keys)
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
    storage: Storage,
    keys: Keys,
    cfg: WriteConfig,
    parts: dict[int, list[ChunkRef]],
    tails: dict[int, tuple[int, int]],
    info: dict[str, Any],
) -> tuple[TxnRecord, str] | dict[str, Any]:
    """Create this run's pending transaction; or the job's report if another run committed it.

    Every earlier transaction of the job is final before ours is created (pending ones are
    aborted): with sequential put-if-absent ids, at most one transaction of a job ever commits.
    The partitions' tails are left in ``tails`` (the record's starts, with their offsets).
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
            for p, refs in sorted(parts.items()):
                tails[p] = await find_tail(storage, keys, cfg.topic, p)
                partitions[p] = TxnPartition(tails[p][0], manifest(refs))
            record = TxnRecord(
                id=txn_id(cfg.job, max(numbers, default=0) + 1),
                topic=cfg.topic,
                job=cfg.job,
                owner=cfg.run,
                timeout_s=cfg.txn_timeout_s,
                partitions=partitions,
                info=info,
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
    stored, won = await _flip(storage, keys, cfg, record, etag)
    if not won:
        if stored.state == "committed":
            return _report_of(stored)  # a run that took over committed the same transaction
        raise TxnError(
            f"write job {cfg.job}: its transaction {record.id} was aborted before it could commit "
            f"({stored.reason or 'unknown reason'}); nothing of the job is visible, run it again"
        )
    body = report.to_json()
    await touch_wake(storage, keys, cfg.topic, f"job/{cfg.job}")  # idle readers look now (advisory)
    await _store_report(storage, keys, cfg.job, body)
    return body


COMMIT_ATTEMPTS = 3


async def _flip(
    storage: Storage, keys: Keys, cfg: WriteConfig, record: TxnRecord, etag: str
) -> tuple[TxnRecord, bool]:
    """Overwrite the pending record with ``record`` (committed), If-Match ``etag``: ``(record now
    stored, whether ours won)``.

    A PUT whose outcome is unknown (a lost response, a timeout) is judged by reading the record
    back, never assumed failed: a commit that landed while its answer was lost is this run's
    commit (its chunks must stay, and the caller must not abort). Still pending with our ETag:
    the PUT did not land, and it is sent again (If-Match keeps it exactly-once).
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            stored, _, won = await rewrite_txn(storage, keys, record, etag)
            return stored, won
        except StorageError as exc:
            found = await read_txn(storage, keys, cfg.topic, record.id)
            if found is None:
                raise
            current, current_etag = found
            if current.state != "pending":
                return current, current.state == "committed" and current.owner == cfg.run
            if current_etag != etag or attempt >= COMMIT_ATTEMPTS:
                raise  # another run took it over, or the store keeps failing: the caller aborts
            log.info("write job %s: the commit's outcome was unknown (%s); it had not landed", cfg.job, exc)


async def _store_report(storage: Storage, keys: Keys, job: str, body: dict[str, Any]) -> None:
    try:
        await storage.overwrite(keys.spark_job(job), json.dumps(body).encode())
    except StorageError as exc:  # the record is the truth; the report is a convenience
        log.warning("write job %s: its report could not be stored: %s", job, exc)


async def _abort_quietly(
    storage: Storage, keys: Keys, cfg: WriteConfig, txn: str, etag: str, reason: str
) -> None:
    try:
        await abort_txn(storage, keys, cfg.topic, txn, reason, etag=etag, only_expired=False)
    except Exception as exc:
        log.warning(
            "write job %s: transaction %s could not be aborted (%s); it stays pending, which holds "
            "streams and consumers of its partitions back until it times out or the job runs again",
            cfg.job,
            txn,
            exc,
        )


async def _cleanup(storage: Storage, keys: Keys, cfg: WriteConfig, record: TxnRecord) -> None:
    """The job is committed: chunks no reference segment names (failed task attempts, runs that
    died) and the abort markers can go; so can staging areas of older versions."""
    named = {ref.name for part in record.partitions.values() for c in part.chunks for ref in c.refs}
    prefix = keys.chunks_prefix(cfg.topic)
    try:
        extra = [
            info.key
            async for info in storage.list(keys.chunk_run_prefix(cfg.topic, cfg.job))
            if (name := chunk_name_of(info.key, prefix)) is not None and name not in named
        ]
        for start in range(0, len(extra), 1000):
            await storage.delete(extra[start : start + 1000])
        await delete_prefix(storage, keys.spark_aborted_prefix() + cfg.job + "/")
        await delete_prefix(storage, keys.spark_staging_prefix() + cfg.job + "/")
    except StorageError as exc:  # left for garbage collection
        log.warning("write job %s: leftover chunks not removed (%s)", cfg.job, exc)


async def commit_job(
    cfg: WriteConfig, messages: list[TaskCommit | None], *, storage: Storage | None = None
) -> dict[str, Any]:
    """Commit the chunks of every successful task as one transaction; returns the report.

    ``storage``: an already opened storage to commit through (left open); None opens one from
    ``cfg.settings`` for the commit and closes it after.
    """
    started = time.monotonic()
    done = sorted((m for m in messages if m is not None), key=lambda m: m.task)
    if storage is not None:
        return await _commit_job(storage, cfg, done, started)
    async with storage_for(cfg.settings) as opened:
        return await _commit_job(opened, cfg, done, started)


async def _rerun(storage: Storage, keys: Keys, cfg: WriteConfig, done: list[TaskCommit]) -> dict[str, Any]:
    """A run of a job committed before: nothing was written. Says so, and whether its input is
    the committed run's (a warning, or :class:`InputChanged` with ``changedInput=fail``)."""
    assert cfg.done is not None
    now = input_fingerprint(done)
    before = cfg.done.get("input") or {}
    if before.get("fingerprint") is not None:
        changed = before != now
    else:  # committed by a version that kept no fingerprint: the message count is all there is
        changed = int(cfg.done.get("messages", 0)) != now["rows"]
    report = dict(cfg.done) | {"skipped": True, "input_changed": changed, "rerun_input": now}
    if changed:
        message = (
            f"write job {cfg.job} was committed before with other input ({before or cfg.done.get('messages')} "
            f"vs {now}); this run wrote nothing: use a new jobId to write this input"
        )
        if cfg.fail_on_changed_input:
            raise InputChanged(message)
        log.warning("%s", message)
    await _store_report(storage, keys, cfg.job, report)
    return report


async def _commit_job(
    storage: Storage, cfg: WriteConfig, done: list[TaskCommit], started: float
) -> dict[str, Any]:
    keys = keys_of(cfg.settings)
    if cfg.done is not None:
        return await _rerun(storage, keys, cfg, done)
    parts: dict[int, list[ChunkRef]] = {}
    for m in done:
        for p, refs in sorted(m.chunks.items()):
            parts.setdefault(p, []).extend(refs)
    tails: dict[int, tuple[int, int]] = {}
    # the input's fingerprint goes into the pending record: a run that finishes this commit
    # after the driver died reports it, and later reruns compare with it
    began = await _begin(storage, keys, cfg, parts, tails, {"input": input_fingerprint(done)})
    if isinstance(began, dict):
        return began
    record, etag = began
    report = JobReport(
        cfg.job,
        cfg.topic,
        record.id,
        tasks=len(done),
        messages=record.messages,
        task_seconds=max((m.seconds for m in done), default=0.0),
        payload_bytes=sum(m.payload_bytes for m in done),
        input=input_fingerprint(done),
    )
    _fill_from_record(report, record)
    try:
        await _append_all(storage, keys, cfg, record, tails)
    except BaseException as exc:
        await _abort_quietly(storage, keys, cfg, record.id, etag, f"commit failed: {exc}")
        await _delete_run_chunks(storage, keys, cfg)
        raise TxnError(
            f"write job {cfg.job} failed during its commit ({exc}); nothing of it is visible "
            f"(transaction {record.id} aborted)"
        ) from exc
    _fill_partitions(report, record)
    for m in done:
        for op, n in m.requests.items():
            report.requests[op] = report.requests.get(op, 0) + n
    for op, n in storage.stats.snapshot().items():
        report.requests[op] = report.requests.get(op, 0) + n
    report.commit_seconds = time.monotonic() - started
    body = await _commit_record(storage, keys, cfg, record, etag, report)
    await _cleanup(storage, keys, cfg, record)
    return body


def _fill_partitions(report: JobReport, record: TxnRecord) -> None:
    """Where each partition's reference segments landed."""
    for p, part in record.partitions.items():
        seqs = [c.seq for c in part.chunks if c.seq is not None]
        entry = report.partitions.setdefault(p, PartitionReport())
        entry.first_seq, entry.last_seq = min(seqs, default=None), max(seqs, default=None)


async def _delete_run_chunks(storage: Storage, keys: Keys, cfg: WriteConfig) -> None:
    """Delete this run's chunks that no pending or committed record of the job names (I18).

    Only this run's own records name its chunks (a recovering run finishes a record it took over,
    naming the chunks of the run that wrote it), and the caller no longer creates records: so a
    chunk named by no record that is not ``aborted`` now is never named by one later. A record
    this run could not abort, or one that committed although its answer was lost (a commit
    whose PUT landed), keeps its chunks. When the records cannot be read nothing is deleted:
    GC collects what no record names once it is a day old.
    """
    try:
        named = {
            ref.name
            for record, _ in await _job_records(storage, keys, cfg)
            if record.state != "aborted"
            for part in record.partitions.values()
            for c in part.chunks
            for ref in c.refs
        }
        prefix = keys.chunks_prefix(cfg.topic)
        doomed = [
            info.key
            async for info in storage.list(keys.chunk_run_prefix(cfg.topic, cfg.job, cfg.run))
            if (name := chunk_name_of(info.key, prefix)) is not None and name not in named
        ]
        for start in range(0, len(doomed), 1000):
            await storage.delete(doomed[start : start + 1000])
    except StorageError as exc:
        log.warning("write job %s: the run's chunks were not removed (%s); GC collects them", cfg.job, exc)


async def abort_job(cfg: WriteConfig, *, storage: Storage | None = None) -> None:
    """Remove what this run wrote; nothing of it was ever visible in the topic.

    Tasks of the run still running either finish and see the run's abort marker (then remove
    their own chunks), or are killed within Spark's task kill timeout: a second sweep after
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
    await storage.overwrite(keys.spark_aborted(cfg.job, cfg.run), json.dumps({"at": time.time()}).encode())
    for record, etag in await _job_records(storage, keys, cfg):
        if record.state == "pending" and record.owner == cfg.run:
            await _abort_quietly(storage, keys, cfg, record.id, etag, "the job was aborted")
    await _delete_run_chunks(storage, keys, cfg)
    await asyncio.sleep(ABORT_SWEEP_DELAY_S)
    await _delete_run_chunks(storage, keys, cfg)


async def read_report(settings: dict[str, Any], job: str) -> dict[str, Any] | None:
    """The stored report of a committed write job (of its last run), or None."""
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
