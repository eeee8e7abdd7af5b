"""``bucketq gc``: run one garbage collection (the operator runs it on a timer)."""

from __future__ import annotations

import json
from dataclasses import asdict

import typer
from rich.markup import escape

from bucketq.cli.connection import Connection, connection
from bucketq.cli.errors import out, run


def gc(
    ctx: typer.Context,
    topics: list[str] | None = typer.Argument(None, help="Only these topics (default: every topic)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Collect garbage once: consumed segments past retention, old cursor deltas, stale heartbeats
    and dedup markers, and what a topic's retention limits free (see docs/operations.md).

    Freeing is two-phase (a fence first, deletion in a later collection once the fence is old
    enough), so a single run may only raise fences: the next one deletes."""
    conn = connection(ctx)
    run(_gc(conn, topics or None, as_json), debug=conn.debug)


async def _gc(conn: Connection, topics: list[str] | None, as_json: bool) -> None:
    from bucketq.core.keys import validate_name

    for topic in topics or []:
        validate_name(topic)
    async with conn.open() as bq:
        for topic in topics or []:
            await bq.catalog.config(topic)  # an unknown topic is an error, not a no-op
        report = await bq.collect_garbage(topics)
    data = asdict(report)
    data.pop("deleted_keys", None)
    data.pop("foreign_keys", None)
    if as_json:
        typer.echo(json.dumps({**data, "total": report.total}, indent=2))
        return
    offset, warned = data.pop("clock_offset_s", None), data.pop("clock_warning", False)
    parts = [f"{v:,} {k.replace('_', ' ')}" for k, v in data.items() if v]
    if warned and offset is not None:  # ages were measured on the store's clock all the same (I15)
        parts.append(
            f"this host's clock is {abs(offset):.0f}s {'ahead of' if offset > 0 else 'behind'} the store's"
        )
    what = ", ".join(parts) if parts else "nothing to collect"
    scope = ", ".join(topics) if topics else "every topic"
    out().print(f"gc of {escape(scope)}: {escape(what)}")
