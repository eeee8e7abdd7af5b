"""``bucketq peek``: look at messages without consuming them (no lease, no delivery counted)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from bucketq.cli.connection import Connection, connection
from bucketq.cli.errors import CliError, out, run, stderr
from bucketq.cli.formats import TIME_HELP, human_time, parse_time

if TYPE_CHECKING:
    from rich.console import Console

    from bucketq import Bucketq
    from bucketq.core.peek import PeekedMessage


def peek(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="Topic to look at."),
    limit: int = typer.Option(10, "--max", "-n", min=1, help="Show at most this many messages."),
    partition: list[int] = typer.Option(
        [], "--partition", "-p", help="Only this partition (repeatable). \\[default: all]"
    ),
    offset: int | None = typer.Option(
        None, "--offset", min=0, help="Start at this offset in each chosen partition."
    ),
    since: str | None = typer.Option(
        None,
        "--since",
        help=f"Start at messages created at or after this time: {TIME_HELP}.",
    ),
    consumer: str | None = typer.Option(
        None,
        "--consumer",
        "-c",
        help="Start at this subscription's current window and show each message's state for it.",
    ),
    include_done: bool = typer.Option(
        False, "--include-done", help="With --consumer: also show messages it already finished."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per message."),
) -> None:
    """Show messages without consuming them: no lease, no delivery counted.

    Peeking never moves a message towards its dead-letter limit and never creates a subscription.
    """
    conn = connection(ctx)
    run(
        _peek(conn, topic, limit, partition, offset, since, consumer, include_done, as_json), debug=conn.debug
    )


async def _peek(
    conn: Connection,
    topic: str,
    limit: int,
    partitions: list[int],
    offset: int | None,
    since: str | None,
    consumer: str | None,
    include_done: bool,
    as_json: bool,
) -> None:
    from bucketq.core.keys import validate_name

    validate_name(topic)
    if consumer is not None:
        validate_name(consumer, "consumer")
    if offset is not None and since is not None:
        raise CliError("give --offset or --since, not both")
    start = parse_time(since) if since is not None else None
    async with conn.open() as bq:
        await check_partitions(bq, topic, partitions)
        if consumer is not None and consumer not in await bq.catalog.consumers(topic):
            raise CliError(f"no subscription {consumer!r} on {topic!r} (bucketq consumer list {topic})")
        found = await bq.peek(
            topic,
            limit=limit,
            partitions=partitions or None,
            offset=offset,
            since=start,
            consumer=consumer,
            include_done=include_done,
        )
    for message in found:
        print_peeked(message, as_json)
    if not found and not as_json:
        stderr().print(f"[dim]no messages on {escape(topic)} from that position[/]")


async def check_partitions(bq: Bucketq, topic: str, partitions: list[int]) -> None:
    """A usage error for a partition the topic does not have (TopicNotFound for no topic)."""
    count = (await bq.catalog.config(topic)).partitions
    wrong = [p for p in partitions if not 0 <= p < count]
    if wrong:
        raise CliError(f"topic {topic!r} has partitions 0..{count - 1}, not {wrong[0]}")


def body_text(message: PeekedMessage) -> str:
    record = message.record
    if record.data is None:
        return json.dumps(record.payload, ensure_ascii=False)
    if record.content_type.startswith("text/"):
        return record.data.decode(errors="replace")
    return f"<{len(record.data)} bytes {record.content_type}>"


def print_peeked(message: PeekedMessage, as_json: bool, console: Console | None = None) -> None:
    if as_json:
        typer.echo(json.dumps(message.to_json(), ensure_ascii=False))
        return
    record = message.record
    meta: list[str] = []
    if message.state is not None:
        meta.append(message.state)
        if message.deliveries:
            meta.append(f"deliveries={message.deliveries}")
    print_message_line(
        console or out(),
        message.partition,
        message.offset,
        record.created_at,
        record.id,
        record.key,
        record.headers,
        meta,
        body_text(message),
    )


def print_message_line(
    console: Console,
    partition: int,
    offset: int,
    created_at: float,
    message_id: str,
    key: str | None,
    headers: Mapping[str, str],
    meta: list[str],
    body: str,
) -> None:
    """One message as peek, consume and dlq show print it: position, time, id, state, key,
    headers (dim), then the body."""
    parts = [f"p{partition}@{offset}", human_time(created_at), message_id, *meta]
    if key is not None:
        parts.append(f"key={key}")
    parts.extend(f"{k}={v}" for k, v in headers.items())
    console.print(f"[dim]{escape(' '.join(parts))}[/] {escape(body)}")
