"""``bucketq dlq list|show|redrive``: dead letters without Spark.

Every command takes a topic or its dead-letter topic: ``orders`` means the dead letters of
``orders`` (``orders.dlq`` unless its config names another), ``orders.dlq`` means that topic itself.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bucketq.cli.connection import Connection, connection
from bucketq.cli.errors import EXIT_ERROR, CliError, out, run, stderr
from bucketq.cli.formats import human_duration
from bucketq.cli.output import Column, print_table
from bucketq.cli.peek import body_text, print_peeked

if TYPE_CHECKING:
    from rich.console import Console

    from bucketq import Bucketq
    from bucketq.core.peek import PeekedMessage

app = typer.Typer(
    help="Dead letters: list the dead-letter topics, show their messages, move them back (no Spark needed).",
    no_args_is_help=True,
)


async def resolve(bq: Bucketq, name: str) -> tuple[str, str | None]:
    """(dead-letter topic, source topic or None) for a topic or a dead-letter topic name."""
    config = await bq.catalog.config(name)
    dlq = config.dead_letter_topic(name)
    if dlq is None:
        return name, None  # dead-letter topics have dead-lettering disabled: this is one
    if not await bq.catalog.exists(dlq):
        raise CliError(f"{name!r} has no dead letters yet ({dlq!r} does not exist)")
    return dlq, name


@app.command("list")
def list_command(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Dead-letter topics with how many dead letters they hold and how many wait for a redrive."""
    conn = connection(ctx)
    run(_list(conn, as_json), debug=conn.debug)


async def _list(conn: Connection, as_json: bool) -> None:
    from bucketq.core.redrive import REDRIVE_CONSUMER

    rows: list[dict[str, Any]] = []
    async with conn.open() as bq:
        for topic in await bq.list_topics():
            dlq = (await bq.catalog.config(topic)).dead_letter_topic(topic)
            if dlq is None or not await bq.catalog.exists(dlq):
                continue
            stored = (await bq.describe_topic(dlq)).messages
            waiting = stored
            if REDRIVE_CONSUMER in await bq.catalog.consumers(dlq):
                [s] = await bq.stats(dlq, REDRIVE_CONSUMER)
                waiting = s.backlog + s.in_flight
            rows.append({"topic": topic, "dlq": dlq, "messages": stored, "waiting": waiting})
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    print_dlq_list(rows, out())


def print_dlq_list(rows: list[dict[str, Any]], console: Console) -> None:
    if not rows:
        console.print("no dead-letter topics")
        return
    columns = (
        Column("topic"),
        Column("dead-letter topic"),
        Column("dead letters", "number"),
        Column("not redriven", "number"),
    )
    print_table(
        columns, [(r["topic"], r["dlq"], f"{r['messages']:,}", f"{r['waiting']:,}") for r in rows], console
    )


@app.command("show")
def show(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="A topic (its dead letters) or a dead-letter topic."),
    limit: int = typer.Option(10, "--max", "-n", min=1, help="Show at most this many."),
    everything: bool = typer.Option(
        False, "--all", help="Also show dead letters already redriven. \\[default: only those waiting]"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per dead letter."),
) -> None:
    """Show dead letters: how long ago, from where, which consumer gave up and why (reads only).

    The table comes from each dead letter's bucketq-dlq-* headers; --json prints them whole.
    """
    conn = connection(ctx)
    run(_show(conn, topic, limit, everything, as_json), debug=conn.debug)


async def _show(conn: Connection, topic: str, limit: int, everything: bool, as_json: bool) -> None:
    from bucketq.core.redrive import REDRIVE_CONSUMER, SOURCE_TOPIC_HEADER

    async with conn.open() as bq:
        dlq, source = await resolve(bq, topic)
        tracked = REDRIVE_CONSUMER in await bq.catalog.consumers(dlq)
        found = await bq.peek(
            dlq,
            limit=limit if source is None else max(limit, 1000),
            consumer=REDRIVE_CONSUMER if tracked and not everything else None,
        )
    if source is not None:
        found = [m for m in found if m.record.headers.get(SOURCE_TOPIC_HEADER) == source]
    found = found[:limit]
    if as_json:
        for message in found:
            print_peeked(message, as_json=True)
        return
    if not found:
        stderr().print(f"[dim]no dead letters waiting in {escape(dlq)}[/]")
        return
    print_dead_letters(found, time.time(), out())


DEAD_LETTER_COLUMNS = (
    Column("position"),
    Column("age", "duration"),
    Column("from"),
    Column("consumer"),
    Column("deliveries", "number"),
    Column("reason", "text"),
    Column("payload", "text"),
)


def dead_letter_row(message: PeekedMessage, now: float) -> tuple[str, ...]:
    """Where the dead letter sits, how long ago it died, where from, who gave up on it and why."""
    from bucketq.core.consumer import DLQ_HEADER_PREFIX

    headers = message.record.headers

    def header(name: str) -> str:
        return headers.get(DLQ_HEADER_PREFIX + name, "")

    try:
        at: float | None = float(header("at"))
    except ValueError:
        at = None
    source = header("source-topic")
    partition = header("partition")
    origin = f"{source}/p{partition}" if source and partition else source or "-"
    return (
        f"p{message.partition}@{message.offset}",
        human_duration(now - at) if at is not None else "-",
        origin,
        header("consumer") or "-",
        header("deliveries") or "-",
        header("reason") or "-",
        body_text(message),
    )


def print_dead_letters(found: list[PeekedMessage], now: float, console: Console) -> None:
    print_table(DEAD_LETTER_COLUMNS, [dead_letter_row(m, now) for m in found], console)


@app.command("redrive")
def redrive(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="A topic (its dead letters) or a dead-letter topic."),
    to: str | None = typer.Option(
        None, "--to", help="Move into this topic. \\[default: each dead letter's source topic]"
    ),
    rate: float | None = typer.Option(
        None, "--rate", min=0.001, help="At most this many messages per second."
    ),
    limit: int | None = typer.Option(None, "--max", "-n", min=1, help="Move at most this many."),
    consumer: str | None = typer.Option(
        None, "--consumer", "-c", help="Only dead letters this consumer gave up on."
    ),
    reason: str | None = typer.Option(
        None, "--reason", help="Only dead letters with this reason (max_deliveries, nack, rejected, ...)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Move dead letters back, addressed to the consumer that failed them (bucketq-redrive-for).

    Resumable and idempotent: a dead letter is acked in the dead-letter topic's redrive
    subscription only once its copy is durable, and copies carry a dedup id derived from the dead
    letter's position, so running it again (after a crash or Ctrl-C) never copies twice.
    """
    conn = connection(ctx)
    run(_redrive(conn, topic, to, rate, limit, consumer, reason, as_json), debug=conn.debug)


async def _redrive(
    conn: Connection,
    topic: str,
    to: str | None,
    rate: float | None,
    limit: int | None,
    consumer: str | None,
    reason: str | None,
    as_json: bool,
) -> None:
    from bucketq.core.redrive import REDRIVE_CONSUMER, RedriveFilter

    async with conn.open() as bq:
        dlq, source = await resolve(bq, topic)
        total = (await bq.describe_topic(dlq)).messages
        if REDRIVE_CONSUMER in await bq.catalog.consumers(dlq):
            [s] = await bq.stats(dlq, REDRIVE_CONSUMER)
            total = s.backlog + s.in_flight
        if limit is not None:
            total = min(total, limit)
        where = RedriveFilter(source_topic=source, consumer=consumer, reason=reason)
        with Progress(
            TextColumn("redrive"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=stderr(),
            transient=True,
            disable=as_json,
        ) as bar:
            task = bar.add_task("redrive", total=total or None)
            report = await bq.redrive(
                dlq, to=to, where=where, rate=rate, limit=limit, progress=lambda n: bar.advance(task, n)
            )
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        into = ", ".join(f"{n:,} → {escape(t)}" for t, n in sorted(report.targets.items())) or "nothing"
        line = f"redrove {report.moved + report.duplicates:,} dead letter(s) of {escape(dlq)}: {into}"
        if report.duplicates:
            line += f" ({report.duplicates:,} already copied by an earlier run)"
        out().print(line)
    if report.lost:
        raise CliError(
            f"{report.lost} dead letter(s) were copied but their redrive lease ran out: a later redrive "
            "finds their copies by dedup id and does not copy them again",
            EXIT_ERROR,
        )
