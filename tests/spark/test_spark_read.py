"""Batch read: every published message, exact schema, filters, splits, consumer state."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest

from bucketq import Bucketq, PublishResult, Settings
from bucketq.spark.options import ReadConfig, settings_options
from bucketq.spark.planning import plan_read
from bucketq.spark.reader import BATCH_ROWS
from bucketq.spark.runtime import keys_of, storage_for
from bucketq.spark.schema import message_schema
from tests.spark.spark_helpers import publish_many
from tests.support.servers import S3Server

pytestmark = [pytest.mark.spark, pytest.mark.s3]

# 30,000 messages in segments of up to 1,000: 8 to 9 segments per partition (the seq filters below
# cut inside every partition), and splits of more than BATCH_ROWS when read in two (see ``table``)
N = 30_000
SEGMENT_MESSAGES = 1000
PARTITIONS = 4
TABLE_SPLITS = {"minPartitions": 2}


def make(i: int) -> dict[str, Any]:
    """Message ``i``: mostly JSON, every third keyed, every fifth with a header, a few raw bytes."""
    msg: dict[str, Any] = {"payload": {"n": i, "even": i % 2 == 0}}
    if i % 1000 == 7:
        msg = {"data": bytes([i % 256, 0, 255])}
    if i % 3 == 0:
        msg["key"] = f"customer-{i % 97}"
    if i % 5 == 0:
        msg["headers"] = {"trace": f"t{i}"}
    return msg


@pytest.fixture(scope="module")
def published(moto_server: S3Server) -> tuple[Settings, list[PublishResult]]:
    settings = moto_server.settings(strategy="conditional_write")
    results = asyncio.run(
        publish_many(
            settings, "events", N, partitions=PARTITIONS, make=make, segment_messages=SEGMENT_MESSAGES
        )
    )
    return settings, results


def _read(spark: Any, settings: Settings, **options: Any) -> Any:
    return (
        spark.read.format("bucketq")
        .options(**settings_options(settings))
        .option("topic", "events")
        .options(**{k: str(v) for k, v in options.items()})
        .load()
    )


async def _split_rows(settings: Settings, results: list[PublishResult], **options: Any) -> list[int]:
    """How many messages each split of a read with ``options`` holds (the planner's own plan)."""
    cfg = ReadConfig.from_options(
        settings_options(settings) | {"topic": "events"} | {k: str(v) for k, v in options.items()}
    )
    per_segment = Counter((r.partition, r.seq) for r in results)
    async with storage_for(cfg.settings) as storage:
        plan = await plan_read(storage, keys_of(cfg.settings), cfg)
    return [sum(per_segment[(i.partition, i.seq)] for i in split.items) for split in plan.splits]


@pytest.fixture(scope="module")
def table(spark: Any, published: tuple[Settings, list[PublishResult]]) -> Any:
    """The whole topic read by Spark, as an Arrow table. A split holds more than the reader's
    BATCH_ROWS messages, so a task also hands Spark a batch before its split is done."""
    settings, results = published
    assert max(asyncio.run(_split_rows(settings, results, **TABLE_SPLITS))) > BATCH_ROWS
    return _read(spark, settings, **TABLE_SPLITS).toArrow()


def test_read_equals_what_the_engine_published(
    table: Any, published: tuple[Settings, list[PublishResult]]
) -> None:
    _, results = published
    assert table.num_rows == N
    rows = table.to_pylist()
    by_id = {r["id"]: r for r in rows}
    assert len(by_id) == N
    for i, res in enumerate(results):
        row = by_id[res.id]
        assert (row["partition"], row["seq"], row["index"], row["offset"]) == (
            res.partition,
            res.seq,
            res.index,
            res.offset,
        )
        want = make(i)
        assert row["topic"] == "events"
        assert row["key"] == want.get("key")
        assert dict(row["headers"]) == want.get("headers", {})
        if "data" in want:
            assert row["data"] == want["data"] and row["payload"] is None
            assert row["content_type"] == "application/octet-stream"
        else:
            assert json.loads(row["payload"]) == want["payload"] and row["data"] is None
            assert row["content_type"] == "application/json"
    assert {r["partition"] for r in rows} == set(range(PARTITIONS))


def test_schema_is_exact(spark: Any, published: tuple[Settings, list[PublishResult]]) -> None:
    settings, _ = published
    assert _read(spark, settings).schema == message_schema()
    assert _read(spark, settings, consumer="nobody").schema == message_schema(with_state=True)


def test_filters_by_partition_seq_and_time(
    spark: Any, table: Any, published: tuple[Settings, list[PublishResult]]
) -> None:
    settings, results = published
    assert _read(spark, settings, partitions="1,3").count() == sum(r.partition in (1, 3) for r in results)
    assert _read(spark, settings, startSeq=2, endSeq=5).count() == sum(2 <= r.seq < 5 for r in results)
    pushed = _read(spark, settings).where("partition = 2 AND seq >= 3 AND seq < 6")
    assert pushed.count() == sum(r.partition == 2 and 3 <= r.seq < 6 for r in results)
    assert _read(spark, settings).where("partition IN (0, 3)").count() == sum(
        r.partition in (0, 3) for r in results
    )

    times = sorted(table.column("created_at").to_pylist())
    cut, end = times[N // 3], times[2 * N // 3]
    expected = sum(cut <= t < end for t in times)
    assert _read(spark, settings, since=cut.isoformat(), until=end.isoformat()).count() == expected
    where = _read(spark, settings).where(
        f"created_at >= '{cut.isoformat()}' AND created_at < '{end.isoformat()}'"
    )
    assert where.count() == expected


def test_planning_groups_segments_by_size(
    spark: Any, published: tuple[Settings, list[PublishResult]]
) -> None:
    settings, _ = published
    segments = len({(r.partition, r.seq) for r in published[1]})
    assert _read(spark, settings, splitBytes=1).rdd.getNumPartitions() == segments
    assert _read(spark, settings, splitBytes=10**9, minPartitions=1).rdd.getNumPartitions() == 1
    assert _read(spark, settings, splitBytes=10**9, minPartitions=3).rdd.getNumPartitions() in (3, 4)


def test_consumer_state_column(spark: Any, moto_server: S3Server) -> None:
    settings = moto_server.settings(
        strategy="conditional_write", consumer={"poll_min_ms": 5, "poll_max_ms": 40, "max_in_flight": 20}
    )
    results = asyncio.run(publish_many(settings, "work", 60, partitions=2))

    async def consume() -> tuple[set[str], set[str], set[str]]:
        acked, dead, held = set(), set(), set()
        async with Bucketq(settings) as bq:
            consumer = await bq.register_consumer("billing", "work")
            got: list[Any] = []
            while len(got) < 20:
                got += await consumer.poll(max_messages=20 - len(got), wait=5)
            for msg in got[:10]:
                await msg.ack()
                acked.add(msg.id)
            for msg in got[10:14]:
                await msg.dead_letter("broken")
                dead.add(msg.id)
            held = {m.id for m in got[14:]}
            await consumer.close(drain=False)  # leave the leases in place
        return acked, dead, held

    acked, dead, held = asyncio.run(consume())
    rows = (
        spark.read.format("bucketq")
        .options(**settings_options(settings))
        .option("topic", "work")
        .option("consumer", "billing")
        .load()
        .select("id", "state")
        .collect()
    )
    state = {r["id"]: r["state"] for r in rows}
    assert len(state) == len(results)
    assert {i for i, s in state.items() if s == "acked"} == acked
    assert {i for i, s in state.items() if s == "dead"} == dead
    assert held <= {i for i, s in state.items() if s == "in_flight"}
    assert set(state.values()) <= {"pending", "in_flight", "acked", "dead"}
    assert "pending" in state.values()
