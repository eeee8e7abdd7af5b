"""Write tasks: encode rows into segments-to-be ("chunks") and stage them in the attempt's own area.

Each task attempt writes under ``R/_spark/staging/{job}/{run}/t{task}-a{attempt}/``: the run id is
new for every run of the job (a rerun never mixes with what a dead run left), the attempt folder
is Spark's task attempt. A chunk is a complete segment body (plain or compressed JSON Lines of
engine-encoded messages) behind a placeholder header; the job commit (:mod:`bucketq.spark.commit`)
gives each chunk its place in the topic. Nothing here is visible to any consumer.

Rows become message lines without a Python object per message when the DataFrame has only a
JSON-text ``payload`` column and an optional string ``key`` (the common bulk shape): the lines are
assembled by Arrow compute kernels, and the payloads are validated as JSON in bulk (see
:func:`_validated_payloads`). Any other shape goes through :class:`~bucketq.spark.rows.RowMapper`
and the engine's record encoder, message by message. Both produce lines the engine decodes into
the same records.
"""

from __future__ import annotations

import asyncio
import bisect
import io
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StringType, StructType

from bucketq.core.producer import partition_for_key
from bucketq.core.segment import (
    JSON_CONTENT_TYPE,
    SegmentHeader,
    compress_body,
    encode_header,
    encode_record,
)
from bucketq.errors import BucketqError, MessageTooLarge
from bucketq.spark.options import WriteConfig
from bucketq.spark.rows import RowMapper
from bucketq.spark.runtime import keys_of, paused_gc, settings_of
from bucketq.spark.schema import POSITION_COLUMNS
from bucketq.storage import Storage, open_storage

UPLOADS_IN_FLIGHT = 4
STAGING_CODEC = "zlib"


@dataclass(frozen=True, slots=True)
class StagedChunk:
    """One staged chunk: where it is, how many messages, how many bytes the object has."""

    key: str
    count: int
    bytes: int


@dataclass
class TaskCommit(WriterCommitMessage):
    """What one successful task attempt staged: per partition, its chunks in order."""

    task: int
    root: str  # staging root of the attempt
    chunks: dict[int, list[StagedChunk]] = field(default_factory=dict)
    messages: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    payload_bytes: int = 0  # message lines before compression


# -- message ids -----------------------------------------------------------------------------------

_HEX4 = pa.array([f"{i:04x}" for i in range(1 << 16)])
_VERSION = pa.array([f"7{i:03x}" for i in range(1 << 12)])
_VARIANT = pa.array([f"{0x8000 | i:04x}" for i in range(1 << 14)])


class IdSource:
    """UUIDv7 message ids made by Arrow kernels, increasing within the task.

    48-bit unix milliseconds, then a 12-bit counter (RFC 9562 method 3: the clock moves on by one
    millisecond when the counter wraps), then 62 random bits: unique without coordination and
    ordered by creation, like the engine's ids.
    """

    def __init__(self) -> None:
        self.next_ms = 0

    def take(self, n: int) -> pa.Array:
        start = max(int(time.time() * 1000), self.next_ms)
        counter = pa.array(range(n), pa.int64())
        ms = pc.add(pc.shift_right(counter, 12), start)
        self.next_ms = start + (n >> 12) + 1
        hi = pc.cast(pc.shift_right(ms, 32), pa.int32())
        mid = pc.cast(pc.bit_wise_and(pc.shift_right(ms, 16), 0xFFFF), pa.int32())
        lo = pc.cast(pc.bit_wise_and(ms, 0xFFFF), pa.int32())
        seq = pc.cast(pc.bit_wise_and(counter, 0xFFF), pa.int32())
        rnd = pa.Array.from_buffers(pa.uint16(), 4 * n, [None, pa.py_buffer(os.urandom(8 * n))])
        rnd = pc.cast(rnd, pa.int32())
        rows = pa.FixedSizeListArray.from_arrays(rnd, 4)
        parts = [pc.list_element(rows, k) for k in range(4)]
        variant = _VARIANT.take(pc.bit_wise_and(parts[0], 0x3FFF))
        return pc.binary_join_element_wise(
            _HEX4.take(hi),
            _HEX4.take(mid),
            "-",
            _HEX4.take(lo),
            "-",
            _VERSION.take(seq),
            "-",
            variant,
            "-",
            _HEX4.take(parts[1]),
            _HEX4.take(parts[2]),
            _HEX4.take(parts[3]),
            "",
        )


# -- rows to lines ---------------------------------------------------------------------------------


def _json_string(value: str) -> str:
    from json.encoder import encode_basestring

    return str(encode_basestring(value))


def _validated_payloads(payload: pa.Array) -> pa.Array | None:
    """The payload texts (null as ``null``) if every one is exactly one JSON value; None when a
    batch has to be checked message by message instead (never a wrong "valid").

    Each text is put on its own line as ``{"p":<text>}`` and the lines parsed by Arrow's JSON
    reader. A text that is one JSON value yields one row with the single column ``p``; any other
    text fails the parse, adds rows (``1}{"p":2``) or adds a column (``1,"q":2``). Texts with a
    line break (they would span lines) or a NaN/Infinity literal (Arrow accepts those, JSON does
    not) are left to the message-by-message check.
    """
    texts = pc.fill_null(payload, "null")
    if pc.any(pc.match_substring_regex(texts, r"[\r\n]|NaN|Infinity")).as_py():
        return None
    ndjson = pc.binary_join_element_wise('{"p":', texts, "}\n", "")
    body = _body(ndjson, 0, len(ndjson))
    try:
        table = pajson.read_json(
            io.BytesIO(body),
            read_options=pajson.ReadOptions(use_threads=False, block_size=max(1 << 20, len(body) + 1)),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.num_rows != len(payload) or table.column_names != ["p"]:
        return None
    return texts


def _offsets(lines: pa.Array) -> pa.Array:
    """The int32 offsets of a string array (``len + 1`` of them, into its data buffer)."""
    buffers = lines.buffers()
    return pa.Array.from_buffers(pa.int32(), len(lines) + 1, [None, buffers[1]], offset=lines.offset)


def _body(lines: pa.Array, start: int, end: int, offsets: list[int] | None = None) -> bytes:
    """The concatenated bytes of string elements ``start..end-1`` (lines already end with \\n)."""
    if offsets is None:
        bounds = _offsets(lines)
        lo, hi = bounds[start].as_py(), bounds[end].as_py()
    else:
        lo, hi = offsets[start], offsets[end]
    data = lines.buffers()[2]
    return data[lo:hi].to_pybytes() if data is not None and hi > lo else b""


class LineEncoder:
    """Turns Arrow batches of the written DataFrame into per-partition runs of message lines."""

    def __init__(self, schema: StructType, cfg: WriteConfig, task: int) -> None:
        self.cfg = cfg
        self.mapper = RowMapper(schema, cfg)  # validates the columns (again) and does the slow path
        names = [n for n in schema.fieldNames() if n not in POSITION_COLUMNS]
        types = {f.name: f.dataType for f in schema.fields}
        self.fast = (
            "payload" in names
            and set(names) <= {"payload", "key"}
            and isinstance(types["payload"], StringType)
            and cfg.payload_format == "json"
            and ("key" not in names or isinstance(types["key"], StringType))
        )
        self.has_key = "key" in names
        self.ids = IdSource()
        self.rr = task  # unkeyed batches go round-robin over partitions, each task from its own start
        self._partition_cache: dict[str, int] = {}
        producer = _json_string(cfg.producer_id) if cfg.producer_id else "null"
        self._tail = (
            f',"content_type":"{JSON_CONTENT_TYPE}","created_at":{{ts}},"producer_id":{producer},'
            '"priority":0,"not_before":null,"dedup_id":null}\n'
        )

    def _partition(self, key: str) -> int:
        p = self._partition_cache.get(key)
        if p is None:
            if len(self._partition_cache) > 100_000:
                self._partition_cache.clear()
            p = self._partition_cache[key] = partition_for_key(key, self.cfg.partitions)
        return p

    def encode(self, batch: pa.RecordBatch) -> Iterator[tuple[int, pa.Array | list[bytes]]]:
        """Yield ``(partition, lines)``: an Arrow string array of lines each ending in ``\\n``
        (fast path) or a list of encoded lines without newline (message by message)."""
        if batch.num_rows == 0:
            return
        if self.fast:
            lines = self._fast_lines(batch)
            if lines is not None:
                yield from self._split(lines, batch)
                return
        yield from self._slow(batch)

    def _fast_lines(self, batch: pa.RecordBatch) -> pa.Array | None:
        texts = _validated_payloads(batch.column("payload"))
        if texts is None:
            return None
        n = batch.num_rows
        if self.has_key:
            keys = batch.column("key")
            needs_escape = pc.match_substring_regex(pc.fill_null(keys, ""), r'["\\\x00-\x1f\x7f]')
            if pc.any(needs_escape).as_py():
                key_json = pa.array(
                    [None if k is None else _json_string(k) for k in keys.to_pylist()], pa.string()
                )
            else:
                key_json = pc.binary_join_element_wise('"', keys, '"', "")
            key_json = pc.fill_null(key_json, "null")
        else:
            key_json = pa.scalar("null")
        tail = self._tail.replace("{ts}", repr(time.time()))
        lines = pc.binary_join_element_wise(
            '{"id":"', self.ids.take(n), '","key":', key_json, ',"headers":{},"payload":', texts, tail, ""
        )
        lengths = pc.subtract(pc.binary_length(lines), 1)
        too_big = pc.greater(lengths, self.cfg.max_message_bytes)
        if pc.any(too_big).as_py():
            first = pc.index(too_big, True).as_py()
            raise MessageTooLarge(lengths[first].as_py(), self.cfg.max_message_bytes)
        return lines

    def _split(self, lines: pa.Array, batch: pa.RecordBatch) -> Iterator[tuple[int, pa.Array]]:
        if not self.has_key or batch.column("key").null_count == batch.num_rows:
            self.rr += 1
            yield self.rr % self.cfg.partitions, lines
            return
        keys = batch.column("key").to_pylist()
        self.rr += 1
        unkeyed = self.rr % self.cfg.partitions
        parts = [unkeyed if k is None else self._partition(k) for k in keys]
        part_arr = pa.array(parts, pa.int32())
        for p in sorted(set(parts)):
            yield p, lines.filter(pc.equal(part_arr, p))

    def _slow(self, batch: pa.RecordBatch) -> Iterator[tuple[int, list[bytes]]]:
        out: dict[int, list[bytes]] = {}
        self.rr += 1
        unkeyed = self.rr % self.cfg.partitions
        for record in self.mapper.records(batch):
            line = encode_record(record, self.cfg.max_message_bytes)
            p = unkeyed if record.key is None else self._partition(record.key)
            out.setdefault(p, []).append(line)
        yield from sorted(out.items())


# -- chunks and uploads ----------------------------------------------------------------------------


class Uploader:
    """PUTs staged chunks from a background event loop while the task thread keeps encoding."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bucketq-stage", daemon=True)
        self.thread.start()
        self.storage: Storage = self._run(open_storage(settings_of(settings, strategy="conditional_write")))
        self.slots = threading.BoundedSemaphore(UPLOADS_IN_FLIGHT)
        self.pending: list[Future[str]] = []

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def put(self, key: str, body: bytes) -> None:
        self._raise_failed()
        self.slots.acquire()
        future = asyncio.run_coroutine_threadsafe(self.storage.overwrite(key, body), self.loop)
        future.add_done_callback(lambda _f: self.slots.release())
        self.pending.append(future)

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

    parts: list[bytes] = field(default_factory=list)
    count: int = 0
    size: int = 0


class ChunkWriter:
    """Cuts a partition's lines into chunks of at most ``batchMessages`` / ``batchBytes`` and stages them."""

    def __init__(self, cfg: WriteConfig, root: str, uploader: Uploader) -> None:
        self.cfg = cfg
        self.root = root
        self.uploader = uploader
        self.open: dict[int, _Open] = {}
        self.chunks: dict[int, list[StagedChunk]] = {}
        self.messages = 0
        self.payload_bytes = 0

    def add(self, partition: int, lines: pa.Array | list[bytes]) -> None:
        if isinstance(lines, list):
            for line in lines:
                self._take(partition, line + b"\n", 1)
            return
        offsets = _offsets(lines).to_pylist()
        n, i = len(lines), 0
        while i < n:
            cur = self.open.setdefault(partition, _Open())
            room_msgs = self.cfg.batch_messages - cur.count
            room_bytes = self.cfg.batch_bytes - cur.size
            # the most lines from i on that fit the chunk: j <= i + room_msgs, bytes <= room_bytes
            j = bisect.bisect_right(offsets, offsets[i] + room_bytes, i, min(n, i + room_msgs) + 1) - 1
            if j <= i:  # not even one more line fits
                if cur.count:
                    self._flush(partition)
                    continue
                j = i + 1  # a single line larger than batchBytes gets a chunk of its own
            self._append(partition, _body(lines, i, j, offsets), j - i)
            i = j

    def _take(self, partition: int, line: bytes, count: int) -> None:
        cur = self.open.setdefault(partition, _Open())
        if cur.count and (
            cur.count >= self.cfg.batch_messages or cur.size + len(line) > self.cfg.batch_bytes
        ):
            self._flush(partition)
        self._append(partition, line, count)

    def _append(self, partition: int, body: bytes, count: int) -> None:
        cur = self.open.setdefault(partition, _Open())
        cur.parts.append(body)
        cur.count += count
        cur.size += len(body)
        if cur.count >= self.cfg.batch_messages or cur.size >= self.cfg.batch_bytes:
            self._flush(partition)

    def _flush(self, partition: int) -> None:
        cur = self.open.pop(partition, None)
        if cur is None or not cur.count:
            return
        plain = b"".join(cur.parts)
        n = len(self.chunks.setdefault(partition, []))
        # Staged chunks are always compressed, whatever the topic gets: staging is private, and
        # this takes two of the three passes of the job's bytes through S3 (the staging PUT and
        # the commit's GET) down to a fraction; the commit inflates them for plain segments.
        header = SegmentHeader(
            self.cfg.topic,
            partition,
            n,
            cur.count,
            0,
            self.cfg.producer_id,
            time.time(),
            f"{self.cfg.run}-{partition}-{n}",
            codec=STAGING_CODEC,
        )
        body = compress_body(plain, STAGING_CODEC)
        data = encode_header(header) + b"\n" + body
        key = f"{self.root}/p{partition:04d}/{n:08d}.seg"
        self.uploader.put(key, data)
        self.chunks[partition].append(StagedChunk(key, cur.count, len(data)))
        self.messages += cur.count
        self.payload_bytes += len(plain)

    def finish(self) -> None:
        for partition in sorted(self.open):
            self._flush(partition)
        self.uploader.wait()


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


def stage_task(
    cfg: WriteConfig, schema: StructType, task: int, attempt: int, batches: Iterator[pa.RecordBatch]
) -> TaskCommit:
    """Stage one task attempt's rows; a failed attempt removes what it staged (best effort).

    The attempt's folder is new (run ids are unique, attempt numbers are unique within a run), so
    what it reports is exactly what it wrote.
    """
    started = time.monotonic()
    keys = keys_of(cfg.settings)
    root = keys.spark_staging(cfg.job, cfg.run, f"t{task:05d}-a{attempt}")
    encoder = LineEncoder(schema, cfg, task)
    uploader = Uploader(cfg.settings)
    try:
        writer = ChunkWriter(cfg, root, uploader)
        try:
            with paused_gc():
                for batch in batches:
                    for partition, lines in encoder.encode(batch):
                        writer.add(partition, lines)
                writer.finish()
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
                uploader.delete_prefix(root + "/")
            except Exception:
                pass  # the job's abort, its next run or garbage collection removes it
            raise
        stats = uploader.storage.stats.snapshot()
    finally:
        uploader.close()
    return TaskCommit(
        task, root, writer.chunks, writer.messages, stats, time.monotonic() - started, writer.payload_bytes
    )
