"""``bucketq spark ...``: export, backfill, redrive and stats as local Spark jobs, with progress.

The connection comes from the global ``bucketq`` options (``--bucket``, ``--endpoint-url``,
``--config``, ``BUCKETQ_*``). pyspark is imported only when a command runs. The vocabulary is the
other commands': the topic is an argument (``bucketq spark export orders --to ...``), times take
the one syntax of ``bucketq peek --since`` (``15m``, ``1h30m``, ISO 8601, Unix seconds), and
``spark redrive`` names a topic or its dead-letter topic as ``bucketq dlq redrive`` does. Every
value is checked before a Spark session starts.
"""

from __future__ import annotations

import json
import re
import time
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.table import Table

from bucketq.cli.connection import connection
from bucketq.cli.dlq import resolve
from bucketq.cli.errors import EXIT_ERROR, CliError, fail, out, run
from bucketq.cli.formats import TIME_HELP, parse_time

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from bucketq.config import Settings

app = typer.Typer(
    name="spark",
    help="Bulk work on topics with Spark (local jobs): export, backfill, dead-letter redrive, stats.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class ExportFormat(StrEnum):
    parquet = "parquet"
    json = "json"


class InputFormat(StrEnum):
    parquet = "parquet"
    json = "json"
    csv = "csv"


MASTER = typer.Option("local[*]", "--master", help="Spark master of the local job.")
QUIET = typer.Option(False, "--quiet", "-q", help="No progress bar.")
_ERROR = re.compile(r"bucketq\.errors\.(\w+): (.+)")


def _session(ctx: typer.Context, master: str) -> SparkSession:
    from bucketq.spark.session import local_session

    return local_session("bucketq-spark", master=master, log_level="warn" if connection(ctx).debug else "off")


def _settings(ctx: typer.Context) -> Settings:
    return connection(ctx).settings()


def _fail(ctx: typer.Context, exc: Exception) -> NoReturn:
    """One line for a failed job: the bucketq error inside a Spark task's traceback, if any."""
    text = str(exc)
    found = _ERROR.findall(text)
    if found and not isinstance(exc, CliError):
        exc = CliError(f"{found[-1][0]}: {found[-1][1]}", EXIT_ERROR)
    elif type(exc).__module__.startswith(("pyspark", "py4j")):
        exc = CliError(text.strip().splitlines()[0] if text.strip() else type(exc).__name__, EXIT_ERROR)
    fail(exc, debug=connection(ctx).debug)


@app.command("export")
def export_command(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="Topic (or dead-letter topic) to archive."),
    to: str = typer.Option(
        ..., "--to", help="Output directory (local path or any Spark URI, e.g. s3a://...)."
    ),
    fmt: ExportFormat = typer.Option(ExportFormat.parquet, "--format", "-f", help="File format."),
    since: str | None = typer.Option(
        None, "--since", help=f"Only messages created at or after this time: {TIME_HELP}."
    ),
    until: str | None = typer.Option(
        None, "--until", help=f"Only messages created before this time: {TIME_HELP}."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing output directory."),
    master: str = MASTER,
    quiet: bool = QUIET,
) -> None:
    """Archive a topic to parquet or JSON files (one row per message, every field kept)."""
    from bucketq.spark import pipelines

    try:
        window = {  # Unix seconds, as the source's since/until options take them (before Spark starts)
            name: None if text is None else repr(parse_time(text))
            for name, text in (("since", since), ("until", until))
        }
        started = time.monotonic()
        spark = _session(ctx, master)
        count = pipelines.export(
            spark,
            _settings(ctx),
            topic,
            to,
            fmt.value,
            since=window["since"],
            until=window["until"],
            overwrite=overwrite,
            show=not quiet,
        )
    except Exception as exc:
        _fail(ctx, exc)
    out().print(
        f"exported {count} messages of {topic} to {to} ({fmt.value}) in {time.monotonic() - started:.1f}s"
    )


@app.command("backfill")
def backfill_command(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="Target topic."),
    source: str = typer.Option(..., "--from", help="Dataset to load (file, directory or Spark URI)."),
    fmt: InputFormat = typer.Option(InputFormat.parquet, "--format", "-f", help="Dataset format."),
    partitions: int | None = typer.Option(
        None, "--create", min=1, help="Create the topic with this many partitions if it does not exist."
    ),
    payload_format: str = typer.Option(
        "json", "--payload-format", help="A string 'payload' column holds: json (JSON text) or string."
    ),
    batch_messages: int = typer.Option(5000, "--batch-messages", min=1, help="Messages per segment."),
    dedup: bool = typer.Option(
        True,
        "--dedup/--no-dedup",
        help="Skip rows whose 'id' the topic already has (or the dataset repeats).",
    ),
    job_id: str | None = typer.Option(
        None, "--job-id", help="Write job id. \\[default: derived from the topic, options and input files]"
    ),
    master: str = MASTER,
    quiet: bool = QUIET,
) -> None:
    """Bulk-load a dataset into a topic: all of it becomes visible at once, or nothing on failure.

    Running the same backfill again adds nothing (same job id; rows with known ids skipped)."""
    from bucketq.spark import pipelines

    try:
        started = time.monotonic()
        spark = _session(ctx, master)
        report = pipelines.backfill(
            spark,
            _settings(ctx),
            source,
            fmt.value,
            topic,
            partitions=partitions,
            show=not quiet,
            dedup=dedup,
            job=job_id,
            payloadFormat=payload_format,
            batchMessages=batch_messages,
        )
    except Exception as exc:
        _fail(ctx, exc)
    if report.get("skipped"):
        out().print(
            f"nothing to do: job {report['job']} already published {report['messages']} messages to {topic}"
        )
        if report.get("input_changed"):
            out().print(
                "[yellow]warning:[/] this run's input differs from the committed run's; "
                "nothing of it was written (give another --job-id to write it)"
            )
        return
    line = (
        f"published {report['messages']} messages to {topic} in {report.get('chunks', 0)} chunks "
        f"({report['bytes'] / 1e6:.1f} MB) in {time.monotonic() - started:.1f}s"
    )
    if report.get("skipped_ids"):
        line += (
            f"; skipped {report['skipped_ids']} rows whose id the topic already had or the dataset repeated"
        )
    out().print(line)


@app.command("redrive")
def redrive_command(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="A topic (its dead letters) or a dead-letter topic."),
    to: str | None = typer.Option(
        None,
        "--to",
        help="The source topic to move them back to, when the argument is a dead-letter topic. "
        "\\[default: the topic given]",
    ),
    where: str | None = typer.Option(
        None,
        "--filter",
        help="SQL condition on the dead letters, e.g. \"headers['bucketq-dlq-reason'] = 'timeout'\".",
    ),
    consumer: str = typer.Option(
        "redrive", "--redrive-consumer", help="The dead-letter topic's subscription that records what moved."
    ),
    batch: int = typer.Option(100_000, "--batch", min=1, help="Dead letters per round."),
    spark_above: int = typer.Option(
        10_000,
        "--spark-above",
        min=0,
        help="Up to this many waiting dead letters (and no --filter) are moved without Spark, as "
        "'bucketq dlq redrive' does: seconds instead of a Spark job. 0: always Spark.",
    ),
    master: str = MASTER,
    quiet: bool = QUIET,
) -> None:
    """Move dead letters back to their source topic (acked in the DLQ only once durable there).

    Few dead letters (up to --spark-above, no --filter) are moved the way 'bucketq dlq redrive'
    moves them, in seconds; a Spark job is for millions."""
    from bucketq.spark import pipelines

    dlq, topic = _redrive_topics(ctx, name, to)
    if where is None:
        try:
            small = pipelines.redrive_without_spark(
                _settings(ctx), dlq, topic, consumer=consumer, limit=spark_above
            )
        except Exception as exc:
            _fail(ctx, exc)
        if small is not None:
            out().print(
                f"redrove {small.moved} dead letters from {dlq} to {topic} without Spark (at most "
                f"{spark_above} waited: the path of 'bucketq dlq redrive'); acked {small.acked} in "
                f"consumer {consumer!r}"
            )
            if small.lost:
                out().print(
                    f"[yellow]warning:[/] {small.lost} acks lost their lease (those may be redriven again)"
                )
            return
    try:
        spark = _session(ctx, master)
        report = pipelines.redrive(
            spark, _settings(ctx), dlq, topic, where=where, consumer=consumer, batch=batch, show=not quiet
        )
    except Exception as exc:
        _fail(ctx, exc)
    out().print(
        f"redrove {report.moved} dead letters from {dlq} to {topic} in {report.rounds} round(s); "
        f"acked {report.acked} in consumer {consumer!r}"
    )
    if report.claimed < report.selected or report.lost:
        out().print(
            f"[yellow]warning:[/] {report.selected - report.claimed} were leased by another member and "
            f"{report.lost} acks lost their lease (those may be redriven again)"
        )


def _redrive_topics(ctx: typer.Context, name: str, to: str | None) -> tuple[str, str]:
    """(dead-letter topic, source topic) of ``spark redrive NAME [--to SOURCE]``: NAME is a topic
    (its dead letters move back into it) or a dead-letter topic (then --to names the source)."""
    conn = connection(ctx)

    async def find() -> tuple[str, str]:
        async with conn.open() as bq:
            dlq, source = await resolve(bq, name)
        if source is not None and to is not None and to != source:
            raise CliError(
                f"the Spark redrive moves {source!r}'s dead letters back into {source!r}, not {to!r}: "
                f"use 'bucketq dlq redrive {source} --to {to}'"
            )
        target = source or to
        if target is None:
            raise CliError(
                f"{name!r} is a dead-letter topic: name the source topic its dead letters go back to "
                "('bucketq spark redrive SOURCE', or --to SOURCE)"
            )
        return dlq, target

    return run(find(), debug=conn.debug)


@app.command("stats")
def stats_command(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="Topic to analyse."),
    hours: int = typer.Option(48, "--hours", min=1, help="Most recent hours to list."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    master: str = MASTER,
) -> None:
    """Per-partition and per-hour counts, payload sizes and dead-letter reasons."""
    from bucketq.spark import pipelines

    try:
        spark = _session(ctx, master)
        result = pipelines.stats(spark, _settings(ctx), topic, hours=hours)
    except Exception as exc:
        _fail(ctx, exc)
    if as_json:
        out().print_json(json.dumps(result, default=str))
        return
    _print_stats(result)


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    table = Table(title=title, title_justify="left")
    for c in columns:
        table.add_column(c, justify="left" if c in ("reason", "hour", "oldest", "newest") else "right")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    return table


def _print_stats(r: dict[str, Any]) -> None:
    console = out()
    parts = r["partitions"]
    console.print(
        _table(
            f"{r['topic']}: {sum(p['messages'] for p in parts)} messages",
            ["partition", "messages", "segments", "bytes", "oldest", "newest"],
            [
                [p["partition"], p["messages"], p["segments"], p["bytes"], p["oldest"], p["newest"]]
                for p in parts
            ],
        )
    )
    console.print(
        _table(
            "messages per hour (newest first)",
            ["hour", "messages"],
            [[h["hour"], h["count"]] for h in r["hours"]],
        )
    )
    s = r["payload_bytes"]
    avg = f"{s['avg']:.1f}" if s["avg"] is not None else None
    console.print(
        _table(
            "payload bytes",
            ["min", "avg", "p50", "p95", "p99", "max"],
            [[s["min"], avg, s["p50"], s["p95"], s["p99"], s["max"]]],
        )
    )
    if r["dead_letter_reasons"]:
        console.print(
            _table(
                f"dead-letter reasons ({r['dead_letter_source']})",
                ["reason", "messages"],
                [[x["reason"], x["count"]] for x in r["dead_letter_reasons"]],
            )
        )
    else:
        console.print("no dead letters")
