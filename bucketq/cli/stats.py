"""``bucketq stats``: backlog, in flight, dead-lettered and oldest age per topic and consumer."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.table import Table

from bucketq.cli.connection import Connection, connection
from bucketq.cli.errors import out, run
from bucketq.cli.formats import human_duration

if TYPE_CHECKING:
    from bucketq import SubscriptionStats


def stats(
    ctx: typer.Context,
    topic: str | None = typer.Argument(None, help="Only this topic (default: every topic)."),
    consumer: str | None = typer.Option(None, "--consumer", "-c", help="Only this consumer."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (with per-partition detail)."),
) -> None:
    """Show queue statistics per topic and consumer."""
    conn = connection(ctx)
    run(_stats(conn, topic, consumer, as_json), debug=conn.debug)


async def _stats(conn: Connection, topic: str | None, consumer: str | None, as_json: bool) -> None:
    from bucketq.core.keys import validate_name

    if topic is not None:
        validate_name(topic)
    if consumer is not None:
        validate_name(consumer, "consumer")
    async with conn.open() as bq:
        if topic is not None:
            await bq.catalog.config(topic)  # an unknown topic is an error, not an empty table
        rows = await bq.stats(topic, consumer)
    if as_json:
        typer.echo(json.dumps([r.to_json() for r in rows], indent=2))
        return
    if not rows:
        out().print("no subscriptions" + (f" on {escape(topic)}" if topic else ""))
        return
    out().print(stats_table(rows))


def stats_table(rows: list[SubscriptionStats]) -> Table:
    table = Table(header_style="bold")
    for col in ("topic", "consumer", "messages", "backlog", "in flight", "dead-lettered", "oldest age"):
        table.add_column(col, justify="left" if col in ("topic", "consumer") else "right", min_width=len(col))
    for r in rows:
        table.add_row(
            escape(r.topic),
            escape(r.consumer),
            f"{r.messages:,}",
            f"{r.backlog:,}",
            f"{r.in_flight:,}",
            f"[red]{r.dead_lettered:,}[/]" if r.dead_lettered else "0",
            human_duration(r.oldest_age_s),
        )
    return table
