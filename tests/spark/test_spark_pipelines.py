"""Pipelines: export → backfill round trip, dead-letter redrive exactly once, stats, the CLI."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bucketq import Bucketq, Settings
from bucketq.core.segment import Record
from bucketq.spark import pipelines
from tests.spark.spark_helpers import publish_many, topic_records
from tests.support.servers import S3Server

pytestmark = [pytest.mark.spark, pytest.mark.s3]


def _cli(server: S3Server, settings: Settings, *args: str) -> Any:
    from bucketq.cli.app import app

    conn = [
        "--endpoint-url",
        server.endpoint_url,
        "--bucket",
        str(settings.s3_bucket),
        "--access-key-id",
        server.access_key,
        "--secret-access-key",
        server.secret_key,
        "--strategy",
        "conditional_write",
    ]
    result = CliRunner().invoke(app, [*conn, "spark", *args])
    assert result.exit_code == 0, result.output
    return result


def _message(i: int) -> dict[str, Any]:
    msg: dict[str, Any] = {"payload": {"n": i, "tags": ["a", "b"], "price": i / 4}}
    if i % 4 == 0:
        msg = {"data": bytes(range(i % 7 + 1)), "content_type": "application/x-bytes"}
    if i % 3 == 0:
        msg["key"] = f"k{i % 5}"
    msg["headers"] = {"i": str(i)} if i % 2 else {}
    msg["priority"] = i % 3
    msg["created_at"] = 1_700_000_000.123456 + i
    if i % 10 == 0:
        msg["not_before"] = 1_600_000_000.5
    return msg


def _essence(r: Record) -> tuple[Any, ...]:
    """Everything a message is, independent of where it sits (timestamps to the microsecond)."""
    micros = round(r.not_before * 1e6) if r.not_before is not None else None
    return (
        r.id,
        r.key,
        tuple(sorted(r.headers.items())),
        repr(r.payload),
        r.data,
        r.content_type,
        round(r.created_at * 1e6),
        r.producer_id,
        r.priority,
        micros,
        r.dedup_id,
    )


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_export_then_backfill_is_lossless(
    spark: Any, moto_server: S3Server, bucket: Settings, tmp_path: Path, fmt: str
) -> None:
    asyncio.run(publish_many(bucket, "source", 500, partitions=3, make=_message))
    out = tmp_path / "archive"
    result = _cli(moto_server, bucket, "export", "source", "--to", str(out), "--format", fmt, "-q")
    assert "exported 500 messages" in result.output
    result = _cli(
        moto_server,
        bucket,
        "backfill",
        "copy",
        "--from",
        str(out),
        "--format",
        fmt,
        "--create",
        "2",
        "-q",
    )
    assert "published 500 messages" in result.output

    original = {_essence(r) for *_, r in asyncio.run(topic_records(bucket, "source"))}
    copied = [_essence(r) for *_, r in asyncio.run(topic_records(bucket, "copy"))]
    assert len(copied) == 500
    assert set(copied) == original


def test_export_time_window_and_csv_backfill(spark: Any, bucket: Settings, tmp_path: Path) -> None:
    asyncio.run(publish_many(bucket, "window", 100, make=_message))
    count = pipelines.export(
        spark,
        bucket,
        "window",
        str(tmp_path / "w"),
        "json",
        since=str(1_700_000_010),
        until=str(1_700_000_020),
        show=False,
    )
    assert count == 10
    csv = tmp_path / "rows.csv"
    csv.write_text("sku,qty\na-1,3\nb-2,5\n")
    report = pipelines.backfill(spark, bucket, str(csv), "csv", "skus", partitions=1, show=False)
    assert report["messages"] == 2
    payloads = [r.payload for *_, r in asyncio.run(topic_records(bucket, "skus"))]
    assert payloads == [{"sku": "a-1", "qty": 3}, {"sku": "b-2", "qty": 5}]


async def _dead_letter_some(settings: Settings) -> tuple[set[str], set[str]]:
    """Publish 30 orders; consumer billing dead-letters 12 ('timeout') and 8 ('invalid'), acks 10."""
    await publish_many(settings, "orders", 30, partitions=2)
    timeout, invalid = set(), set()
    async with Bucketq(settings) as bq:
        consumer = await bq.register_consumer("billing", "orders")
        await bq.init_subscription("orders", "audit")
        got: list[Any] = []
        while len(got) < 30:
            got += await consumer.poll(max_messages=30, wait=5)
        for n, msg in enumerate(got):
            if n < 12:
                await msg.dead_letter("timeout")
                timeout.add(msg.id)
            elif n < 20:
                await msg.dead_letter("invalid")
                invalid.add(msg.id)
            else:
                await msg.ack()
        await consumer.close()
    return timeout, invalid


async def _billing_receives(settings: Settings, count: int) -> list[Any]:
    async with Bucketq(settings) as bq:
        consumer = await bq.register_consumer("billing", "orders")
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < count and time.monotonic() < deadline:
            for msg in await consumer.poll(max_messages=50, wait=1):
                got.append(msg)
                await msg.ack()
        extra = await consumer.poll(max_messages=50, wait=1)
        await consumer.close()
        return got + extra


def test_redrive_moves_every_dead_letter_exactly_once(spark: Any, moto_server: S3Server) -> None:
    settings = moto_server.settings(
        strategy="conditional_write", consumer={"poll_min_ms": 5, "poll_max_ms": 40}
    )
    timeout, invalid = asyncio.run(_dead_letter_some(settings))

    first = pipelines.redrive(
        spark, settings, "orders.dlq", "orders", where="headers['bucketq-dlq-reason'] = 'timeout'", show=False
    )
    assert (first.moved, first.acked, first.lost) == (12, 12, 0)
    stats = pipelines.stats(spark, settings, "orders")
    assert {r["reason"]: r["count"] for r in stats["dead_letter_reasons"]} == {"timeout": 12, "invalid": 8}
    assert sum(p["messages"] for p in stats["partitions"]) == 42

    # finding 8: a few dead letters are moved without Spark (seconds, not a Spark job's 45 s)
    result = _cli(moto_server, settings, "redrive", "orders", "-q")
    assert "redrove 8 dead letters from orders.dlq to orders without Spark" in result.output
    again = pipelines.redrive(spark, settings, "orders.dlq", "orders", show=False)
    assert (again.moved, again.rounds) == (0, 0)

    redriven = [
        r for *_, r in asyncio.run(topic_records(settings, "orders")) if "bucketq-redrive-for" in r.headers
    ]
    assert sorted(r.id for r in redriven) == sorted(timeout | invalid)  # each exactly once
    for r in redriven:
        assert r.headers["bucketq-redrive-for"] == "billing"
        assert not any(k.startswith("bucketq-dlq-") for k in r.headers)
    states = pipelines.read_topic(spark, settings, "orders.dlq", consumer="redrive").select("state").collect()
    assert [r["state"] for r in states] == ["acked"] * 20

    # the consumer that failed gets them again; the other consumer of the topic skips them
    received = asyncio.run(_billing_receives(settings, 20))
    assert sorted(m.id for m in received) == sorted(timeout | invalid)
    audit = (
        pipelines.read_topic(spark, settings, "orders", consumer="audit").where("state = 'pending'").count()
    )
    assert audit == 30


def test_stats_command_prints_tables(moto_server: S3Server, bucket: Settings, spark: Any) -> None:
    asyncio.run(publish_many(bucket, "metrics", 50, partitions=2))
    result = _cli(moto_server, bucket, "stats", "metrics")
    assert "metrics: 50 messages" in result.output
    assert "payload bytes" in result.output


def test_backfill_keeps_each_json_payload_as_the_dataset_has_it(
    spark: Any, bucket: Settings, tmp_path: Path
) -> None:
    """Finding 3: a JSON ``payload`` field mixing strings, numbers and objects is inferred as a
    string column; each string was then parsed as JSON ("42" became 42, "hello" failed the job)."""
    values: list[Any] = [
        "42",
        42,
        "true",
        True,
        "null",
        None,
        "[1, 2]",
        [1, 2],
        {"a": "é"},
        "hello",
        1.5,
        'q"',
    ]
    path = tmp_path / "mixed.json"
    lines = [json.dumps({"key": str(i), "payload": v}) for i, v in enumerate(values)]
    path.write_text("\n".join([*lines, json.dumps({"key": "missing"})]) + "\n")
    report = pipelines.backfill(spark, bucket, str(path), "json", "mixed", partitions=1, show=False)
    assert report["messages"] == len(values) + 1
    stored = {r.key: r.payload for *_, r in asyncio.run(topic_records(bucket, "mixed"))}
    assert stored == {**{str(i): v for i, v in enumerate(values)}, "missing": None}
    assert all(type(stored[str(i)]) is type(v) for i, v in enumerate(values))


def test_backfill_spreads_unkeyed_rows_evenly_and_counts_skipped_ids(
    spark: Any, moto_server: S3Server, bucket: Settings, tmp_path: Path
) -> None:
    """Finding 7: 10,023 unkeyed rows went 9,998 / 5 into 2 partitions, and the 20 rows skipped as
    ids already present were not mentioned."""
    ids = [f"00000000-0000-7000-8000-{i:012d}" for i in range(10_023)]
    rows = spark.createDataFrame(
        [(i, f'{{"n": {n}}}') for n, i in enumerate(ids)], "id STRING, payload STRING"
    )
    rows.limit(20).write.parquet(str(tmp_path / "first"))
    rows.write.parquet(str(tmp_path / "all"))
    first = pipelines.backfill(
        spark, bucket, str(tmp_path / "first"), "parquet", "spread", partitions=2, show=False
    )
    assert first["messages"] == 20
    result = _cli(
        moto_server,
        bucket,
        "backfill",
        "spread",
        "--from",
        str(tmp_path / "all"),
        "--format",
        "parquet",
        "-q",
    )
    assert "published 10003 messages" in result.output
    assert "skipped 20 rows whose id the topic already had" in result.output
    counts = {p: 0 for p in range(2)}
    for p, *_ in asyncio.run(topic_records(bucket, "spread")):
        counts[p] += 1
    assert sum(counts.values()) == 10_023
    # each task's partitions differ by one row at most (the dedup's sort runs up to 8 tasks)
    assert abs(counts[0] - counts[1]) <= 10
