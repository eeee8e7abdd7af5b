"""``bucketq gc``: run one garbage collection (the operator runs it on a timer)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import typer

from bucketq.cli.connection import Connection, connection
from bucketq.cli.errors import out, run
from bucketq.cli.formats import human_bytes
from bucketq.cli.output import Column, print_table

if TYPE_CHECKING:
    from rich.console import Console

    from bucketq.core.gc import GcReport

# What a collection deletes, by kind, in the order a person reads them (GcReport's counters).
DELETED_KINDS = (
    ("segments", "segments"),
    ("deltas", "cursor deltas"),
    ("checkpoints", "checkpoints"),
    ("members", "stale heartbeats"),
    ("dedup_markers", "dedup markers"),
    ("probes", "probes"),
    ("claims", "claims"),
    ("orphans", "orphans"),
    ("transactions", "job records"),
)


def gc(
    ctx: typer.Context,
    topics: list[str] | None = typer.Argument(None, help="Only these topics. \\[default: every topic]"),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Collect garbage once: what retention frees, old cursor deltas, stale heartbeats.

    Also dedup markers past their window, and what a topic's retention limits free (see
    docs/operations.md). Freeing is two-phase (a fence first, deletion in a later collection once
    the fence is old enough), so a single run may only raise fences: the next one deletes.
    """
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
    if as_json:
        typer.echo(json.dumps(gc_json(report), indent=2))
        return
    print_gc(report, topics, out())


def gc_json(report: GcReport) -> dict[str, Any]:
    data = asdict(report)
    data.pop("deleted_keys", None)
    data.pop("foreign_keys", None)
    return {**data, "total": report.total}


def print_gc(report: GcReport, topics: list[str] | None, console: Console) -> None:
    """One line of what was deleted and raised, the subscriptions passed, and what each topic stores."""
    scope = ", ".join(topics) if topics else "every topic"
    deleted = [
        f"{getattr(report, field):,} {label}" for field, label in DELETED_KINDS if getattr(report, field)
    ]
    parts = [f"deleted {report.total:,} objects ({', '.join(deleted)})" if deleted else "deleted nothing"]
    if report.fences_raised:
        parts.append(f"{report.fences_raised:,} fences raised (deleted by a later run)")
    if report.expired_unconsumed:
        parts.append(f"{report.expired_unconsumed:,} segments expired unconsumed")
    if report.kept_segments_unconsumed:
        parts.append(f"{report.kept_segments_unconsumed:,} segments kept for subscriptions behind")
    if report.foreign_objects:
        parts.append(f"{report.foreign_objects:,} objects bucketq does not write left alone")
    console.print(f"gc of {scope}: {'; '.join(parts)}", markup=False)
    if report.clock_warning and report.clock_offset_s is not None:
        # ages were measured on the store's clock all the same (I15): a warning, not an error
        offset = report.clock_offset_s
        console.print(
            f"warning: this host's clock is {abs(offset):.0f}s "
            f"{'ahead of' if offset > 0 else 'behind'} the store's (ages are measured on the store's)",
            markup=False,
        )
    if report.abandoned_subscriptions:
        console.print(
            "no longer holding data (past the subscription timeout): "
            + ", ".join(report.abandoned_subscriptions),
            markup=False,
        )
    if report.stored:
        columns = (
            Column("topic"),
            Column("segments", "number"),
            Column("stored", "number"),
            Column("held for lagging", "number"),
        )
        rows = [
            (topic, f"{s.segments:,}", human_bytes(s.bytes), f"{s.held_for_lagging:,}")
            for topic, s in sorted(report.stored.items())
        ]
        print_table(columns, rows, console)
