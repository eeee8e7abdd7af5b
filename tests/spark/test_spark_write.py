"""Batch write: group commit into few segments, read back, and all-or-nothing visibility."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from bucketq import Bucketq, Settings
from bucketq.spark.commit import read_report
from bucketq.spark.options import resolve_settings, settings_options
from tests.spark.spark_helpers import keys_under, publish_many, topic_records

pytestmark = [pytest.mark.spark, pytest.mark.s3]


async def _create(settings: Settings, topic: str, partitions: int) -> None:
    async with Bucketq(settings) as bq:
        await bq.create_topic(topic, partitions=partitions)


def _writer(df: Any, options: dict[str, str], topic: str, **extra: Any) -> Any:
    w = df.write.format("bucketq").options(**options).option("topic", topic).mode("append")
    return w.options(**{k: str(v) for k, v in extra.items()})


def test_write_then_read_back(spark: Any, bucket: Settings, options: dict[str, str]) -> None:
    asyncio.run(_create(bucket, "orders", 3))
    n = 6000
    df = spark.range(n, numPartitions=2).selectExpr(
        "named_struct('n', id, 'name', concat('item-', id)) AS payload",
        "IF(id % 2 = 0, concat('k', id % 10), NULL) AS key",
        "map('source', 'spark', 'row', cast(id AS STRING)) AS headers",
        "CAST(id % 3 AS INT) AS priority",
    )
    _writer(df, options, "orders", jobId="job-1").save()

    report = asyncio.run(read_report(resolve_settings(options), "job-1"))
    assert report is not None and report["messages"] == n and report["tasks"] == 2
    # group commit: a few large segments per partition, not one object per row
    assert report["segments"] <= 3 * 2
    assert report["requests_total"] / n <= 0.01

    got = spark.read.format("bucketq").options(**options).option("topic", "orders").load().collect()
    assert len(got) == n
    by_n = {json.loads(r["payload"])["n"]: r for r in got}
    assert sorted(by_n) == list(range(n))
    for i in (0, 1, 2, 4321, n - 1):
        r = by_n[i]
        assert json.loads(r["payload"]) == {"n": i, "name": f"item-{i}"}
        assert r["key"] == (f"k{i % 10}" if i % 2 == 0 else None)
        assert r["headers"] == {"source": "spark", "row": str(i)}
        assert r["priority"] == i % 3
    # keyed rows land where the engine's producer would put them
    from bucketq.core.producer import partition_for_key

    assert all(r["partition"] == partition_for_key(r["key"], 3) for r in got if r["key"] is not None)
    # chunks written once, at their final keys: every stored chunk is one the commit references
    assert len(asyncio.run(keys_under(bucket, "orders/chunk/job-1/"))) == report["chunks"] > 0


def test_write_maps_rows_data_and_times(spark: Any, bucket: Settings, options: dict[str, str]) -> None:
    asyncio.run(_create(bucket, "raw", 1))
    when = datetime(2024, 5, 1, 12, 30, tzinfo=UTC)
    rows = spark.createDataFrame(
        [(1, "a", when), (2, "b", when)], "n INT, label STRING, created_at TIMESTAMP"
    )
    _writer(rows, options, "raw").save()  # no payload column: each row is a JSON object
    blobs = spark.createDataFrame([(b"\x00\x01", "x-1")], "data BINARY, id STRING")
    _writer(blobs, options, "raw").save()
    text = spark.createDataFrame([("hello",)], "payload STRING")
    _writer(text, options, "raw", payloadFormat="string").save()

    _writer(text.limit(0), options, "raw").save()  # nothing to write: nothing appended

    records = [r for *_, r in asyncio.run(topic_records(bucket, "raw"))]
    assert len(records) == 4
    assert [r.payload for r in records[:2]] == [{"n": 1, "label": "a"}, {"n": 2, "label": "b"}]
    assert records[0].created_at == when.timestamp()
    assert records[2].data == b"\x00\x01" and records[2].id == "x-1"
    assert records[3].payload == "hello"


def test_failed_write_task_leaves_nothing_visible(
    spark: Any, bucket: Settings, options: dict[str, str]
) -> None:
    asyncio.run(_create(bucket, "ledger", 2))
    # task 1 stages several segments, then meets a payload that is not JSON and fails the job
    df = spark.range(5000, numPartitions=2).selectExpr(
        "IF(id = 4900, 'not json', to_json(named_struct('n', id))) AS payload"
    )
    with pytest.raises(Exception, match="InvalidMessage"):
        _writer(df, options, "ledger", batchMessages=500, jobId="job-bad").save()
    assert asyncio.run(topic_records(bucket, "ledger")) == []
    assert asyncio.run(keys_under(bucket, "ledger/chunk/")) == []  # the aborted run's chunks are gone
    assert asyncio.run(read_report(resolve_settings(options), "job-bad")) is None
    # a clean rerun then publishes everything once
    good = spark.range(5000, numPartitions=2).selectExpr("to_json(named_struct('n', id)) AS payload")
    _writer(good, options, "ledger", batchMessages=500).save()
    assert sorted(r.payload["n"] for *_, r in asyncio.run(topic_records(bucket, "ledger"))) == list(
        range(5000)
    )


def test_bad_input_is_rejected_before_any_task(spark: Any, bucket: Settings, options: dict[str, str]) -> None:
    asyncio.run(_create(bucket, "strict", 1))
    df = spark.createDataFrame([("{}", 1)], "payload STRING, extra INT")
    with pytest.raises(Exception, match="not message fields"):
        _writer(df, options, "strict").save()
    with pytest.raises(Exception, match="unknown topic"):
        _writer(spark.createDataFrame([("{}",)], "payload STRING"), options, "missing").save()
    with pytest.raises(Exception, match="append-only"):
        _writer(spark.createDataFrame([("{}",)], "payload STRING"), options, "strict").mode(
            "overwrite"
        ).save()
    assert settings_options(bucket)["bucket"] == bucket.s3_bucket


def test_null_payload_stays_null(spark: Any, bucket: Settings, options: dict[str, str]) -> None:
    """Finding 4: a NULL payload read back as the text 'null', so ``payload IS NULL`` never matched."""
    asyncio.run(_create(bucket, "nulls", 1))
    rows = spark.createDataFrame([('{"n": 1}',), (None,), ("null",)], "payload STRING")
    _writer(rows, options, "nulls").save()
    asyncio.run(publish_many(bucket, "nulls", 1, create=False, make=lambda i: {"payload": None}))
    df = spark.read.format("bucketq").options(**options).option("topic", "nulls").load()
    assert df.where("payload IS NULL").count() == 3  # SQL NULL, JSON null, and the engine's None
    assert [r["payload"] for r in df.where("payload IS NOT NULL").collect()] == ['{"n": 1}']
    # written back as it was read: NULL stays NULL
    _writer(df.select("payload"), options, "nulls").save()
    assert [r.payload for *_, r in asyncio.run(topic_records(bucket, "nulls"))].count(None) == 6


def test_writes_and_reads_from_another_driver_thread(
    spark: Any, bucket: Settings, options: dict[str, str]
) -> None:
    """Finding 5: a second driver thread got DATA_SOURCE_NOT_FOUND (Spark looks Python data sources
    up through the thread's active session, which a new thread does not have)."""
    import threading

    from bucketq.spark import register
    from bucketq.spark.pipelines import read_topic, write_topic

    asyncio.run(_create(bucket, "threads", 1))
    failures: list[BaseException] = []
    counts: list[int] = []

    def work() -> None:
        try:
            rows = spark.range(10).selectExpr("to_json(named_struct('n', id)) AS payload")
            write_topic(rows, bucket, "threads", description="thread", show=False)  # the pipelines' way
            register(spark)  # a program's own: once in each thread
            _writer(rows, options, "threads").save()
            counts.append(read_topic(spark, bucket, "threads").count())
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not failures, failures
    assert counts == [20]
