"""Job commits (core/txn.py): visibility rules for the engine's consumers, commit/abort races, GC,
and the optional segment header fields."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from bucketq import Bucketq, Settings
from bucketq.core.gc import collect_garbage
from bucketq.core.keys import Keys
from bucketq.core.segment import SegmentHeader, decode_segment, encode_header, encode_segment
from bucketq.core.segment_writer import SegmentWriter
from bucketq.core.topics import find_tail
from bucketq.core.txn import (
    Chunk,
    TxnPartition,
    TxnRecord,
    abort_txn,
    create_txn,
    read_txn,
    resolver_for,
    rewrite_txn,
    stable_limits,
    take_snapshot,
)
from bucketq.errors import AlreadyExists
from bucketq.storage import FileStore, Storage
from tests.support.store_time import TimeTravelStore

FAST = {"consumer": {"poll_min_ms": 5, "poll_max_ms": 40}, "producer": {"linger_ms": 5}}


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_dict(
        {"backend": "file", "file_path": str(tmp_path / "bucket"), "strategy": "conditional_write", **FAST}
    )


def _line(n: int) -> bytes:
    return json.dumps({"id": f"00000000-0000-7000-8000-{n:012d}", "payload": {"n": n}}).encode()


async def _append_chunk(storage: Storage, keys: Keys, record: TxnRecord, partition: int, chunk: int) -> int:
    """Append chunk ``chunk`` of ``record`` (messages numbered from ``chunk * 100``) the way a committer does."""
    lines = [_line(chunk * 100 + i) for i in range(3)]
    writer = SegmentWriter(storage, keys, record.topic, partition, "p")

    def encode(header: SegmentHeader) -> bytes:
        return encode_segment(dataclasses.replace(header, txn=record.id, chunk=chunk), lines)

    return (
        await writer.append(lines, f"{record.id}-{partition}-{chunk}-{time.monotonic()}", encode=encode)
    ).seq


async def _begin(
    storage: Storage, keys: Keys, topic: str, txn: str, chunks: int, timeout_s: float = 60.0
) -> tuple[TxnRecord, str]:
    start, _ = await find_tail(storage, keys, topic, 0)
    record = TxnRecord(
        txn,
        topic,
        job=txn.split(".")[0],
        owner="run-1",
        timeout_s=timeout_s,
        partitions={0: TxnPartition(start, [Chunk(3, 0, f"src-{i}") for i in range(chunks)])},
    )
    return record, await create_txn(storage, keys, record)


async def _receive(bq: Bucketq, consumer: Any, want: int, wait_s: float = 3.0) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and len(got) < want:
        batch = await consumer.poll(max_messages=50, wait=0.3)
        got += batch
        await asyncio.gather(*(m.ack() for m in batch))
    return got


def _numbers(messages: list[Any]) -> list[int]:
    return [m.payload["n"] for m in messages]


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_consumer_stops_at_pending_and_sees_each_committed_chunk_once(tmp_path: Path) -> None:
    async with Bucketq(_settings(tmp_path)) as bq:
        await bq.create_topic("jobs", partitions=1)
        producer = await bq.register_producer("plain")
        for n in range(5):
            await producer.publish("jobs", {"n": -1 - n})
        storage, keys = bq.storage, Keys(bq.settings.root)
        record, etag = await _begin(storage, keys, "jobs", "job-a.000001", chunks=2)
        first = await _append_chunk(storage, keys, record, 0, 0)
        stray = await _append_chunk(storage, keys, record, 0, 0)  # a retried append: only one copy counts
        await producer.publish("jobs", {"n": 1000})  # an ordinary publish behind the transaction
        second = await _append_chunk(storage, keys, record, 0, 1)
        assert first < stray < second

        consumer = await bq.register_consumer("worker", "jobs")
        before = await _receive(bq, consumer, 99, wait_s=1.5)
        # everything before the transaction, nothing from it on (not even the later plain publish)
        assert sorted(_numbers(before)) == [-5, -4, -3, -2, -1]

        record.partitions[0].chunks[0].seq, record.partitions[0].chunks[1].seq = first, second
        record.state = "committed"
        _, _, won = await rewrite_txn(storage, keys, record, etag)
        assert won
        after = await _receive(bq, consumer, 7)
        assert sorted(_numbers(after)) == [0, 1, 2, 100, 101, 102, 1000]
        assert await _receive(bq, consumer, 1, wait_s=0.5) == []
        await consumer.close()


async def test_aborted_and_expired_transactions_are_skipped(tmp_path: Path) -> None:
    async with Bucketq(_settings(tmp_path)) as bq:
        await bq.create_topic("jobs", partitions=1)
        storage, keys = bq.storage, Keys(bq.settings.root)
        aborted, _ = await _begin(storage, keys, "jobs", "job-b.000001", chunks=1)
        await _append_chunk(storage, keys, aborted, 0, 0)
        assert (
            await abort_txn(storage, keys, "jobs", aborted.id, "test", only_expired=False)
        ).state == "aborted"  # type: ignore[union-attr]
        # a committer that died: pending with a short timeout; the reader aborts it once it expired
        dead, _ = await _begin(storage, keys, "jobs", "job-c.000001", chunks=1, timeout_s=0.5)
        await _append_chunk(storage, keys, dead, 0, 0)
        producer = await bq.register_producer("plain")
        await producer.publish("jobs", {"n": 7})
        assert await stable_limits(storage, keys, "jobs", abort_expired=False) == {
            0: dead.partitions[0].start
        }

        consumer = await bq.register_consumer("worker", "jobs")
        assert await _receive(bq, consumer, 1, wait_s=0.3) == []  # stopped at the pending one
        await asyncio.sleep(0.6)
        got = await _receive(bq, consumer, 1)
        assert _numbers(got) == [7]
        found = await read_txn(storage, keys, "jobs", dead.id)
        assert found is not None and found[0].state == "aborted" and "timed out" in (found[0].reason or "")
        assert await stable_limits(storage, keys, "jobs") == {}
        await consumer.close()


async def test_commit_and_abort_race_exactly_one_wins(tmp_path: Path) -> None:
    """Exactly one of a committer's If-Match commit and another's If-Match abort wins (file backend:
    its conditional writes are atomic across processes and tasks)."""
    async with Bucketq(_settings(tmp_path)) as bq:
        await bq.create_topic("race", partitions=1)
        storage, keys = bq.storage, Keys(bq.settings.root)
        for n in range(1, 21):
            record, etag = await _begin(storage, keys, "race", f"job-r.{n:06d}", chunks=1)
            committing = dataclasses.replace(record, state="committed")
            committed, aborted = await asyncio.gather(
                rewrite_txn(storage, keys, committing, etag),
                abort_txn(storage, keys, "race", record.id, "race", only_expired=False),
            )
            final = await read_txn(storage, keys, "race", record.id)
            assert final is not None
            assert final[0].state in ("committed", "aborted")
            assert committed[2] == (final[0].state == "committed")
            assert aborted is not None and aborted.state == final[0].state
        with pytest.raises(AlreadyExists):
            await create_txn(storage, keys, TxnRecord("job-r.000001", "race"))


async def test_latest_subscription_made_while_a_job_commits_gets_all_of_it(tmp_path: Path) -> None:
    """A ``latest`` subscription that starts while a transaction is pending (chunks already below
    the tail) receives the whole job once it commits: all or nothing, never the later chunks only."""
    async with Bucketq(_settings(tmp_path)) as bq:
        await bq.create_topic("jobs", partitions=1)
        storage, keys = bq.storage, Keys(bq.settings.root)
        producer = await bq.register_producer("p")
        await producer.publish("jobs", "before")
        record, etag = await _begin(storage, keys, "jobs", "job-x.000001", chunks=2)
        record.partitions[0].chunks[0].seq = await _append_chunk(storage, keys, record, 0, 0)
        consumer = await bq.register_consumer("late", "jobs", start_position="latest")
        record.partitions[0].chunks[1].seq = await _append_chunk(storage, keys, record, 0, 1)
        record.state = "committed"
        await rewrite_txn(storage, keys, record, etag)
        got = await _receive(bq, consumer, 6, wait_s=10.0)
        payloads = sorted(m.payload["n"] for m in got if isinstance(m.payload, dict))
        assert payloads == [0, 1, 2, 100, 101, 102]


async def test_gc_aborts_expired_keeps_resolved_records_and_collects_staging(tmp_path: Path) -> None:
    """Resolved records are a job's memory: kept even when their segments are gone (a rerun of the
    jobId must find the commit, and no id is ever taken twice); only leftovers of runs go. GC's
    ages are the store's (docs/protocol.md, I15): time passes on the store's clock."""
    store = TimeTravelStore(FileStore(tmp_path / "bucket"))
    async with Bucketq(_settings(tmp_path), store=store) as bq:
        await bq.create_topic("gc", partitions=1)
        storage, keys = bq.storage, Keys(bq.settings.root)
        expired, _ = await _begin(storage, keys, "gc", "job-e.000001", chunks=1, timeout_s=1.0)
        live, _ = await _begin(storage, keys, "gc", "job-l.000001", chunks=1, timeout_s=10 * 86_400)
        live_src = keys.spark_staging("job-l", "run-1", "t00000-a0") + "/p0000/00000000.seg"
        live.partitions[0].chunks[0].src = live_src
        found = await read_txn(storage, keys, "gc", live.id)
        assert found is not None
        await rewrite_txn(storage, keys, live, found[1])
        committed, etag = await _begin(storage, keys, "gc", "job-k.000001", chunks=1)
        committed.partitions[0].chunks[0].seq = await _append_chunk(storage, keys, committed, 0, 0)
        committed.state = "committed"
        await rewrite_txn(storage, keys, committed, etag)
        dead_src = keys.spark_staging("job-d", "run-9", "t00000-a0") + "/p0000/00000000.seg"
        await storage.overwrite(dead_src, b"x")
        await storage.overwrite(live_src, b"x")

        store.advance(5)
        report = await collect_garbage(storage, keys)
        assert (await read_txn(storage, keys, "gc", expired.id))[0].state == "aborted"  # type: ignore[index]
        # staging is young: kept
        assert await storage.head(dead_src) is not None

        # the committed transaction's segment is collected (as retention would)
        await storage.delete([keys.segment("gc", 0, committed.partitions[0].chunks[0].seq or 0)])
        store.advance(2 * 86_400)
        report = await collect_garbage(storage, keys)
        still_aborted = await read_txn(storage, keys, "gc", expired.id)
        assert still_aborted is not None and still_aborted[0].state == "aborted"  # aborted long ago: kept
        still_committed = await read_txn(storage, keys, "gc", committed.id)
        assert still_committed is not None and still_committed[0].state == "committed"  # segments gone: kept
        assert await storage.head(dead_src) is None  # abandoned staging of a dead run
        assert await storage.head(live_src) is not None  # named by a pending transaction
        assert report.transactions >= 1


async def test_a_pending_record_expires_on_the_stores_clock_not_the_committers(tmp_path: Path) -> None:
    """I15: a pending record's age is the store's time minus its Last-Modified. A committer whose
    clock runs an hour behind (its ``updated_at`` an hour old: the same as a reader whose clock
    runs an hour ahead) wrote the record a moment ago: no reader, consumer or GC aborts it.
    Once it is older than its timeout on the store's clock, a reader does. Before, readers
    compared their own clock with ``updated_at`` and aborted a live commit."""
    store = TimeTravelStore(FileStore(tmp_path / "bucket"))
    async with Bucketq(_settings(tmp_path), store=store) as bq:
        await bq.create_topic("jobs", partitions=1)
        storage, keys = bq.storage, Keys(bq.settings.root)
        record = TxnRecord(
            "job-s.000001",
            "jobs",
            job="job-s",
            owner="run-1",
            created_at=time.time() - 3600,
            timeout_s=900,
            partitions={0: TxnPartition(0, [Chunk(3, 0, "src-0")])},
        )
        await create_txn(storage, keys, record)
        assert [r.state for r in (await take_snapshot(storage, keys, "jobs")).records.values()] == ["pending"]
        assert (await resolver_for(storage, keys, "jobs").record(record.id)).state == "pending"  # type: ignore[union-attr]
        assert (await abort_txn(storage, keys, "jobs", record.id, "test")).state == "pending"  # type: ignore[union-attr]
        await collect_garbage(storage, keys)
        found = await read_txn(storage, keys, "jobs", record.id)
        assert found is not None and found[0].state == "pending" and found[0].modified is not None

        store.advance(901)  # past its timeout on the store's clock
        async with Bucketq(_settings(tmp_path), store=store) as reader:  # a reader starting now
            snapshot = await take_snapshot(reader.storage, keys, "jobs")
            [aborted] = snapshot.records.values()
            assert aborted.state == "aborted" and "timed out" in (aborted.reason or "")


def test_segment_header_fields_are_optional() -> None:
    header = SegmentHeader("t", 0, 3, 1, 10, "p", 1.5, "b")
    plain = encode_segment(header, [b'{"id":"x","payload":1}'])
    assert plain == (
        b'{"v":1,"topic":"t","partition":0,"seq":3,"producer_id":"p","created_at":1.5,"count":1,"base":10,'
        b'"batch":"b"}\n{"id":"x","payload":1}\n'
    )
    lines = [_line(i) for i in range(50)]
    packed = encode_segment(
        dataclasses.replace(header, count=50, txn="j.000001", chunk=2, codec="zlib"), lines
    )
    assert encode_header(decode_segment(packed).header).startswith(packed.split(b"\n", 1)[0])
    segment = decode_segment(packed)
    assert (segment.header.txn, segment.header.chunk, segment.header.codec) == ("j.000001", 2, "zlib")
    assert [r.payload["n"] for r in segment.records] == list(range(50))
    assert len(packed) < len(encode_segment(dataclasses.replace(header, count=50), lines)) / 3
