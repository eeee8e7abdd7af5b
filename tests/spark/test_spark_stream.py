"""Streaming read: offsets are segment seqs; a restarted availableNow query reads exactly the new ones."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bucketq import Settings
from tests.spark.spark_helpers import publish_many

pytestmark = [pytest.mark.spark, pytest.mark.s3]


def _run_available_now(spark: Any, options: dict[str, str], out: Path, checkpoint: Path, **extra: str) -> Any:
    stream = (
        spark.readStream.format("bucketq")
        .options(**options)
        .option("topic", "clicks")
        .options(**extra)
        .load()
    )
    query = (
        stream.select("id", "partition", "seq", "index", "payload")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    return query


def test_available_now_restarts_without_gaps_or_duplicates(
    spark: Any, bucket: Settings, options: dict[str, str], tmp_path: Path
) -> None:
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    first = asyncio.run(publish_many(bucket, "clicks", 3000, partitions=3))
    query = _run_available_now(spark, options, out, checkpoint)
    progress = query.lastProgress
    assert progress is not None
    assert set(_offsets(progress["sources"][0]["endOffset"])) == {"0", "1", "2"}
    assert spark.read.parquet(str(out)).count() == 3000

    second = asyncio.run(
        publish_many(bucket, "clicks", 1500, partitions=3, create=False, make=lambda i: {"payload": {"m": i}})
    )
    _run_available_now(spark, options, out, checkpoint)  # same checkpoint: a restart
    got = spark.read.parquet(str(out)).collect()
    ids = [r["id"] for r in got]
    assert len(ids) == len(set(ids)) == 4500
    assert set(ids) == {r.id for r in first} | {r.id for r in second}

    _run_available_now(spark, options, out, checkpoint)  # nothing new: nothing read
    assert spark.read.parquet(str(out)).count() == 4500


def _offsets(value: Any) -> dict[str, int]:
    obj = json.loads(value) if isinstance(value, str) else value
    return {p: int(s) for p, s in (obj or {}).get("clicks", {}).items()}


def test_max_segments_per_trigger_caps_batches(
    spark: Any, bucket: Settings, options: dict[str, str], tmp_path: Path
) -> None:
    results = asyncio.run(publish_many(bucket, "clicks", 10, partitions=2))
    for _ in range(2):
        results += asyncio.run(publish_many(bucket, "clicks", 10, partitions=2, create=False))
    segments = len({(r.partition, r.seq) for r in results})
    query = _run_available_now(spark, options, tmp_path / "out", tmp_path / "ck", maxSegmentsPerTrigger="1")
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert len(batches) == segments
    for p in batches:
        start, end = _offsets(p["sources"][0]["startOffset"]), _offsets(p["sources"][0]["endOffset"])
        assert sum(end[k] - start.get(k, 0) for k in end) == 1
    assert spark.read.parquet(str(tmp_path / "out")).count() == len(results)
