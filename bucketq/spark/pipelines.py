"""Bulk pipelines on the data source: export, backfill, redrive and stats (used by the CLI)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bucketq import Bucketq
from bucketq.config import Settings
from bucketq.errors import ConfigError, TopicNotFound
from bucketq.spark import activate
from bucketq.spark import redrive as cursor_ops
from bucketq.spark.commit import committed_report, read_report
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
    activate(spark)  # any driver thread
    reader = spark.read.format("bucketq").options(**settings_options(settings)).option("topic", topic)
    for key, value in options.items():
        if value is not None:
            reader = reader.option(key, str(value))
    return reader.load()


def write_topic(
    df: DataFrame,
    settings: Settings,
    topic: str,
    *,
    description: str,
    show: bool = True,
    job: str | None = None,
    derived_job: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Append ``df`` to ``topic`` as write job ``job`` (random when None); returns the job commit's
    report (messages, segments, requests). A ``job`` committed before writes nothing: its report
    says ``"skipped": true`` and ``"input_changed"`` whether this input differs from the committed
    run's (a warning; an error with ``changedInput="fail"``). A ``derived_job`` id is one made
    from the input itself (files, sizes, times): then the committed report is returned without
    reading the input again."""
    job = job or uuid.uuid4().hex
    if derived_job:
        earlier = asyncio.run(committed_report(resolve_settings(settings_options(settings)), topic, job))
        if earlier is not None:
            return earlier | {"skipped": True, "input_changed": False}
    activate(df.sparkSession)  # any driver thread
    writer = df.write.format("bucketq").options(**settings_options(settings)).option("topic", topic)
    for key, value in options.items():
        if value is not None:
            writer = writer.option(key, str(value))
    with progress(df.sparkSession, description, enabled=show):
        writer.option("jobId", job).mode("append").save()
    report = asyncio.run(read_report(resolve_settings(settings_options(settings)), job))
    return report or {"job": job, "topic": topic, "messages": 0, "segments": 0, "bytes": 0}


def _hadoop(spark: SparkSession) -> tuple[Any, Any]:
    """The JVM gateway and the Hadoop configuration (file system calls for any URI scheme)."""
    sc: Any = spark.sparkContext
    return sc._jvm, sc._jsc.hadoopConfiguration()


def stable_job_id(kind: str, *parts: Any) -> str:
    """A job id derived from what a pipeline run does: running the same thing again is a no-op."""
    digest = hashlib.sha256(json.dumps([kind, *parts], sort_keys=True, default=str).encode()).hexdigest()
    return f"{kind}-{digest[:32]}"


def _input_fingerprint(spark: SparkSession, df: DataFrame) -> list[tuple[str, int, int]]:
    """(file, size, modification time) of every input file of ``df``: a changed file is another job."""
    out = []
    jvm, conf = _hadoop(spark)
    for uri in sorted(df.inputFiles()):
        path = jvm.org.apache.hadoop.fs.Path(uri)
        status = path.getFileSystem(conf).getFileStatus(path)
        out.append((uri, int(status.getLen()), int(status.getModificationTime())))
    return out


# -- export / backfill -----------------------------------------------------------------------------


EXPORT_MANIFEST = "_bucketq_export"  # Spark's readers skip names starting with "_"
SPARK_OUTPUT = ("part-", "_SUCCESS", ".part-", "._SUCCESS", "_temporary", ".crc")


def _export_manifest(spark: SparkSession, path: str) -> dict[str, Any] | None:
    try:
        rows = spark.read.text(f"{path.rstrip('/')}/{EXPORT_MANIFEST}").collect()
    except Exception:  # no manifest (or no directory)
        return None
    try:
        return dict(json.loads("".join(r[0] for r in rows)))
    except ValueError:
        return None


def _spark_output_only(spark: SparkSession, path: str) -> bool | None:
    """Whether ``path`` holds nothing but Spark output files (None: it does not exist)."""
    jvm, conf = _hadoop(spark)
    target = jvm.org.apache.hadoop.fs.Path(path)
    fs = target.getFileSystem(conf)
    if not fs.exists(target):
        return None
    names = [status.getPath().getName() for status in fs.listStatus(target)]
    return all(n.startswith(SPARK_OUTPUT) or n.endswith(".crc") for n in names)


def export(
    spark: SparkSession,
    settings: Settings,
    topic: str,
    path: str,
    fmt: str = "parquet",
    *,
    since: str | None = None,
    until: str | None = None,
    overwrite: bool = False,
    show: bool = True,
) -> int:
    """Archive ``topic`` (or a dead-letter topic) to files; returns the number of messages written.

    Idempotent: a finished export leaves a manifest next to its files, and running the same
    export (topic, format, window) to the same place again returns its count without writing. An
    export that died half-way left only Spark output files: the next run replaces them.
    """
    if fmt not in ("parquet", "json"):
        raise ConfigError(f"export format {fmt!r}: use parquet or json")
    asyncio.run(_check_topics(settings, topic))
    what = {"topic": topic, "format": fmt, "since": since, "until": until}
    manifest = None if overwrite else _export_manifest(spark, path)
    if manifest is not None:
        if {k: manifest.get(k) for k in what} == what:
            return int(manifest["messages"])
        raise ConfigError(
            f"{path} holds another export ({manifest.get('topic')!r}, {manifest.get('format')}, since "
            f"{manifest.get('since')}, until {manifest.get('until')}): use another path or --overwrite"
        )
    existing = _spark_output_only(spark, path)
    replace = overwrite or existing is True  # a dead run's leftovers: nothing but Spark output
    df = read_topic(spark, settings, topic, since=since, until=until)
    writer = df.write.mode("overwrite" if replace else "errorifexists").format(fmt)
    if fmt == "json":
        writer = writer.options(**JSON_TIMESTAMPS)
    with progress(spark, f"export {topic}", enabled=show):
        writer.save(path)
    count = int(spark.read.format(fmt).load(path).count())
    body = json.dumps(what | {"messages": count, "at": time.time()})
    spark.createDataFrame([(body,)], "value STRING").coalesce(1).write.mode("overwrite").text(
        f"{path.rstrip('/')}/{EXPORT_MANIFEST}"
    )
    return count


def load_dataset(spark: SparkSession, path: str, fmt: str) -> DataFrame:
    """A dataset to backfill; a JSON export of bucketq is read back with its exact schema."""
    if fmt not in FORMATS:
        raise ConfigError(f"backfill format {fmt!r}: use parquet, json or csv")
    if fmt == "csv":
        return spark.read.option("header", "true").option("inferSchema", "true").csv(path)
    df = spark.read.format(fmt).load(path)
    export_schema = message_schema()
    if (
        fmt == "json"
        and set(df.columns) <= set(export_schema.fieldNames())
        # an export of bucketq: its manifest, or the position columns only a read has
        and (
            _export_manifest(spark, path) is not None or {"id", "payload", "seq", "offset"} <= set(df.columns)
        )
    ):
        # its payload column holds JSON text (a read's payload), not string values
        return spark.read.schema(export_schema).options(**JSON_TIMESTAMPS).json(path)
    if fmt == "json" and "payload" in df.columns:
        return _raw_json_payload(spark, df, path)
    return df


def _raw_json_payload(spark: SparkSession, df: DataFrame, path: str) -> DataFrame:
    """A JSON dataset with its ``payload`` field as JSON text, exactly as each record has it.

    Spark infers one type per field: a field that holds strings in some records and numbers or
    objects in others becomes a string column, where ``"42"`` and ``42`` both read as ``42``. Read
    as VARIANT (Spark 4) and written back as JSON, each value keeps its own JSON type (``"42"``
    stays a string, ``null`` stays null, numbers keep their value). The column then holds JSON
    text (``payloadFormat=json``). A Spark without VARIANT: a payload inferred as a string is
    refused (the values' types cannot be told apart), any other inferred type is kept.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField

    fields = [
        f if f.name != "payload" else StructField("payload", StringType(), True) for f in df.schema.fields
    ]
    ddl = ", ".join(
        f"`{f.name}` {'VARIANT' if f.name == 'payload' else f.dataType.simpleString()}" for f in fields
    )
    try:
        raw = spark.read.schema(ddl).json(path)
        return raw.withColumn("payload", F.to_json("payload")).select(*df.columns)
    except Exception as exc:  # a Spark without VARIANT reads
        if isinstance(df.schema["payload"].dataType, StringType):
            raise ConfigError(
                f"{path}: the payload field cannot be read as JSON text with this Spark ({exc}); its "
                "values may mix JSON types that Spark reads alike ('42' and 42): convert it first, "
                "e.g. to a string column holding JSON text"
            ) from None
        return df


def backfill(
    spark: SparkSession,
    settings: Settings,
    path: str,
    fmt: str,
    topic: str,
    *,
    partitions: int | None = None,
    show: bool = True,
    dedup: bool = True,
    job: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Bulk-load a dataset into ``topic`` (created with ``partitions`` when given and missing).

    Idempotent on rerun, twice over:

    * the job id is derived from the topic, the options and every input file (name, size,
      modification time): the same backfill run again is a no-op, and one whose driver died is
      finished (or rolled back and redone) exactly once;
    * with ``dedup`` (default) and an ``id`` column (an export has one), rows whose id is already
      in the topic, or repeated in the dataset, are dropped: a changed or overlapping dataset adds
      only the messages that are not there yet.
    """
    if partitions is not None:
        asyncio.run(_create_topic(settings, topic, partitions))
    else:
        asyncio.run(_check_topics(settings, topic))
    df = load_dataset(spark, path, fmt)
    derived = job is None
    if job is None:
        job = stable_job_id(
            "backfill", topic, fmt, dedup, sorted(options.items()), _input_fingerprint(spark, df)
        )
    keep_ids = str(options.get("keepIds", "true")).lower() != "false"
    rows = None
    if dedup and keep_ids and "id" in df.columns:
        rows = df.count()
        df = _without_known_ids(spark, settings, topic, df)
    report = write_topic(
        df,
        settings,
        topic,
        description=f"backfill {topic}",
        show=show,
        job=job,
        derived_job=derived,
        **options,
    )
    if rows is not None and not report.get("skipped"):
        # rows whose id the topic already had (or the dataset repeated): counted, never silent
        report["skipped_ids"] = rows - int(report.get("messages", 0))
    return report


def _without_known_ids(spark: SparkSession, settings: Settings, topic: str, df: DataFrame) -> DataFrame:
    """``df`` without rows whose id the topic already has or an earlier row repeats, in its order."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = "__bucketq_row"
    rows = df.withColumn(order, F.monotonically_increasing_id())
    first = rows.withColumn("__bucketq_n", F.row_number().over(Window.partitionBy("id").orderBy(order)))
    rows = first.where(F.col("id").isNull() | (F.col("__bucketq_n") == 1)).drop("__bucketq_n")
    known = read_topic(spark, settings, topic).select("id").distinct()
    # keep the dataset's order: keyed messages of one key must stay in it
    return rows.join(known, "id", "left_anti").orderBy(order).drop(order).select(*df.columns)


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
    spark: bool = True  # False: moved by the engine (a small redrive, redrive_without_spark)


# Up to this many waiting dead letters, ``bucketq spark redrive`` moves them without Spark (as
# ``bucketq dlq redrive`` does): a few seconds instead of a Spark job's start-up and rounds.
SMALL_REDRIVE = 10_000


async def waiting_dead_letters(settings: Settings, dlq: str, consumer: str) -> int:
    """Dead letters of ``dlq`` not yet acked in its redrive subscription ``consumer`` (all of
    them while it has no cursor), as ``bucketq dlq list`` counts them."""
    async with Bucketq(settings) as bq:
        if consumer in await bq.catalog.consumers(dlq):
            [s] = await bq.stats(dlq, consumer)
            return s.backlog + s.in_flight
        return (await bq.describe_topic(dlq)).messages


def redrive_without_spark(
    settings: Settings, dlq: str, topic: str, *, consumer: str = "redrive", limit: int = SMALL_REDRIVE
) -> RedriveReport | None:
    """A small redrive done by the engine (``bucketq dlq redrive``'s path), or None when it is not
    small: more than ``limit`` dead letters wait, or a Spark redrive round of a run that died
    must be finished first (only the Spark redrive finishes those).

    Both keep their bookkeeping in the same subscription of the dead-letter topic (``redrive``),
    so neither moves a dead letter the other moved.
    """
    from bucketq.core.redrive import REDRIVE_CONSUMER, RedriveFilter

    if consumer != REDRIVE_CONSUMER or limit <= 0:
        return None
    asyncio.run(_check_topics(settings, dlq, topic))
    if asyncio.run(cursor_ops.open_intents(settings, dlq, consumer)):
        return None
    if asyncio.run(waiting_dead_letters(settings, dlq, consumer)) > limit:
        return None

    async def move() -> RedriveReport:
        async with Bucketq(settings) as bq:
            done = await bq.redrive(dlq, to=topic, where=RedriveFilter(source_topic=topic))
        report = RedriveReport(dlq, topic, consumer, rounds=1, spark=False)
        report.selected, report.claimed = done.selected, done.moved + done.duplicates + done.lost
        report.moved, report.acked, report.lost = done.moved, done.acked, done.lost
        return report

    return asyncio.run(move())


def redrive(
    spark: SparkSession,
    settings: Settings,
    dlq: str,
    topic: str,
    *,
    where: str | None = None,
    consumer: str = "redrive",
    batch: int = 100_000,
    lease_s: float = 1800.0,
    show: bool = True,
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
    # rounds of a run that died between claiming and acking: finish them first, exactly once
    for intent in asyncio.run(cursor_ops.open_intents(settings, dlq, consumer)):
        if intent.topic == topic:
            report.rounds += 1
            _finish_round(spark, settings, intent, report, show=show)
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
        claims = asyncio.run(
            cursor_ops.claim(settings, dlq, consumer, wanted, lease_s=lease_s, member=member)
        )
        report.rounds += 1
        report.selected += len(rows)
        report.claimed += claims.count
        if not claims.count:
            break  # everything selected is leased elsewhere
        positions = sorted((p, s, i) for p, toks in claims.tokens.items() for (s, i) in toks)
        job = stable_job_id("redrive", dlq, topic, consumer, positions)
        _finish_round(
            spark, settings, cursor_ops.RoundIntent(dlq, topic, consumer, job, claims), report, show=show
        )
        if len(rows) < batch:
            break
    return report


def _finish_round(
    spark: SparkSession,
    settings: Settings,
    intent: cursor_ops.RoundIntent,
    report: RedriveReport,
    *,
    show: bool,
) -> None:
    """Record the round, write its copies as job ``intent.job``, ack, forget the round.

    A crash anywhere leaves the intent: the next run repeats the write with the same job id (a
    no-op if it committed) and the acks, so every dead letter moves exactly once.
    """
    asyncio.run(cursor_ops.save_intent(settings, intent))
    job = _copy_claimed(
        spark,
        settings,
        intent.dlq,
        intent.topic,
        intent.claims,
        show=show,
        round_no=report.rounds,
        job=intent.job,
    )
    if not job.get("skipped"):
        report.moved += int(job.get("messages", 0))
    report.jobs.append(str(job.get("job")))
    acked, lost = asyncio.run(cursor_ops.ack(settings, intent.dlq, intent.consumer, intent.claims))
    report.acked += acked
    report.lost += lost
    asyncio.run(cursor_ops.drop_intent(settings, intent))


async def _check_topics(settings: Settings, *topics: str) -> None:
    async with Bucketq(settings) as bq:
        for t in topics:
            if not await bq.catalog.exists(t):
                raise TopicNotFound(t)


def _copy_claimed(
    spark: SparkSession,
    settings: Settings,
    dlq: str,
    topic: str,
    claims: cursor_ops.Claims,
    *,
    show: bool,
    round_no: int,
    job: str,
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
    headers = F.when(
        origin.isNotNull(), F.map_concat(kept, F.create_map(F.lit(REDRIVE_FOR), origin))
    ).otherwise(kept)
    df = df.withColumn("headers", headers).select(*FIELD_COLUMNS)
    return write_topic(
        df,
        settings,
        topic,
        description=f"redrive {dlq} → {topic} (round {round_no})",
        show=show,
        job=job,
        derived_job=True,  # named after the claimed positions: a committed round is not run again
    )


# -- stats -----------------------------------------------------------------------------------------


def stats(spark: SparkSession, settings: Settings, topic: str, *, hours: int = 48) -> dict[str, Any]:
    """Per-partition and per-hour counts, payload sizes and dead-letter reasons of ``topic``."""
    from pyspark.sql import functions as F

    asyncio.run(_check_topics(settings, topic))
    df = read_topic(spark, settings, topic)
    size = F.coalesce(F.octet_length("payload"), F.octet_length("data"))
    df = df.select("partition", "seq", "created_at", "headers", size.alias("size")).cache()
    try:
        parts = (
            df.groupBy("partition")
            .agg(
                F.count("*").alias("messages"),
                F.countDistinct("seq").alias("segments"),
                F.sum("size").alias("bytes"),
                F.min("created_at").alias("oldest"),
                F.max("created_at").alias("newest"),
            )
            .orderBy("partition")
        )
        per_hour = (
            df.groupBy(F.date_trunc("hour", "created_at").alias("hour")).count().orderBy(F.desc("hour"))
        )
        sizes = df.agg(
            F.min("size").alias("min"),
            F.avg("size").alias("avg"),
            F.percentile_approx("size", [0.5, 0.95, 0.99]).alias("p"),
            F.max("size").alias("max"),
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
                    .groupBy(dreason.alias("reason"))
                    .count()
                    .orderBy(F.desc("count"))
                    .collect()
                ]
        p = (sizes["p"] if sizes is not None else None) or [None, None, None]
        return {
            "topic": topic,
            "partitions": [r.asDict() for r in parts.collect()],
            "hours": [r.asDict() for r in per_hour.limit(hours).collect()],
            "payload_bytes": {
                "min": sizes["min"] if sizes else None,
                "avg": sizes["avg"] if sizes else None,
                "p50": p[0],
                "p95": p[1],
                "p99": p[2],
                "max": sizes["max"] if sizes else None,
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
