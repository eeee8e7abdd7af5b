"""Format 5: columnar chunks, reference segments, the planners' transaction snapshot (I17), chunk
GC (I18), refusals of what a reader cannot read (I19).

Chunks and reference segments are built with the engine's own encoders, committed the way the
Spark job commit does (record pending, reference segment appended, record committed), and read
by the engine's consumers, its loaders and GC.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from bucketq import Bucketq, Settings
from bucketq.core.chunks import (
    CHUNK_VERSION,
    ChunkRef,
    CorruptChunk,
    chunk_records,
    decode_chunk,
    encode_chunk,
    uuid_bytes,
    uuid_texts,
)
from bucketq.core.gc import collect_garbage
from bucketq.core.keys import Keys
from bucketq.core.refsegment import (
    created_at_of,
    decode_refs,
    encode_ref_segment,
    load_or_stand_in,
    load_segment,
)
from bucketq.core.segment import (
    REF_CODEC,
    ChunkedSegment,
    SegmentHeader,
    UnsupportedSegment,
    decode_header,
    decode_segment,
)
from bucketq.core.segment_writer import SegmentWriter
from bucketq.core.topics import find_tail
from bucketq.core.txn import (
    Chunk,
    TxnPartition,
    TxnRecord,
    TxnSnapshot,
    abort_txn,
    create_txn,
    rewrite_txn,
    stream_ends,
    take_snapshot,
    whole_transactions,
)
from bucketq.storage import FileStore, MemoryStore, Storage
from tests.engine.test_txn import _receive
from tests.support.store_time import TimeTravelStore

TS = pa.timestamp("us", tz="UTC")
FAST = {"consumer": {"poll_min_ms": 5, "poll_max_ms": 40}, "producer": {"linger_ms": 5}}


def _table(first: int, n: int, **extra: pa.Array) -> pa.Table:
    """``n`` messages whose payloads are ``{"n": first + i}`` (with a space: kept exactly)."""
    cols: dict[str, pa.Array] = {
        "id": pa.array([str(uuid.UUID(int=(7 << 76) | (first + i))) for i in range(n)]),
        "payload": pa.array([f'{{"n": {first + i}}}' for i in range(n)]),
        "created_at": pa.array([1_700_000_000_000_000 + first + i for i in range(n)], pa.int64()).cast(TS),
        "producer_id": pa.array(["p-1"] * n),
    }
    cols.update(extra)
    return pa.table(cols)


def test_chunk_round_trip_keeps_every_field_and_stores_constants_once() -> None:
    n = 6
    table = _table(
        0,
        n,
        key=pa.array(["a", None, "a", "b", None, "a"]),
        headers=pa.array(['{"h":"1"}', "{}", '{"h":"1"}', "{}", "{}", '{"x":"é"}']),
        data=pa.array([None, b"\x00\xff", None, None, None, None], pa.binary()),
        content_type=pa.array(["application/json"] * n),
        priority=pa.array([0, 0, 2, 0, 0, 0], pa.int32()),
        not_before=pa.array([None] * n, pa.int64()).cast(TS),
        dedup_id=pa.array([None, None, "d-1", None, None, None]),
    )
    data = encode_chunk(table)
    chunk = decode_chunk(data)
    # constants are stored once, in the chunk's defaults, not per message
    assert not chunk.has("producer_id") and chunk.default("producer_id") == "p-1"
    assert not chunk.has("content_type") and not chunk.has("not_before")
    assert chunk.table.schema.field("id").type == pa.binary(16)  # canonical UUIDs: 16 bytes each
    assert isinstance(chunk.table.schema.field("key").type, pa.DictionaryType)
    records = chunk_records(chunk)
    assert [r.id for r in records] == table.column("id").to_pylist()
    assert [r.key for r in records] == ["a", None, "a", "b", None, "a"]
    assert [dict(r.headers) for r in records][5] == {"x": "é"}
    assert records[1].data == b"\x00\xff" and records[1].payload is None
    assert records[0].payload == {"n": 0} and records[2].priority == 2 and records[2].dedup_id == "d-1"
    assert records[3].created_at == 1_700_000_000.000003
    assert all(r.producer_id == "p-1" and r.not_before is None for r in records)
    # the payload's JSON text is stored exactly as given (a read hands out these bytes)
    assert decode_chunk(data, ["payload"]).table.column("payload").to_pylist()[0] == '{"n": 0}'
    assert decode_chunk(data, ["payload"]).table.column_names == ["payload"]


def test_ids_that_are_not_canonical_uuids_are_kept_as_text() -> None:
    ids = ["x-1", "0190A1B2-0000-7000-8000-000000000000"]
    chunk = decode_chunk(encode_chunk(_table(0, 2).set_column(0, "id", pa.array(ids))))
    assert chunk.table.schema.field("id").type == pa.string()
    assert [r.id for r in chunk_records(chunk)] == ids
    texts = pa.array([str(uuid.uuid4()) for _ in range(1000)])
    binary = uuid_bytes(texts)
    assert binary is not None and uuid_texts(binary).equals(texts)
    assert uuid_texts(binary.slice(10, 5)).to_pylist() == texts.to_pylist()[10:15]
    assert uuid_bytes(pa.array(["not-a-uuid"])) is None


def test_newer_and_corrupt_chunks_are_refused_not_misread() -> None:
    """I19: a newer chunk format is refused (UnsupportedSegment), a corrupt one is CorruptChunk."""
    data = encode_chunk(_table(0, 3))
    assert decode_chunk(data).rows == 3
    table = _table(0, 3)
    schema = table.schema.with_metadata({b"bucketq.chunk": str(CHUNK_VERSION + 1).encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(table.cast(schema))
    with pytest.raises(UnsupportedSegment, match="upgrade bucketq"):
        decode_chunk(bytes(sink.getvalue()))
    with pytest.raises(CorruptChunk):
        decode_chunk(data[:40])


def _ref_header(topic: str, seq: int, count: int, **over: Any) -> SegmentHeader:
    return SegmentHeader(topic, 0, seq, count, 0, "p-1", 1.0, "b", codec=REF_CODEC, **over)


async def _put_chunk(storage: Storage, keys: Keys, topic: str, name: str, first: int, n: int) -> ChunkRef:
    body = encode_chunk(_table(first, n))
    etag = await storage.overwrite(keys.chunk(topic, name), body)
    base = 1_700_000_000_000_000
    return ChunkRef(name, etag, n, len(body), base + first, base + first + n - 1)


async def test_reference_segment_loads_its_chunks_in_order_and_checks_them() -> None:
    storage, keys = Storage(MemoryStore()), Keys()
    refs = [
        await _put_chunk(storage, keys, "t", f"j/r/t0-a0/p0000-{i:06d}.arrow", 10 * i, 10) for i in range(3)
    ]
    data = encode_ref_segment(_ref_header("t", 0, 30), refs)
    header = decode_header(data)
    assert header.is_reference and json.loads(data.split(b"\n")[0])["v"] == 2
    assert decode_refs(data) == refs
    with pytest.raises(ChunkedSegment):  # never read as message lines
        decode_segment(data)
    segment = await load_segment(storage, keys, data)
    assert [r.payload["n"] for r in segment.records] == list(range(30))
    with pytest.raises(ValueError, match="count"):
        encode_ref_segment(_ref_header("t", 0, 29), refs)
    # a chunk that changed (or is missing) is not the one the segment names
    await storage.overwrite(keys.chunk("t", refs[1].name), encode_chunk(_table(500, 10)))
    with pytest.raises(CorruptChunk, match="not the one"):
        await load_segment(storage, keys, data)
    stand_in = await load_or_stand_in(storage, keys, data, "t", 0, 0)
    assert stand_in.records == [] and stand_in.header.count == 30  # entered as corrupt (I8), counted
    await storage.delete([keys.chunk("t", refs[1].name)])
    with pytest.raises(CorruptChunk, match="missing"):
        await load_segment(storage, keys, data)
    # a hidden reference segment (its transaction does not show it) reads no chunk at all
    hidden = await load_or_stand_in(storage, keys, data, "t", 0, 0, hidden=True)
    assert hidden.hidden and hidden.records == []


async def test_the_oldest_waiting_message_is_read_from_its_one_chunk(tmp_path: Path) -> None:
    """Statistics read the age of a partition's oldest waiting message from the one chunk that
    holds it; an aborted job's reference segment, whose chunks its abort deleted, does not fail
    them (it did: the whole segment was loaded, and a missing chunk raised)."""
    storage, keys = Storage(MemoryStore()), Keys()
    refs = [
        await _put_chunk(storage, keys, "t", f"j/r/t0-a0/p0000-{i:06d}.arrow", 10 * i, 10) for i in range(3)
    ]
    data = encode_ref_segment(_ref_header("t", 0, 30), refs)
    assert await created_at_of(storage, keys, data, set(range(12))) == 1_700_000_000.000012
    assert await created_at_of(storage, keys, data, set(range(30))) is None
    await storage.delete([keys.chunk("t", refs[0].name)])  # only chunk 1 is read
    assert (
        await created_at_of(storage, keys, data, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) == 1_700_000_000.000011
    )
    assert await created_at_of(storage, keys, data, set()) is None  # its chunk is gone
    async with Bucketq(_settings(tmp_path)) as bq:
        await bq.create_topic("jobs", partitions=1)
        await bq.init_subscription("jobs", "worker")
        aborted = await _commit_job(bq.storage, bq.keys, "jobs", "job-a", [(0, 0)], commit=False)
        await abort_txn(bq.storage, bq.keys, "jobs", aborted.id, "test", only_expired=False)
        await bq.storage.delete([k async for k in _keys(bq.storage, bq.keys.chunks_prefix("jobs"))])
        await _commit_job(bq.storage, bq.keys, "jobs", "job-b", [(0, 100)])
        [stats] = await bq.stats("jobs", "worker")
        assert stats.backlog == 10 and stats.oldest_age_s is None  # the aborted one's is unknown


async def test_a_segment_of_a_newer_version_is_refused_by_consumers() -> None:
    """An older reader refuses what it cannot read, loudly, and never takes it for a corrupt
    segment to skip (that would lose its messages; I19)."""
    storage, keys = Storage(MemoryStore()), Keys()
    newer = b'{"v":3,"topic":"t","partition":0,"seq":0,"count":2,"base":0,"batch":"b"}\nwhatever\n'
    with pytest.raises(UnsupportedSegment, match="upgrade bucketq"):
        await load_or_stand_in(storage, keys, newer, "t", 0, 0)
    codec = b'{"v":1,"topic":"t","partition":0,"seq":0,"count":2,"base":0,"batch":"b","codec":"lz9"}\nx\n'
    with pytest.raises(UnsupportedSegment, match="lz9"):
        await load_or_stand_in(storage, keys, codec, "t", 0, 0)


# -- a job committed with reference segments, read by the engine ----------------------------------


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_dict(
        {"backend": "file", "file_path": str(tmp_path / "bucket"), "strategy": "conditional_write", **FAST}
    )


async def _commit_job(
    storage: Storage,
    keys: Keys,
    topic: str,
    job: str,
    chunks: list[tuple[int, int]],
    *,
    commit: bool = True,
    timeout_s: float = 900.0,
) -> TxnRecord:
    """A job as the Spark commit makes it: chunks first, record pending, one reference segment per
    partition, record committed (or left pending, or aborted when ``commit`` is False)."""
    by_partition: dict[int, list[ChunkRef]] = {}
    for i, (partition, first) in enumerate(chunks):
        ref = await _put_chunk(
            storage, keys, topic, f"{job}/run/t0-a0/p{partition:04d}-{i:06d}.arrow", first, 5
        )
        by_partition.setdefault(partition, []).append(ref)
    partitions = {}
    for p, refs in by_partition.items():
        start, _ = await find_tail(storage, keys, topic, p)
        partitions[p] = TxnPartition(start, [Chunk(sum(r.count for r in refs), 0, refs=refs)])
    record = TxnRecord(
        f"{job}.000001", topic, job=job, owner="run", timeout_s=timeout_s, partitions=partitions
    )
    etag = await create_txn(storage, keys, record)
    for p, part in record.partitions.items():
        entry = part.chunks[0]
        writer = SegmentWriter(storage, keys, topic, p, "p-1")

        def encode(header: SegmentHeader, entry: Chunk = entry) -> bytes:
            return encode_ref_segment(
                dataclasses.replace(header, txn=record.id, chunk=0, codec=REF_CODEC), entry.refs
            )

        landed = await writer.append([b""] * entry.count, f"{record.id}-{p}", encode=encode)
        entry.seq, entry.base = landed.seq, landed.base
    if commit:
        record.state = "committed"
        await rewrite_txn(storage, keys, record, etag)
    return record


@pytest.mark.slow  # consumes with wall-clock polls
async def test_consumers_read_committed_reference_segments_and_skip_aborted_ones(tmp_path: Path) -> None:
    async with Bucketq(_settings(tmp_path)) as bq:
        await bq.create_topic("jobs", partitions=2)
        storage, keys = bq.storage, bq.keys
        producer = await bq.register_producer("plain")
        await producer.publish("jobs", {"n": -1}, key="x")
        aborted = await _commit_job(storage, keys, "jobs", "job-a", [(0, 1000), (1, 1005)], commit=False)
        await abort_txn(storage, keys, "jobs", aborted.id, "test", only_expired=False)
        await _commit_job(storage, keys, "jobs", "job-b", [(0, 0), (1, 5), (0, 10)])
        # peek (and the engine's redrive, which walks segments the same way) reads the chunks too
        peeked = sorted(m.record.payload["n"] for m in await bq.peek("jobs", limit=100))
        assert peeked == [-1, *range(15)]
        consumer = await bq.register_consumer("worker", "jobs")
        got = await _receive(bq, consumer, 16)
        numbers = sorted(m.payload["n"] for m in got)
        assert numbers == [-1, *range(15)]
        offsets = {(m.partition, m.offset) for m in got}
        assert len(offsets) == 16  # positions and offsets of reference segments are ordinary ones
        assert await _receive(bq, consumer, 1, wait_s=0.5) == []
        [stats] = await bq.stats("jobs", "worker")
        assert stats.backlog == 0 and stats.acked == 16
        await consumer.close()


# -- the planners' snapshot and the streams' offsets -----------------------------------------------


def _record(txn: str, state: str, partitions: dict[int, tuple[int, list[int | None]]]) -> TxnRecord:
    parts = {
        p: TxnPartition(start, [Chunk(1, seq=s) for s in seqs]) for p, (start, seqs) in partitions.items()
    }
    return TxnRecord(txn, "t", state=state, partitions=parts)  # type: ignore[arg-type]


def test_a_pending_transaction_hides_only_its_own_segments() -> None:
    """Finding 2: B pending, its ``start`` inside committed A. Planned reads show all of A; a
    stream's offsets keep A whole (all of it in one micro-batch, once B resolves) and stay below B."""
    a = _record("a.000001", "committed", {0: (10, [10, 13]), 1: (20, [21])})
    b = _record("b.000001", "pending", {0: (12, [None]), 1: (20, [None])})
    snapshot = TxnSnapshot({a.id: a, b.id: b})
    assert set(snapshot.shown()) == {(0, 10), (0, 13), (1, 21)}
    ends = stream_ends(snapshot, {0: 15, 1: 23})
    assert ends == {0: 10, 1: 20}  # cut at B's starts, A then excluded whole (not 2 of its 3 segments)
    b.state = "aborted"
    assert stream_ends(snapshot, {0: 15, 1: 23}) == {0: 15, 1: 23}
    # a stream batch capped inside A takes all of A instead
    assert whole_transactions(snapshot, {0: 11, 1: 20}, {0: 15, 1: 23}) == {0: 14, 1: 22}
    assert whole_transactions(snapshot, {0: 9, 1: 20}, {0: 15, 1: 23}) == {0: 9, 1: 20}


async def test_snapshot_reads_records_once_resolved_and_aborts_expired_ones() -> None:
    storage, keys = Storage(MemoryStore()), Keys()
    record = TxnRecord("j.000001", "t", job="j", owner="r", timeout_s=0.05, partitions={0: TxnPartition(0)})
    await create_txn(storage, keys, record)
    snapshot = await take_snapshot(storage, keys, "t", abort_expired=False)
    assert [r.state for r in snapshot.records.values()] == ["pending"]
    await asyncio.sleep(0.1)
    snapshot = await take_snapshot(storage, keys, "t")
    assert [r.state for r in snapshot.records.values()] == ["aborted"]


# -- garbage collection ----------------------------------------------------------------------------


async def test_gc_collects_chunks_with_their_reference_segment_and_leftovers_after_a_day(
    tmp_path: Path,
) -> None:
    """I18: a committed job's chunk lives as long as its reference segment; leftovers go after a
    day. GC's ages are the store's (I15): time passes on the store's clock."""
    store = TimeTravelStore(FileStore(tmp_path / "bucket"))
    async with Bucketq(_settings(tmp_path), store=store) as bq:
        await bq.create_topic("gc", partitions=1)
        storage, keys = bq.storage, bq.keys
        committed = await _commit_job(storage, keys, "gc", "job-k", [(0, 0), (0, 5)])
        pending = await _commit_job(storage, keys, "gc", "job-p", [(0, 100)], commit=False, timeout_s=9e6)
        left = await _put_chunk(storage, keys, "gc", "job-d/run/t0-a1/p0000-000000.arrow", 200, 5)
        named = [r.name for c in committed.partitions[0].chunks for r in c.refs]
        pending_names = [r.name for c in pending.partitions[0].chunks for r in c.refs]

        async def stored() -> set[str]:
            prefix = keys.chunks_prefix("gc")
            return {i.key[len(prefix) :] async for i in storage.list(prefix)}

        store.advance(60)
        await collect_garbage(storage, keys)
        assert await stored() == {*named, *pending_names, left.name}  # all young or named
        store.advance(2 * 86_400)
        await collect_garbage(storage, keys)
        assert await stored() == {*named, *pending_names}  # the dead run's leftover went
        # retention frees the committed reference segment: its chunks go with it, never before
        seq = committed.partitions[0].chunks[0].seq
        assert seq is not None
        from bucketq.core.fences import FenceValue, raise_fence

        await raise_fence(storage, keys.segment_floor("gc", 0), FenceValue(seq + 1, 10, time.time()))
        store.advance(60)
        await collect_garbage(storage, keys)
        assert set(named) <= await stored()  # below the floor, but the segment is still stored
        await storage.delete([keys.segment("gc", 0, seq)])
        store.advance(60)
        await collect_garbage(storage, keys)
        assert await stored() == set(pending_names)


async def _keys(storage: Storage, prefix: str) -> AsyncIterator[str]:
    async for info in storage.list(prefix):
        yield info.key
