"""``bucketq doctor``: check that a store does what the protocol assumes of it, before trusting it."""

from __future__ import annotations

import json

import typer
from rich.markup import escape

from bucketq.cli.connection import Connection, connection
from bucketq.cli.errors import EXIT_ERROR, out, run
from bucketq.storage.checks import DEFAULT_ROUNDS, DEFAULT_WRITERS, StoreReport

MARKS = {"pass": "[green]PASS[/]", "fail": "[bold red]FAIL[/]", "skip": "[yellow]SKIP[/]"}


def doctor(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    writers: int = typer.Option(
        DEFAULT_WRITERS, "--writers", min=2, help="Writers racing for each key in the put-if-absent check."
    ),
    rounds: int = typer.Option(
        DEFAULT_ROUNDS, "--rounds", min=1, help="Races run at once in the put-if-absent check."
    ),
    clock_tolerance: float | None = typer.Option(
        None,
        "--clock-tolerance",
        min=0,
        help="Largest offset allowed between the host's clock and the store's, in seconds.",
        show_default="the engine's clock_skew_s",
    ),
) -> None:
    """Check the store before trusting it: put-if-absent atomic under concurrent writers, If-Match
    honoured, read-after-write and list-after-write, the host clock against the store's.

    Writes and deletes a few objects under ROOT/_doctor/ only. Exits 1 when a check fails
    (docs/operations.md, "Checking your store")."""
    conn = connection(ctx)
    report = run(_doctor(conn, writers, rounds, clock_tolerance), debug=conn.debug)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        print_report(report)
    if not report.ok:
        raise typer.Exit(EXIT_ERROR)


async def _doctor(conn: Connection, writers: int, rounds: int, clock_tolerance: float | None) -> StoreReport:
    from bucketq.storage import open_storage
    from bucketq.storage.checks import check_store

    settings = conn.settings()
    tolerance = settings.consumer.clock_skew_s if clock_tolerance is None else clock_tolerance
    storage = await open_storage(settings)
    try:
        return await check_store(
            storage, settings.root, writers=writers, rounds=rounds, clock_tolerance_s=tolerance
        )
    finally:
        await storage.close()


def print_report(report: StoreReport) -> None:
    console = out()
    console.print(f"put-if-absent strategy: {escape(report.strategy)}")
    for check in report.checks:
        console.print(f"{MARKS[check.verdict]}  {escape(check.title)}: {escape(check.summary)}")
    if report.ok:
        console.print("[green]the store does what bucketq assumes of it[/]")
    else:
        names = ", ".join(c.name for c in report.failed)
        console.print(
            f"[bold red]{len(report.failed)} check(s) failed ({escape(names)}): do not run bucketq on "
            "this store as it is[/] (docs/operations.md, 'Checking your store')"
        )
