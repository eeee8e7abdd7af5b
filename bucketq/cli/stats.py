"""``bucketq stats``: backlog, leased, dead-lettered and oldest age per topic and consumer."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from bucketq.cli.connection import Connection, connection
from bucketq.cli.consumers import dead_count
from bucketq.cli.errors import EXIT_ERROR, CliError, fail, out, run
from bucketq.cli.formats import DURATION_HELP, human_duration, human_time, parse_duration
from bucketq.cli.output import Cell, Column, print_table, rich_table

if TYPE_CHECKING:
    from bucketq import Bucketq, SubscriptionStats

COLUMNS = (
    Column("topic"),
    Column("consumer"),
    Column("messages", "number"),
    Column("backlog", "number"),
    Column("leased", "number"),
    Column("dead-lettered", "number"),
    Column("oldest", "duration"),
)


def stats(
    ctx: typer.Context,
    topic: str | None = typer.Argument(None, help="Only this topic. \\[default: every topic]"),
    consumer: str | None = typer.Option(None, "--consumer", "-c", help="Only this consumer."),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh every --interval until Ctrl-C."),
    interval: str = typer.Option(
        "2s", "--interval", help=f"With --watch: time between refreshes ({DURATION_HELP})."
    ),
    sidecar: str | None = typer.Option(
        None,
        "--sidecar",
        help="Also ask this sidecar (its API URL, e.g. $BUCKETQ_SIDECAR_URL) which of its leases its app "
        "holds and which it prefetched.",
        show_default=False,
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print JSON (with per-partition detail; with --watch one line per refresh)."
    ),
) -> None:
    """Show queue statistics per topic and consumer.

    Leased counts every live lease: messages handed to an app and not yet settled, and those a
    sidecar or the library prefetched (a sidecar's /v1/status separates the two).
    """
    conn = connection(ctx)
    try:
        every = parse_duration(interval)
    except CliError as exc:
        fail(exc)
    if sidecar is not None and (watch or as_json):
        fail(
            CliError(
                "--sidecar prints a line for people: not with --watch or --json (GET /v1/status is JSON)"
            )
        )
    run(_stats(conn, topic, consumer, as_json, every if watch else None), debug=conn.debug)
    if sidecar is not None:
        run(_sidecar_leases(sidecar), debug=conn.debug)


async def _stats(
    conn: Connection, topic: str | None, consumer: str | None, as_json: bool, watch_s: float | None
) -> None:
    from bucketq.core.keys import validate_name

    if topic is not None:
        validate_name(topic)
    if consumer is not None:
        validate_name(consumer, "consumer")
    async with conn.open() as bq:
        if topic is not None:
            await bq.catalog.config(topic)  # an unknown topic is an error, not an empty table
        if watch_s is None:
            rows = await bq.stats(topic, consumer)
            if as_json:
                typer.echo(json.dumps([r.to_json() for r in rows], indent=2))
            else:
                print_stats(rows, topic, out())
            return
        try:
            await _watch(bq, topic, consumer, as_json, watch_s, out())
        except (KeyboardInterrupt, asyncio.CancelledError):
            return


async def _watch(
    bq: Bucketq, topic: str | None, consumer: str | None, as_json: bool, every: float, console: Console
) -> None:
    """Refresh until interrupted: in place on a terminal, a timestamped table (or JSON line) each
    time elsewhere, so that a log of it reads as a history."""
    if as_json or not console.is_terminal:
        while True:
            rows = await bq.stats(topic, consumer)
            if as_json:
                typer.echo(json.dumps({"at": time.time(), "stats": [r.to_json() for r in rows]}))
            else:
                console.print(f"# {human_time(time.time())}", markup=False)
                print_stats(rows, topic, console)
                console.print()
            await asyncio.sleep(every)
    with Live(console=console, auto_refresh=False, transient=False) as live:
        while True:
            rows = await bq.stats(topic, consumer)
            head = Text(
                f"{human_time(time.time())}, every {human_duration(every)} (Ctrl-C to stop)", style="dim"
            )
            body = rich_table(COLUMNS, stats_rows(rows)) if rows else Text(_empty(topic))
            live.update(Group(head, body), refresh=True)
            await asyncio.sleep(every)


async def _sidecar_leases(url: str) -> None:
    """The sidecar's leases split as its /v1/status splits them: handed to the app and not settled,
    and prefetched (held for the next pulls or pushes)."""
    from bucketq.client import AsyncClient, SidecarError

    try:
        async with AsyncClient(url, timeout=10) as client:
            status = await client.status()
    except SidecarError as exc:
        raise CliError(f"sidecar {url} did not answer its status: {exc}", EXIT_ERROR) from None
    held = int(status.get("leases_held", 0))
    delivered = int(status.get("delivered_unsettled", 0))
    out().print(
        f"sidecar {url} ({status.get('consumer') or 'publish only'}): {held:,} leased = "
        f"{delivered:,} delivered to the app and not settled + {max(0, held - delivered):,} prefetched",
        markup=False,
        highlight=False,
    )


def _empty(topic: str | None) -> str:
    return "no subscriptions" + (f" on {topic}" if topic else "")


def stats_rows(rows: list[SubscriptionStats]) -> list[tuple[Cell, ...]]:
    return [
        (
            r.topic,
            r.consumer,
            f"{r.messages:,}",
            f"{r.backlog:,}",
            f"{r.in_flight:,}",
            dead_count(r.dead_lettered),
            human_duration(r.oldest_age_s),
        )
        for r in rows
    ]


def print_stats(rows: list[SubscriptionStats], topic: str | None, console: Console) -> None:
    if not rows:
        console.print(_empty(topic), markup=False)
        return
    print_table(COLUMNS, stats_rows(rows), console)
