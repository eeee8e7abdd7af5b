"""``bucketq topic create|list|describe|delete``."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from bucketq.cli.connection import Connection, connection
from bucketq.cli.errors import CliError, confirm, out, run, stderr, warn
from bucketq.cli.formats import (
    DURATION_HELP,
    explain,
    human_bytes,
    human_duration,
    human_time,
    parse_duration,
)
from bucketq.cli.output import Column, print_fields, print_table

if TYPE_CHECKING:
    from rich.console import Console

    from bucketq import TopicConfig, TopicInfo

app = typer.Typer(help="Create, list, describe and delete topics.", no_args_is_help=True)


@app.command("create")
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Topic name (DNS-1123: lower-case letters, digits, '-', '.')."),
    partitions: int | None = typer.Option(
        None, "--partitions", "-p", min=1, help="Partitions. \\[default: 1]"
    ),
    retention: str | None = typer.Option(
        None,
        "--retention",
        help=f"Keep consumed messages at least this long ({DURATION_HELP}). \\[default: 7d]",
    ),
    max_message_bytes: int | None = typer.Option(
        None, "--max-message-bytes", help="Largest message accepted."
    ),
    max_deliveries: int | None = typer.Option(
        None,
        "--max-deliveries",
        min=1,
        help="Dead-letter a message after this many deliveries. \\[default: 5]",
    ),
    dead_letter_topic: str | None = typer.Option(
        None, "--dead-letter-topic", help="Where dead letters go. \\[default: NAME.dlq]"
    ),
    max_retention: str | None = typer.Option(
        None,
        "--max-retention",
        help=f"Never keep a message longer, consumed or not ({DURATION_HELP}). \\[default: no limit]",
    ),
    subscription_timeout: str | None = typer.Option(
        None,
        "--subscription-timeout",
        help="A subscription with no member and no activity this long stops holding data. \\[default: never]",
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
    out().print(f"created topic [bold]{escape(name)}[/]: {escape(', '.join(config_summary(name, cfg)))}")


def config_summary(name: str, cfg: TopicConfig) -> list[str]:
    """The config as short phrases (the limits only when set)."""
    dead = cfg.dead_letter_topic(name)
    parts = [
        f"{cfg.partitions} partition(s)",
        f"retention {human_duration(cfg.retention_seconds)}",
        f"max message {human_bytes(cfg.max_message_bytes)}",
        f"dead letters after {cfg.dead_letter.max_deliveries} deliveries to {dead}"
        if dead
        else "no dead letters",
    ]
    if cfg.max_retention_seconds is not None:
        parts.append(f"max retention {human_duration(cfg.max_retention_seconds)}")
    if cfg.subscription_timeout_seconds is not None:
        parts.append(f"subscription timeout {human_duration(cfg.subscription_timeout_seconds)}")
    return parts


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
    print_topic_list(infos, out())


def print_topic_list(infos: list[TopicInfo], console: Console) -> None:
    if not infos:
        console.print("no topics")
        return
    columns = (
        Column("topic"),
        Column("partitions", "number"),
        Column("messages", "number"),
        Column("consumers", "number"),
        Column("retention", "duration"),
    )
    rows = [
        (
            info.name,
            str(info.config.partitions),
            f"{info.messages:,}",
            str(len(info.consumers)),
            human_duration(info.config.retention_seconds),
        )
        for info in infos
    ]
    print_table(columns, rows, console)


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
    print_topic(info, out())


def print_topic(info: TopicInfo, console: Console) -> None:
    """Config (every limit that is set), consumers, then the partitions."""
    cfg = info.config
    dead = cfg.dead_letter_topic(info.name)
    fields = [
        ("created", human_time(info.created_at)),
        ("partitions", str(cfg.partitions)),
        ("messages", f"{info.messages:,}"),
        ("retention", human_duration(cfg.retention_seconds)),
        (
            "max retention",
            human_duration(cfg.max_retention_seconds) if cfg.max_retention_seconds else "no limit",
        ),
        (
            "subscription timeout",
            human_duration(cfg.subscription_timeout_seconds) if cfg.subscription_timeout_seconds else "never",
        ),
        ("max message", human_bytes(cfg.max_message_bytes)),
        ("dead letters", f"after {cfg.dead_letter.max_deliveries} deliveries to {dead}" if dead else "off"),
        ("consumers", ", ".join(info.consumers) or "-"),
    ]
    console.print(f"topic {info.name}", markup=False, style="bold")
    print_fields(fields, console)
    columns = (Column("partition", "number"), Column("segments", "number"), Column("messages", "number"))
    rows = [(str(p.partition), f"{p.next_seq:,}", f"{p.next_offset:,}") for p in info.partitions]
    print_table(columns, rows, console)


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
    what = "its marker" if no_purge else "all its messages and subscriptions"
    confirm(f"Delete topic {name!r} and {what}?", f"delete topic {name!r}", yes)
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
