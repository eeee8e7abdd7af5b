"""What both demo modes share: the progress bar's columns and how counts that must be 0 are shown."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import ProgressColumn


def progress_columns() -> tuple[ProgressColumn, ...]:
    """Label, bar, ``done/total`` and elapsed time."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    return (TextColumn("{task.description:>20}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


def count(n: int) -> str:
    """``n`` in green when 0, else in bold red (for losses, duplicates, errors)."""
    return f"[bold red]{n:,}[/]" if n else "[green]0[/]"
