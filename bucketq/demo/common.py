"""What both demo modes share: the progress bar's columns, the summary table, how counts that must be 0
are shown."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import ProgressColumn
    from rich.table import Table


def progress_columns() -> tuple[ProgressColumn, ...]:
    """Label, bar, ``done/total`` and elapsed time."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    return (TextColumn("{task.description:>20}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


def count(n: int) -> str:
    """``n`` in green when 0, else in bold red (for losses, duplicates, errors)."""
    return f"[bold red]{n:,}[/]" if n else "[green]0[/]"


def two_column_table(title: str, rows: list[tuple[str, str]]) -> Table:
    """The final two-column summary (label, right-aligned value) both modes print."""
    from rich.table import Table

    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    for label, value in rows:
        table.add_row(label, value)
    return table
