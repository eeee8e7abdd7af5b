"""``bucketq topic create|list|describe|delete``."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table

from bucketq.cli.connection import Connection, connection
from bucketq.cli.errors import CliError, fail, out, run, stderr, warn
from bucketq.cli.formats import explain, human_bytes, human_duration, parse_duration

if TYPE_CHECKING:
    from bucketq import TopicConfig, TopicInfo

app = typer.Typer(help="Create, list, describe and delete topics.", no_args_is_help=True)


@app.command("create")
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Topic name (DNS-1123: lower-case letters, digits, '-', '.')."),
    partitions: int | None = typer.Option(None, "--partitions", "-p", min=1, help="Partitions (default 1)."),
    retention: str | None = typer.Option(
        None, "--retention", help="Keep messages this long: 3600, 90m, 12h, 7d."
    ),
    max_message_bytes: int | None = typer.Option(
        None, "--max-message-bytes", help="Largest message accepted."
    ),
    max_deliveries: int | None = typer.Option(
        None, "--max-deliveries", min=1, help="Dead-letter a message after this many deliveries (default 5)."
    ),
    dead_letter_topic: str | None = typer.Option(
        None, "--dead-letter-topic", help="Where dead letters go (default NAME.dlq)."
    ),
    max_retention: str | None = typer.Option(
        None,
        "--max-retention",
        help="Never keep a message longer, consumed or not (default: no limit): 30d.",
    ),
    subscription_timeout: str | None = typer.Option(
        None,
        "--subscription-timeout",
        help="A subscription with no member and no activity this long stops holding data (default: never).",
    ),
) -> None:
    """Create a topic (idempotent: an existing topic is kept as it is)."""
    conn = connection(ctx)
    dead_letter: dict[str, Any] = {}
    if max_deliveries is not None:
        dead_letter["max_deliveries"] = max_deliveries
    if dead_letter_topic is not None:
        dead_letter["topic"] = dead_letter_topic
    fields: dict[str, Any] = {
        "partitions": partitions,
        "retention_seconds": retention,
        "max_message_bytes": max_message_bytes,
        "dead_letter": dead_letter or None,
        "max_retention_seconds": max_retention,
        "subscription_timeout_seconds": subscription_timeout,
    }
    run(_create(conn, name, fields), debug=conn.debug)


DURATION_FIELDS = ("retention_seconds", "max_retention_seconds", "subscription_timeout_seconds")


async def _create(conn: Connection, name: str, fields: dict[str, Any]) -> None:
    from bucketq.core.keys import validate_name

    validate_name(name)
    for field in DURATION_FIELDS:  # parsed here: a bad duration is reported like any bad input
        if fields.get(field) is not None:
            fields[field] = parse_duration(fields[field])
    dead_letter = fields.get("dead_letter")
    asked = {k: v for k, v in fields.items() if v is not None}
    config = topic_config(asked)
    async with conn.open() as bq:
        existed = await bq.catalog.exists(name)
        marker = await bq.create_topic(name, config=config)
    cfg = marker.config
    if existed:
        differs = [k for k, v in asked.items() if k != "dead_letter" and getattr(cfg, k) != v]
        if dead_letter and any(getattr(cfg.dead_letter, k) != v for k, v in dead_letter.items()):
            differs.append("dead letter policy")
        out().print(f"topic [bold]{escape(name)}[/] already exists ({cfg.partitions} partitions)")
        if differs:
            warn(f"topic {name!r} kept its existing config; it differs in: {', '.join(differs)}")
        return
    out().print(
        f"created topic [bold]{escape(name)}[/]: {cfg.partitions} partition(s), retention "
        f"{human_duration(cfg.retention_seconds)}, max message {human_bytes(cfg.max_message_bytes)}, "
        f"dead letters after {cfg.dead_letter.max_deliveries} deliveries to {cfg.dead_letter_topic(name)}"
    )


def topic_config(fields: dict[str, Any]) -> TopicConfig:
    """A validated TopicConfig, or a CliError listing what is wrong."""
    from pydantic import ValidationError

    from bucketq import TopicConfig

    try:
        return TopicConfig(**fields)
    except ValidationError as exc:
        raise CliError(f"invalid topic config: {explain(exc)}") from None


@app.command("list")
def list_topics(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list of topic names."),
) -> None:
    """List the topics in the bucket."""
    conn = connection(ctx)
    run(_list(conn, as_json), debug=conn.debug)


async def _list(conn: Connection, as_json: bool) -> None:
    async with conn.open() as bq:
        names = await bq.list_topics()
        infos = [] if as_json else await _describe_many(bq, names)
    if as_json:
        typer.echo(json.dumps(names))
        return
    if not names:
        out().print("no topics")
        return
    table = Table(header_style="bold")
    for col in ("topic", "partitions", "messages", "consumers", "retention"):
        table.add_column(col, justify="left" if col == "topic" else "right")
    for info in infos:
        table.add_row(
            escape(info.name),
            str(info.config.partitions),
            f"{info.messages:,}",
            str(len(info.consumers)),
            human_duration(info.config.retention_seconds),
        )
    out().print(table)


async def _describe_many(bq: Any, names: list[str]) -> list[TopicInfo]:
    slots = asyncio.Semaphore(16)

    async def one(name: str) -> TopicInfo:
        async with slots:
            info: TopicInfo = await bq.describe_topic(name)
            return info

    return list(await asyncio.gather(*(one(n) for n in names)))


@app.command("describe")
def describe(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Topic name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show a topic's config, partitions and consumers."""
    conn = connection(ctx)
    run(_describe(conn, name, as_json), debug=conn.debug)


def topic_json(info: TopicInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "created_at": info.created_at,
        "config": info.config.model_dump(mode="json"),
        "dead_letter_topic": info.config.dead_letter_topic(info.name),
        "messages": info.messages,
        "partitions": [
            {"partition": p.partition, "next_seq": p.next_seq, "messages": p.next_offset}
            for p in info.partitions
        ],
        "consumers": info.consumers,
    }


async def _describe(conn: Connection, name: str, as_json: bool) -> None:
    async with conn.open() as bq:
        info = await bq.describe_topic(name)
    if as_json:
        typer.echo(json.dumps(topic_json(info), indent=2))
        return
    cfg = info.config
    created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info.created_at))
    dead = (
        f"after {cfg.dead_letter.max_deliveries} deliveries to {cfg.dead_letter_topic(info.name)}"
        if cfg.dead_letter.enabled
        else "off"
    )
    console = out()
    console.print(f"[bold]topic {escape(info.name)}[/]")
    for label, value in (
        ("created", created),
        ("partitions", str(cfg.partitions)),
        ("messages", f"{info.messages:,}"),
        ("retention", human_duration(cfg.retention_seconds)),
        ("max message", human_bytes(cfg.max_message_bytes)),
        ("dead letters", dead),
        ("consumers", ", ".join(info.consumers) or "-"),
    ):
        console.print(f"  {label:<13} {escape(value)}")
    table = Table(header_style="bold")
    table.add_column("partition", justify="right")
    table.add_column("segments", justify="right")
    table.add_column("messages", justify="right")
    for p in info.partitions:
        table.add_row(str(p.partition), f"{p.next_seq:,}", f"{p.next_offset:,}")
    console.print(table)


@app.command("delete")
def delete(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Topic name."),
    no_purge: bool = typer.Option(
        False, "--no-purge", help="Only remove the topic marker; keep its messages and cursors in the bucket."
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete a topic and (unless --no-purge) every object under it."""
    conn = connection(ctx)
    if not yes:
        if not sys.stdin.isatty():
            fail(CliError(f"refusing to delete topic {name!r} without --yes (stdin is not a terminal)"))
        what = "its marker" if no_purge else "all its messages and subscriptions"
        typer.confirm(f"Delete topic {name!r} and {what}?", abort=True)
    run(_delete(conn, name, purge=not no_purge), debug=conn.debug)


async def _delete(conn: Connection, name: str, *, purge: bool) -> None:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    async with conn.open() as bq:
        # the object count is not known up front (LIST pages as it deletes): a running count
        with Progress(
            SpinnerColumn(),
            TextColumn("deleting {task.fields[name]}: {task.completed:,} objects"),
            TimeElapsedColumn(),
            console=stderr(),
            transient=True,
        ) as bar:
            task = bar.add_task("delete", total=None, name=name)
            deleted = await bq.delete_topic(name, purge=purge, progress=lambda n: bar.advance(task, n))
    detail = f"{deleted} object(s) removed" if purge else "marker removed, objects kept"
    out().print(f"deleted topic [bold]{escape(name)}[/] ({detail})")
