"""``bucketq consumer list|describe|delete``: subscriptions (consumer groups) of topics."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.text import Text

from bucketq.cli.connection import Connection, connection
from bucketq.cli.errors import CliError, confirm, fail, out, run, warn
from bucketq.cli.formats import TIME_HELP, UNIX_SECONDS_FROM, human_age, human_duration, parse_time
from bucketq.cli.output import Column, print_fields, print_table

if TYPE_CHECKING:
    from rich.console import Console

    from bucketq import Bucketq, SubscriptionStats
    from bucketq.core.subscriptions import SeekTarget

app = typer.Typer(
    help="Subscriptions (consumer groups): list, describe, delete, seek.",
    no_args_is_help=True,
)


def _row(s: SubscriptionStats, now: float) -> dict[str, Any]:
    idle = None if s.last_activity is None else max(0.0, now - s.last_activity)
    return {
        "topic": s.topic,
        "consumer": s.consumer,
        "backlog": s.backlog,
        "in_flight": s.in_flight,
        "dead_lettered": s.dead_lettered,
        "acked": s.acked,
        "collected": s.collected,
        "members": s.members,
        "last_activity": s.last_activity,
        "idle_s": idle,
    }


@app.command("list")
def list_command(
    ctx: typer.Context,
    topic: str | None = typer.Argument(None, help="Only this topic. \\[default: every topic]"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Subscriptions with backlog, leased, dead-lettered, members and idle time."""
    conn = connection(ctx)
    run(_list(conn, topic, as_json), debug=conn.debug)


async def _list(conn: Connection, topic: str | None, as_json: bool) -> None:
    from bucketq.core.keys import validate_name

    if topic is not None:
        validate_name(topic)
    async with conn.open() as bq:
        if topic is not None:
            await bq.catalog.config(topic)  # an unknown topic is an error, not an empty list
        rows = [_row(s, time.time()) for s in await bq.stats(topic)]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    print_subscription_list(rows, topic, out())


def print_subscription_list(rows: list[dict[str, Any]], topic: str | None, console: Console) -> None:
    if not rows:
        console.print("no subscriptions" + (f" on {topic}" if topic else ""), markup=False)
        return
    columns = (
        Column("topic"),
        Column("consumer"),
        Column("backlog", "number"),
        Column("leased", "number"),
        Column("dead-lettered", "number"),
        Column("members", "number"),
        Column("idle", "duration"),
    )
    table = [
        (
            r["topic"],
            r["consumer"],
            f"{r['backlog']:,}",
            f"{r['in_flight']:,}",
            dead_count(r["dead_lettered"]),
            str(len(r["members"])),
            "never" if r["idle_s"] is None else human_duration(r["idle_s"]),
        )
        for r in rows
    ]
    print_table(columns, table, console)


def dead_count(n: int) -> Text:
    """A dead-letter count, red when not 0."""
    return Text(f"{n:,}", style="red" if n else "")


@app.command("describe")
def describe(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="Topic."),
    consumer: str = typer.Argument(..., help="Consumer (group) name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (with per-partition detail)."),
) -> None:
    """One subscription in detail: backlog, leased, delayed, acked, dead-lettered per partition."""
    conn = connection(ctx)
    run(_describe(conn, topic, consumer, as_json), debug=conn.debug)


async def _require(bq: Bucketq, topic: str, consumer: str) -> None:
    from bucketq.core.keys import validate_name

    validate_name(topic)
    validate_name(consumer, "consumer")
    if consumer not in await bq.catalog.consumers(topic):
        raise CliError(f"no subscription {consumer!r} on {topic!r} (bucketq consumer list {topic})")


async def _describe(conn: Connection, topic: str, consumer: str, as_json: bool) -> None:
    async with conn.open() as bq:
        await _require(bq, topic, consumer)
        [s] = await bq.stats(topic, consumer)
    now = time.time()
    if as_json:
        typer.echo(json.dumps({**_row(s, now), "partitions": s.to_json()["partitions"]}, indent=2))
        return
    print_subscription(s, now, console=out())


def print_subscription(s: SubscriptionStats, now: float, console: Console) -> None:
    """The subscription's totals and members, then one row per partition."""
    console.print(f"subscription {s.consumer} of {s.topic}", markup=False, style="bold")
    print_fields(
        [
            ("backlog", f"{s.backlog:,} (oldest {human_duration(s.oldest_age_s)})"),
            ("leased", f"{s.in_flight:,}"),
            ("dead-lettered", f"{s.dead_lettered:,}"),
            ("members", ", ".join(s.members) or "none"),
            ("last activity", human_age(s.last_activity, now)),
        ],
        console,
    )
    columns = (
        Column("partition", "number"),
        Column("messages", "number"),
        Column("backlog", "number"),
        Column("leased", "number"),
        Column("delayed", "number"),
        Column("acked", "number"),
        Column("dead-lettered", "number"),
        Column("oldest", "duration"),
    )
    rows = [
        (
            str(p.partition),
            f"{p.messages:,}",
            f"{p.backlog:,}",
            f"{p.in_flight:,}",
            f"{p.delayed:,}",
            f"{p.acked:,}",
            dead_count(p.dead_lettered),
            human_duration(p.oldest_age_s),
        )
        for p in s.partitions
    ]
    print_table(columns, rows, console)


@app.command("delete")
def delete(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="Topic."),
    consumer: str = typer.Argument(..., help="Consumer (group) name."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete a subscription: its cursors go, so it no longer holds the topic's data.

    Members still running recreate it from their start position.
    """
    conn = connection(ctx)
    confirm(
        f"Delete subscription {consumer!r} of {topic!r}?",
        f"delete subscription {consumer!r} of {topic!r}",
        yes,
    )
    run(_delete(conn, topic, consumer), debug=conn.debug)


async def _delete(conn: Connection, topic: str, consumer: str) -> None:
    async with conn.open() as bq:
        await _require(bq, topic, consumer)
        live = (await bq.stats(topic, consumer))[0].members
        removed = await bq.delete_subscription(topic, consumer)
    out().print(f"deleted subscription {escape(consumer)} of {escape(topic)} ({removed:,} objects)")
    if live:
        warn(f"{len(live)} member(s) still heartbeat ({', '.join(live)}): they will start it again")


@app.command("seek")
def seek(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="Topic."),
    consumer: str = typer.Argument(..., help="Consumer (group) name."),
    to: str = typer.Option(
        ...,
        "--to",
        help="earliest, latest, an offset (a number: with --partition, or the same offset in every "
        f"partition), or a time: {TIME_HELP}.",
    ),
    partition: list[int] = typer.Option([], "--partition", "-p", help="Only this partition (repeatable)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    as_json: bool = typer.Option(False, "--json", help="Print the new positions as JSON."),
) -> None:
    """Move a subscription: back to deliver messages again, or forward to skip them.

    Written as an op in each partition's cursor log, so every member of the group agrees. The
    position is a segment: an offset or time inside a segment starts at its first message.
    Messages leased at the moment of the seek stay with their holders until acked or expired.
    """
    conn = connection(ctx)
    try:
        target = _seek_target(to)
    except CliError as exc:
        fail(exc)
    confirm(
        f"Move subscription {consumer!r} of {topic!r} to {to}?",
        f"move subscription {consumer!r} of {topic!r}",
        yes,
    )
    run(_seek(conn, topic, consumer, target, partition, as_json), debug=conn.debug)


def _seek_target(text: str) -> SeekTarget:
    if text == "earliest":
        return "earliest"
    if text == "latest":
        return "latest"
    if text.isdigit() and float(text) < UNIX_SECONDS_FROM:
        return int(text)
    return parse_time(text)


async def _seek(
    conn: Connection,
    topic: str,
    consumer: str,
    target: SeekTarget,
    partitions: list[int],
    as_json: bool,
) -> None:
    from bucketq.cli.peek import check_partitions

    async with conn.open() as bq:
        await _require(bq, topic, consumer)
        await check_partitions(bq, topic, partitions)
        moved = await bq.seek(topic, consumer, target, partitions=partitions or None)
    if as_json:
        typer.echo(json.dumps({str(p): {"seq": s, "offset": o} for p, (s, o) in moved.items()}, indent=2))
        return
    where = ", ".join(f"p{p}@{o:,}" for p, (_, o) in sorted(moved.items()))
    out().print(f"moved {escape(consumer)} on {escape(topic)} to {where}")
