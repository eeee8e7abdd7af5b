"""Bulk pipelines on the data source: export, backfill, redrive and stats (used by the CLI)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bucketq import Bucketq
from bucketq.config import Settings
from bucketq.errors import ConfigError, TopicNotFound
from bucketq.spark import redrive as cursor_ops
from bucketq.spark.commit import read_report
from bucketq.spark.options import resolve_settings, settings_options
from bucketq.spark.planning import DLQ_PREFIX, Pos
from bucketq.spark.rows import FIELD_COLUMNS
from bucketq.spark.schema import message_schema
from bucketq.spark.session import progress

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FORMATS = ("parquet", "json", "csv")
# JSON keeps timestamps to the microsecond, as Spark (and parquet) do; Spark's default has milliseconds
JSON_TIMESTAMPS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"}
REDRIVE_FOR = "bucketq-redrive-for"


def read_topic(spark: SparkSession, settings: Settings, topic: str, **options: Any) -> DataFrame:
    """``spark.read.format("bucketq")`` of ``topic`` (options whose value is None are left out)."""
    reader = spark.read.format("bucketq").options(**settings_options(settings)).option("topic", topic)
    for key, value in options.items():
        if value is not None:
            reader = reader.option(key, str(value))
    return reader.load()


def write_topic(
    df: DataFrame, settings: Settings, topic: str, *, description: str, show: bool = True, **options: Any
) -> dict[str, Any]:
    """Append ``df`` to ``topic``; returns the job commit's report (messages, segments, requests)."""
    job = uuid.uuid4().hex
    writer = df.write.format("bucketq").options(**settings_options(settings)).option("topic", topic)
    for key, value in options.items():
        if value is not None:
            writer = writer.option(key, str(value))
    with progress(df.sparkSession, description, enabled=show):
        writer.option("jobId", job).mode("append").save()
    report = asyncio.run(read_report(resolve_settings(settings_options(settings)), job))
    return report or {"job": job, "topic": topic, "messages": 0, "segments": 0, "bytes": 0}


# -- export / backfill -----------------------------------------------------------------------------


def export(
    spark: SparkSession, settings: Settings, topic: str, path: str, fmt: str = "parquet", *,
    since: str | None = None, until: str | None = None, overwrite: bool = False, show: bool = True,
) -> int:
    """Archive ``topic`` (or a dead-letter topic) to files; returns the number of messages written."""
    if fmt not in ("parquet", "json"):
        raise ConfigError(f"export format {fmt!r}: use parquet or json")
    asyncio.run(_check_topics(settings, topic))
    df = read_topic(spark, settings, topic, since=since, until=until)
    writer = df.write.mode("overwrite" if overwrite else "errorifexists").format(fmt)
    if fmt == "json":
        writer = writer.options(**JSON_TIMESTAMPS)
    with progress(spark, f"export {topic}", enabled=show):
        writer.save(path)
    return int(spark.read.format(fmt).load(path).count())


def load_dataset(spark: SparkSession, path: str, fmt: str) -> DataFrame:
    """A dataset to backfill; a JSON export of bucketq is read back with its exact schema."""
    if fmt not in FORMATS:
        raise ConfigError(f"backfill format {fmt!r}: use parquet, json or csv")
    if fmt == "csv":
        return spark.read.option("header", "true").option("inferSchema", "true").csv(path)
    df = spark.read.format(fmt).load(path)
    if fmt == "json" and {"id", "payload", "headers", "created_at"} <= set(df.columns):
        export_schema = message_schema()
        if set(df.columns) <= set(export_schema.fieldNames()):
            return spark.read.schema(export_schema).options(**JSON_TIMESTAMPS).json(path)
    return df


def backfill(
    spark: SparkSession, settings: Settings, path: str, fmt: str, topic: str, *,
    partitions: int | None = None, show: bool = True, **options: Any,
) -> dict[str, Any]:
    """Bulk-load a dataset into ``topic`` (created with ``partitions`` when given and missing)."""
    if partitions is not None:
        asyncio.run(_create_topic(settings, topic, partitions))
    else:
        asyncio.run(_check_topics(settings, topic))
    df = load_dataset(spark, path, fmt)
    return write_topic(df, settings, topic, description=f"backfill {topic}", show=show, **options)


async def _create_topic(settings: Settings, topic: str, partitions: int) -> None:
    async with Bucketq(settings) as bq:
        await bq.create_topic(topic, partitions=partitions)


# -- redrive ---------------------------------------------------------------------------------------


@dataclass
class RedriveReport:
    """Dead letters moved back to their source topic by one redrive run."""

    dlq: str
    topic: str
    consumer: str
    rounds: int = 0
    selected: int = 0
    claimed: int = 0
    moved: int = 0
    acked: int = 0
    lost: int = 0
    jobs: list[str] = field(default_factory=list)


def redrive(
    spark: SparkSession, settings: Settings, dlq: str, topic: str, *, where: str | None = None,
    consumer: str = "redrive", batch: int = 100_000, lease_s: float = 1800.0, show: bool = True,
) -> RedriveReport:
    """Move pending dead letters of ``dlq`` whose source is ``topic`` back into ``topic``.

    Rounds of at most ``batch`` messages: select pending positions of ``consumer`` (the
    dead-letter topic's redrive consumer), claim them, copy them (origin headers dropped,
    ``bucketq-redrive-for`` added so only the consumer that failed gets them again), and ack
    them in ``consumer`` once the copies are durable in ``topic``.
    """
    from pyspark.sql import functions as F

    asyncio.run(_check_topics(settings, dlq, topic))
    report = RedriveReport(dlq, topic, consumer)
    member = f"spark-redrive-{uuid.uuid4().hex[:12]}"
    while True:
        pending = read_topic(spark, settings, dlq, consumer=consumer, deadLetters="false")
        pending = pending.where(F.col("state") == "pending").where(
            F.col("headers").getItem(DLQ_PREFIX + "source-topic") == topic
        )
        if where:
            pending = pending.where(where)
        rows = pending.select("partition", "seq", "index").limit(batch).collect()
        if not rows:
            break
        wanted: dict[int, list[Pos]] = {}
        for r in rows:
            wanted.setdefault(int(r["partition"]), []).append((int(r["seq"]), int(r["index"])))
        claims = asyncio.run(cursor_ops.claim(settings, dlq, consumer, wanted, lease_s=lease_s, member=member))
        report.rounds += 1
        report.selected += len(rows)
        report.claimed += claims.count
        if not claims.count:
            break  # everything selected is leased elsewhere
        job = _copy_claimed(spark, settings, dlq, topic, claims, show=show, round_no=report.rounds)
        report.moved += int(job.get("messages", 0))
        report.jobs.append(str(job.get("job")))
        acked, lost = asyncio.run(cursor_ops.ack(settings, dlq, consumer, claims))
        report.acked += acked
        report.lost += lost
        if len(rows) < batch:
            break
    return report


async def _check_topics(settings: Settings, *topics: str) -> None:
    async with Bucketq(settings) as bq:
        for t in topics:
            if not await bq.catalog.exists(t):
                raise TopicNotFound(t)


def _copy_claimed(
    spark: SparkSession, settings: Settings, dlq: str, topic: str, claims: cursor_ops.Claims, *,
    show: bool, round_no: int,
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    positions = [(p, s, i) for p, toks in claims.tokens.items() for (s, i) in toks]
    wanted = spark.createDataFrame(positions, "partition INT, seq BIGINT, index INT")
    lo = min(s for _, s, _ in positions)
    hi = max(s for _, s, _ in positions)
    df = read_topic(spark, settings, dlq, startSeq=lo, endSeq=hi + 1)
    df = df.join(F.broadcast(wanted), ["partition", "seq", "index"])
    origin = F.col("headers").getItem(DLQ_PREFIX + "consumer")
    kept = F.map_filter("headers", lambda k, _v: ~k.startswith(DLQ_PREFIX))
    headers = F.when(origin.isNotNull(), F.map_concat(kept, F.create_map(F.lit(REDRIVE_FOR), origin))).otherwise(
        kept
    )
    df = df.withColumn("headers", headers).select(*FIELD_COLUMNS)
    return write_topic(df, settings, topic, description=f"redrive {dlq} → {topic} (round {round_no})", show=show)


# -- stats -----------------------------------------------------------------------------------------


def stats(spark: SparkSession, settings: Settings, topic: str, *, hours: int = 48) -> dict[str, Any]:
    """Per-partition and per-hour counts, payload sizes and dead-letter reasons of ``topic``."""
    from pyspark.sql import functions as F

    asyncio.run(_check_topics(settings, topic))
    df = read_topic(spark, settings, topic)
    size = F.coalesce(F.octet_length("payload"), F.octet_length("data"))
    df = df.select("partition", "seq", "created_at", "headers", size.alias("size")).cache()
    try:
        parts = df.groupBy("partition").agg(
            F.count("*").alias("messages"), F.countDistinct("seq").alias("segments"),
            F.sum("size").alias("bytes"), F.min("created_at").alias("oldest"), F.max("created_at").alias("newest"),
        ).orderBy("partition")
        per_hour = df.groupBy(F.date_trunc("hour", "created_at").alias("hour")).count().orderBy(F.desc("hour"))
        sizes = df.agg(
            F.min("size").alias("min"), F.avg("size").alias("avg"),
            F.percentile_approx("size", [0.5, 0.95, 0.99]).alias("p"), F.max("size").alias("max"),
        ).first()
        reason = F.col("headers").getItem(DLQ_PREFIX + "reason")
        reasons_df = df.where(reason.isNotNull()).groupBy(reason.alias("reason")).count()
        reasons = [r.asDict() for r in reasons_df.orderBy(F.desc("count")).collect()]
        source = "topic"
        if not reasons:
            dlq = asyncio.run(_dead_letter_topic(settings, topic))
            if dlq is not None:
                source = dlq
                dead = read_topic(spark, settings, dlq)
                dreason = F.col("headers").getItem(DLQ_PREFIX + "reason")
                reasons = [
                    r.asDict()
                    for r in dead.where(F.col("headers").getItem(DLQ_PREFIX + "source-topic") == topic)
                    .groupBy(dreason.alias("reason")).count().orderBy(F.desc("count")).collect()
                ]
        p = (sizes["p"] if sizes is not None else None) or [None, None, None]
        return {
            "topic": topic,
            "partitions": [r.asDict() for r in parts.collect()],
            "hours": [r.asDict() for r in per_hour.limit(hours).collect()],
            "payload_bytes": {
                "min": sizes["min"] if sizes else None, "avg": sizes["avg"] if sizes else None,
                "p50": p[0], "p95": p[1], "p99": p[2], "max": sizes["max"] if sizes else None,
            },
            "dead_letter_reasons": reasons,
            "dead_letter_source": source,
        }
    finally:
        df.unpersist()


async def _dead_letter_topic(settings: Settings, topic: str) -> str | None:
    async with Bucketq(settings) as bq:
        config = await bq.catalog.config(topic)
        dlq = config.dead_letter.topic or f"{topic}.dlq"
        return dlq if await bq.catalog.exists(dlq) else None
