"""Write tasks: rows become columnar chunks, each PUT once at its final key.

A task attempt writes its chunks under ``R/{topic}/chunk/{job}/{run}/t{task}-a{attempt}/``: the run
id is new for every run of the job, the attempt folder is Spark's task attempt, so attempts and
runs never mix, and a chunk is written once and never changes (I18). A chunk holds one partition's messages (at most ``batchMessages`` of them, about
``batchBytes`` before compression). Nothing here is visible to any reader: a chunk is part of a
partition only once the job commit appended a reference segment naming it
(:mod:`bucketq.spark.commit`).

The task reports each chunk's name, ETag, message count, size and ``created_at`` range, and a
fingerprint of its input (rows and a CRC of their values): a rerun of a committed job compares
fingerprints to tell the user that its input changed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from bucketq.core.chunks import ChunkRef, encode_chunk
from bucketq.errors import BucketqError
from bucketq.spark.encoding import ChunkEncoder, fingerprint
from bucketq.spark.options import WriteConfig
from bucketq.spark.runtime import delete_prefix, keys_of, paused_gc, settings_of
from bucketq.storage import Storage, open_storage

UPLOADS_IN_FLIGHT = 4


@dataclass
class TaskCommit(WriterCommitMessage):
    """What one successful task attempt wrote: per partition, its chunks in order."""

    task: int
    attempt: str = ""  # the attempt's chunk folder (``{job}/{run}/t…-a…``), relative to R/{topic}/chunk/
    chunks: dict[int, list[ChunkRef]] = field(default_factory=dict)
    messages: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    payload_bytes: int = 0  # the chunks' columns before compression
    rows: int = 0  # rows of the task's input
    crc: int = 0  # CRC-32 of the task's input values (encoding.fingerprint)


class Uploader:
    """PUTs chunks from a background event loop while the task thread keeps encoding."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bucketq-chunks", daemon=True)
        self.thread.start()
        self.storage: Storage = self._run(open_storage(settings_of(settings, strategy="conditional_write")))
        self.slots = threading.BoundedSemaphore(UPLOADS_IN_FLIGHT)
        self.pending: list[Future[str]] = []

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def put(self, key: str, body: bytes) -> Future[str]:
        """Start the PUT of ``body``; the future gives its ETag (an upload's failure fails the task)."""
        self._raise_failed()
        self.slots.acquire()
        future = asyncio.run_coroutine_threadsafe(self.storage.overwrite(key, body), self.loop)
        future.add_done_callback(lambda _f: self.slots.release())
        self.pending.append(future)
        return future

    def _raise_failed(self) -> None:
        for future in [f for f in self.pending if f.done()]:
            future.result()  # raises the upload's error in the task
            self.pending.remove(future)

    def wait(self) -> None:
        for future in self.pending:
            future.result()
        self.pending = []

    def head(self, key: str) -> bool:
        return bool(self._run(self.storage.head(key)) is not None)

    def delete_prefix(self, prefix: str) -> None:
        self._run(delete_prefix(self.storage, prefix))

    def close(self) -> None:
        for future in self.pending:
            future.cancel()
        try:
            self._run(self.storage.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()


@dataclass
class _Open:
    """A partition's chunk being filled."""

    tables: list[pa.Table] = field(default_factory=list)
    count: int = 0
    size: int = 0


@dataclass
class _Written:
    """A chunk whose PUT was started: its reference, once the ETag is known."""

    partition: int
    name: str
    count: int
    size: int
    min_us: int
    max_us: int
    etag: Future[str]


class ChunkWriter:
    """Cuts a partition's rows into chunks of at most ``batchMessages`` (about ``batchBytes``) and
    PUTs each at its final key as soon as it is full."""

    def __init__(
        self, cfg: WriteConfig, folder: str, uploader: Any, defaults: dict[str, Any] | None = None
    ) -> None:
        self.cfg = cfg
        self.defaults = defaults or {}  # the encoder's values of the columns its tables leave out
        self.folder = folder  # the attempt's chunk folder, relative to R/{topic}/chunk/
        self.uploader = uploader
        self.keys = keys_of(cfg.settings)
        self.open: dict[int, _Open] = {}
        self.written: list[_Written] = []
        self.numbers: dict[int, int] = {}
        self.messages = 0
        self.payload_bytes = 0

    def add(self, partition: int, table: pa.Table) -> None:
        start = 0
        while start < table.num_rows:
            cur = self.open.setdefault(partition, _Open())
            room = self.cfg.batch_messages - cur.count
            piece = table.slice(start, room)
            cur.tables.append(piece)
            cur.count += piece.num_rows
            cur.size += piece.nbytes
            start += piece.num_rows
            if cur.count >= self.cfg.batch_messages or cur.size >= self.cfg.batch_bytes:
                self._flush(partition)

    def _flush(self, partition: int) -> None:
        cur = self.open.pop(partition, None)
        if cur is None or not cur.count:
            return
        table = pa.concat_tables(cur.tables, promote_options="permissive")
        n = self.numbers.get(partition, 0)
        self.numbers[partition] = n + 1
        body = encode_chunk(table, compression=self.cfg.compression, defaults=self.defaults)
        name = f"{self.folder}/p{partition:04d}-{n:06d}.arrow"
        times = pc.min_max(table.column("created_at").cast(pa.int64()))
        etag = self.uploader.put(self.keys.chunk(self.cfg.topic, name), body)
        self.written.append(
            _Written(partition, name, cur.count, len(body), times["min"].as_py(), times["max"].as_py(), etag)
        )
        self.messages += cur.count
        self.payload_bytes += cur.size

    def finish(self) -> dict[int, list[ChunkRef]]:
        """Flush every open chunk, wait for the uploads; the chunks per partition, in order."""
        for partition in sorted(self.open):
            self._flush(partition)
        self.uploader.wait()
        out: dict[int, list[ChunkRef]] = {}
        for w in self.written:
            ref = ChunkRef(w.name, w.etag.result(), w.count, w.size, w.min_us, w.max_us)
            out.setdefault(w.partition, []).append(ref)
        return out


def write_task(
    cfg: WriteConfig, schema: StructType, task: int, attempt: int, batches: Iterator[pa.RecordBatch]
) -> TaskCommit:
    """Write one task attempt's rows as chunks; a failed attempt removes what it wrote (best effort:
    the job's abort, its next run and garbage collection remove the rest).

    The attempt's folder is new (run ids are unique, attempt numbers are unique within a run), so
    what it reports is exactly what it wrote.
    """
    started = time.monotonic()
    keys = keys_of(cfg.settings)
    folder = f"{cfg.job}/{cfg.run}/t{task:05d}-a{attempt}"
    encoder = ChunkEncoder(schema, cfg, task)
    uploader = Uploader(cfg.settings)
    rows = crc = 0
    try:
        writer = ChunkWriter(cfg, folder, uploader, encoder.defaults())
        try:
            with paused_gc():
                for batch in batches:
                    rows += batch.num_rows
                    crc = fingerprint(batch, crc)
                    for partition, table in encoder.encode(batch):
                        writer.add(partition, table)
                chunks = writer.finish()
            if uploader.head(keys.spark_aborted(cfg.job, cfg.run)):
                raise BucketqError(
                    f"write job {cfg.job} (run {cfg.run}) was aborted while this task ran: another task failed"
                )
        except BaseException:
            try:
                uploader.wait()
            except BaseException:
                pass
            try:
                uploader.delete_prefix(keys.chunk(cfg.topic, folder) + "/")
            except Exception:
                pass  # the job's abort, its next run or garbage collection removes it
            raise
        stats = uploader.storage.stats.snapshot()
    finally:
        uploader.close()
    return TaskCommit(
        task,
        folder,
        chunks,
        writer.messages,
        stats,
        time.monotonic() - started,
        writer.payload_bytes,
        rows,
        crc,
    )


def skip_task(task: int, batches: Iterator[pa.RecordBatch]) -> TaskCommit:
    """A task of a job committed before: nothing is written; the input is only fingerprinted, so
    the driver can tell the user when a rerun's input is not the committed run's."""
    rows = crc = 0
    for batch in batches:
        rows += batch.num_rows
        crc = fingerprint(batch, crc)
    return TaskCommit(task, rows=rows, crc=crc)
